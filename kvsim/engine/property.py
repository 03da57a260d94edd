"""Declaring named properties.

    @kv_property(model="swa-budget", strategy="retracted_queues", examples=[UPSTREAM_CASE])
    def resumed_requests_fit_physical_pages(case, variant):
        ...raise PropertyViolation("pages allocated: expected <= 18, got 20")

A data property is a predicate over one generated case and a variant record.
Its strategy is named, not built: the string names an attribute of the
`strategies` module beside the property (`kvsim.properties.<model>.strategies`),
which is imported only when the property runs, so listing or exploring a
model never imports Hypothesis. The attribute is a strategy, or a function of
the model's resolved parameters that returns one (`--param backend=mori`).

A kernel property (`kernel_property`) is a data property with a `backend`:
`fn(case, variant, backend)` compares the kernel on that backend with the
model's reference. `kvsim check --backend NAME` selects the backend; `kvsim
oracle` runs every kernel property on every backend this machine has. The
engine only passes the name on; what a backend is, and whether it is
available, is `kvsim.gpu_oracle`'s business.

A stateful property runs the model's transition system through the generic
Hypothesis state machine (`kvsim.engine.stateful`) and checks its invariants.
Declaring a property does not register it: the properties package's
`register(registry)` does (`Registry.add_from`).
"""

from __future__ import annotations

import builtins
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import ConfigError
from .system import Sometimes


@dataclass(frozen=True)
class KvProperty:
    name: str
    model: str
    doc: str
    kind: str  # "data" or "stateful"
    home: str  # the module that declared it
    fn: Callable[[Any, Any], None] | None = None
    strategy: str | Any = None  # a name in the sibling `strategies` module (or a strategy / params -> strategy)
    examples: tuple[Any, ...] = ()
    # stateful: model parameters for the system the state machine drives
    params: Mapping[str, Any] = field(default_factory=dict)
    # a kernel property: the backends it runs on (fn takes the backend name as a third argument)
    backends: tuple[str, ...] = ()
    asan_in_child: bool = True  # False: the property starts its own ASan children
    # stateful: a state machine of its own, machine(record) -> RuleBasedStateMachine class (a conform lockstep)
    machine: Callable[[dict[str, Any]], Any] | None = None
    # a data property: what some case its strategy draws must be (`Sometimes`, `check(case)`), each reported
    # reached or not (`kvsim check`): a strategy that never draws the corner a property is about makes it vacuous
    sometimes: tuple[Sometimes[Any], ...] = ()

    @builtins.property
    def is_kernel(self) -> bool:
        return bool(self.backends)

    def __call__(self, case: Any, variant: Any, backend: str | None = None) -> None:
        if self.fn is None:
            raise TypeError(f"{self.name} is a stateful property; run it with kvsim.engine.runner.run_property")
        if self.backends:
            if backend not in self.backends:
                raise ConfigError("backend", f"one of {', '.join(self.backends)} for {self.name}", backend)
            self.fn(case, variant, backend)  # type: ignore[call-arg]
        else:
            self.fn(case, variant)

    def build_strategy(self, params: Mapping[str, Any]) -> Any:
        """The Hypothesis strategy of a data property, for the model's resolved parameters."""
        strategy = self.strategy
        if isinstance(strategy, str):
            package = self.home.rpartition(".")[0]
            module = importlib.import_module(f"{package}.strategies")
            try:
                strategy = getattr(module, strategy)
            except AttributeError:
                raise TypeError(f"property {self.name}: {module.__name__} has no strategy {self.strategy!r}") from None
        from hypothesis.strategies import SearchStrategy

        return strategy if isinstance(strategy, SearchStrategy) else strategy(params)


def _doc(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].replace("\n", " ")


def kv_property(*, model: str, strategy: str | Any, examples: tuple[Any, ...] | list[Any] = (),
                name: str | None = None, sometimes: tuple[Sometimes[Any], ...] = ()
                ) -> Callable[[Callable[[Any, Any], None]], KvProperty]:
    """Declare `fn(case, variant)` as a property of `model` over cases drawn from `strategy`, some of which must
    satisfy each of `sometimes`."""

    def wrap(fn: Callable[[Any, Any], None]) -> KvProperty:
        if not fn.__doc__:
            raise TypeError(f"property {fn.__name__} needs a docstring: it is the property's documentation")
        return KvProperty(name=name or fn.__name__, model=model, doc=_doc(fn), kind="data", home=fn.__module__,
                          fn=fn, strategy=strategy, examples=tuple(examples), sometimes=tuple(sometimes))

    return wrap


def kernel_property(*, model: str, strategy: str | Any, backends: tuple[str, ...],
                    examples: tuple[Any, ...] | list[Any] = (), name: str | None = None,
                    asan_in_child: bool = True, sometimes: tuple[Sometimes[Any], ...] = ()
                    ) -> Callable[[Callable[[Any, Any, str], None]], KvProperty]:
    """Declare `fn(case, variant, backend)`: the kernel on `backend` agrees with the model on `case`."""

    def wrap(fn: Callable[[Any, Any, str], None]) -> KvProperty:
        if not fn.__doc__:
            raise TypeError(f"property {fn.__name__} needs a docstring: it is the property's documentation")
        return KvProperty(name=name or fn.__name__, model=model, doc=_doc(fn), kind="data", home=fn.__module__,
                          fn=fn, strategy=strategy, examples=tuple(examples), backends=tuple(backends),
                          asan_in_child=asan_in_child, sometimes=tuple(sometimes))

    return wrap


def stateful_property(*, model: str, name: str, doc: str, params: Mapping[str, Any] | None = None,
                      home: str) -> KvProperty:
    """Declare the model's transition-system invariants as one Hypothesis-driven property (`home`: `__name__`)."""
    return KvProperty(name=name, model=model, doc=doc, kind="stateful", home=home, params=dict(params or {}))
