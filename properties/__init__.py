"""Hypothesis strategies and named properties over the models, and the bug catalog.

Importing this package registers every model, property and bug report with
`kvsim.registry.REGISTRY`. Add a model's module to `_MODULES` to publish it.
"""

import importlib

_MODULES = (  # in the order the models were added; the catalog lists them so
    "swa_budget.resume",
    "kv_zeroing.zeroer",
    "mla_chunks.bugs",
    "pd_staging.plan",
    "pd_staging.e2e",
    "pd_protocol.protocol",
)

for _name in _MODULES:
    importlib.import_module(f"{__name__}.{_name}")
