"""Hypothesis strategies and named properties over the models, and the bug catalog.

Importing this package registers every model, property and bug report with
`kvsim.registry.REGISTRY`. Add a model's module to `_MODULES` to publish it.
"""

import importlib

_MODULES = (
    "pd_staging",
    "pd_staging_e2e",
    "swa_budget",
    "pd_protocol",
    "kv_zeroing",
    "mla_chunks",
)

for _name in _MODULES:
    importlib.import_module(f"{__name__}.{_name}")
