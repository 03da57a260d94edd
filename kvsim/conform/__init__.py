"""kvsim conform: the model properties and differentials run against real engine code (vLLM, SGLang).

Application layer: it may import the engine, models and properties; they never import it.
Upstream code is loaded at run time from a release in the user cache or a path the user gives
(`source`), definition by definition (`loader`); `targets` lists what is compared per engine.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "TARGETS":  # lazy: importing the package does not import the adapters or Hypothesis
        from .targets import targets
        return {engine: targets(engine) for engine in ("vllm", "sglang")}
    raise AttributeError(name)
