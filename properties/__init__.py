"""Hypothesis strategies and named properties over the models, and the bug catalog.

Importing this package registers every model, property and bug report with
`kvsim.registry.REGISTRY`. Add a model's module to `_MODULES` to publish it.
"""

import importlib

_MODULES = (  # in the order the models were added; the catalog lists them so
    "swa_budget",
    "kv_zeroing",
    "mla_chunks",
    "pd_staging",
    "pd_staging_e2e",
    "pd_protocol",
)

for _name in _MODULES:
    importlib.import_module(f"{__name__}.{_name}")
