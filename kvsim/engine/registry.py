"""What the catalog holds: models, properties, bug reports.

Registration happens when `properties` is imported (see `kvsim.catalog`);
this module knows nothing about any particular model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import ConfigError
from .params import ParamSpec

VALID_STATUSES = ("reproducible", "open upstream", "not reproducible")


@dataclass(frozen=True)
class ModelSpec:
    """One engine behaviour: its variants and the entry points the drivers use.

    `system(variant, params)` builds the transition system `explore` and the
    Hypothesis adapter run; `simulate(sim, variant, params, faults)` drives the
    timed simulator. Either may be None for a pure data-plane model.
    """

    name: str
    summary: str
    source: str
    variants: tuple[str, ...]
    params: tuple[ParamSpec, ...] = ()
    system: Callable[[str, Mapping[str, Any]], Any] | None = None
    simulate: Callable[..., Mapping[str, Any]] | None = None
    sim_params: tuple[ParamSpec, ...] = ()
    fault_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.variants or self.variants[0] != "fixed":
            raise ConfigError(f"model {self.name}.variants", "a tuple starting with 'fixed'", self.variants)

    def check_variant(self, variant: str) -> str:
        if variant not in self.variants:
            raise ConfigError("--variant", f"one of {', '.join(self.variants)} for model {self.name}", variant)
        return variant


@dataclass(frozen=True)
class BugReport:
    """A seed bug (or a finding) as data: the property must fail on `variant`."""

    id: str
    model: str
    variant: str
    property: str
    source: str
    summary: str
    status: str = "reproducible"
    max_examples: int = 2000
    # "hypothesis": run the property through the runner; "explore": exhaustive search of the
    # model's transition system (with `params`), where `property` names an invariant or the liveness goal
    driver: str = "hypothesis"
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in VALID_STATUSES:
            raise ConfigError(f"bug {self.id}.status", f"one of {VALID_STATUSES}", self.status)
        if self.driver not in ("hypothesis", "explore"):
            raise ConfigError(f"bug {self.id}.driver", "hypothesis or explore", self.driver)


class Registry:
    def __init__(self) -> None:
        self.models: dict[str, ModelSpec] = {}
        self.properties: dict[tuple[str, str], Any] = {}
        self.bugs: dict[str, BugReport] = {}

    def add_model(self, spec: ModelSpec) -> ModelSpec:
        if spec.name in self.models and self.models[spec.name] is not spec:
            raise ConfigError("model name", "a name not registered yet", spec.name)
        self.models[spec.name] = spec
        return spec

    def add_property(self, prop: Any) -> Any:
        key = (prop.model, prop.name)
        if key in self.properties and self.properties[key] is not prop:
            raise ConfigError("property name", f"a name not yet used in model {prop.model}", prop.name)
        self.properties[key] = prop
        return prop

    def add_bug(self, bug: BugReport) -> BugReport:
        if bug.id in self.bugs:
            raise ConfigError("bug id", "a unique id", bug.id)
        if bug.model not in self.models:
            raise ConfigError(f"bug {bug.id}.model", "a registered model", bug.model)
        self.models[bug.model].check_variant(bug.variant)
        if bug.driver == "hypothesis" and (bug.model, bug.property) not in self.properties:
            raise ConfigError(f"bug {bug.id}.property", f"a property of model {bug.model}", bug.property)
        self.bugs[bug.id] = bug
        return bug

    def model(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise ConfigError("MODEL", f"one of {', '.join(sorted(self.models))}", name)
        return self.models[name]

    def properties_of(self, model: str) -> list[Any]:
        return [p for (m, _), p in self.properties.items() if m == model]

    def property(self, model: str, name: str) -> Any:
        if (model, name) not in self.properties:
            names = ", ".join(p.name for p in self.properties_of(model))
            raise ConfigError("--property", f"one of {names}", name)
        return self.properties[(model, name)]

    def bug(self, bug_id: str) -> BugReport:
        if bug_id not in self.bugs:
            raise ConfigError("BUG_ID", f"one of {', '.join(self.bugs)}", bug_id)
        return self.bugs[bug_id]


REGISTRY = Registry()
