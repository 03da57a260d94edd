"""Declaring named properties.

    @kv_property(model="swa-budget", strategy=retracted_queues(), examples=[UPSTREAM_CASE])
    def physical_soundness(case, variant):
        ...raise PropertyViolation("pages allocated: expected <= 18, got 20")

A data property is a predicate over one generated case and a variant. A
stateful property runs the model's transition system through the generic
Hypothesis state machine (`kvsim.stateful`) and checks its invariants.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from hypothesis.strategies import SearchStrategy

from .registry import REGISTRY


@dataclass(frozen=True)
class KvProperty:
    name: str
    model: str
    doc: str
    kind: str  # "data" or "stateful"
    fn: Callable[[Any, str], None] | None = None
    # a strategy, or a function of the model's resolved parameters returning one (`--param backend=mori`)
    strategy: SearchStrategy[Any] | Callable[[Mapping[str, Any]], SearchStrategy[Any]] | None = None
    examples: tuple[Any, ...] = ()
    # stateful: model parameters for the system the state machine drives
    params: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, case: Any, variant: str = "fixed") -> None:
        if self.fn is None:
            raise TypeError(f"{self.name} is a stateful property; run it with kvsim.runner.run_property")
        self.fn(case, variant)


def _doc(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].replace("\n", " ")


def kv_property(*, model: str, strategy: SearchStrategy[Any] | Callable[[Mapping[str, Any]], SearchStrategy[Any]],
                examples: tuple[Any, ...] | list[Any] = (),
                name: str | None = None) -> Callable[[Callable[[Any, str], None]], KvProperty]:
    """Register `fn(case, variant)` as a property of `model` over cases drawn from `strategy`."""

    def wrap(fn: Callable[[Any, str], None]) -> KvProperty:
        if not fn.__doc__:
            raise TypeError(f"property {fn.__name__} needs a docstring: it is the property's documentation")
        prop = KvProperty(name=name or fn.__name__, model=model, doc=_doc(fn), kind="data", fn=fn,
                          strategy=strategy, examples=tuple(examples))
        return REGISTRY.add_property(prop)

    return wrap


def stateful_property(*, model: str, name: str, doc: str, params: Mapping[str, Any] | None = None) -> KvProperty:
    """Register the model's transition-system invariants as one Hypothesis-driven property."""
    prop = KvProperty(name=name, model=model, doc=doc, kind="stateful", params=dict(params or {}))
    return REGISTRY.add_property(prop)
