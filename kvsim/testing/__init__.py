"""kvsim inside another project's pytest: the plugin (`plugin`), the in-process conform API (`inprocess`)
and the catalog verdicts as test items (`verdicts`).

Application layer, beside `kvsim.app` and `kvsim.conform`: it may import everything, lazily. Importing this
package (or `kvsim.testing.plugin`, which pytest loads in every run once kvsim is installed) imports nothing
of kvsim's and no Hypothesis; the catalog and the adapters load when a fixture or `--kvsim-catalog` asks.

    from kvsim.testing import assert_conforms
    assert_conforms("vllm:plan_mla_context_chunks", my_engine.mla)   # AssertionError with the report
"""

from __future__ import annotations

from typing import Any

API = {"conform": "inprocess", "assert_conforms": "inprocess", "ConformanceFailure": "inprocess",
       "find_target": "inprocess"}


def __getattr__(name: str) -> Any:
    if name in API:  # lazy: importing the package does not import the adapters or Hypothesis
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{API[name]}"), name)
    raise AttributeError(name)
