"""What the catalog holds: model descriptors, properties, bug reports.

The registry knows nothing about any particular model. `kvsim.app.catalog`
fills it: each model package's `DESCRIPTOR`, then each properties package's
`register(registry)`. A variant name is checked once, here, at the boundary.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterable, Mapping

from .descriptor import ModelDescriptor
from .errors import ConfigError
from .property import KvProperty

VALID_STATUSES = ("reproducible", "open upstream", "not reproducible")
VERDICT_STATES = ("present", "fixed", "not reachable")  # a finding's state in one upstream release
HARMS = ("silent KV corruption", "a hang until a timeout", "a hang", "a dead thread", "a wrong status")


@dataclass(frozen=True)
class UpstreamSite:
    """Where a bug lives upstream: a path in the engine's repository and the functions involved there."""

    path: str
    functions: tuple[str, ...]
    role: str = ""  # what this place does in the bug, in a few words


@dataclass(frozen=True)
class Verdict:
    """A bug report's state in one upstream release: present, fixed (in `fixed_in`) or not reachable (`reason`)."""

    release: str
    state: str
    reason: str = ""
    fixed_in: str = ""

    def to_json(self) -> dict[str, str]:
        return {"release": self.release, "state": self.state, "reason": self.reason, "fixed_in": self.fixed_in}

    def __post_init__(self) -> None:
        if self.state not in VERDICT_STATES:
            raise ConfigError(f"verdict for {self.release}.state", f"one of {VERDICT_STATES}", self.state)


@dataclass(frozen=True)
class BugReport:
    """A seed bug (or a finding) as data: the check must fail on `variant`.

    A report names exactly one of `property` (a registered property, run by Hypothesis) or `invariant`
    (an invariant of the model's transition system, or its liveness goal, found by exhaustive search
    with `params`).
    """

    id: str
    model: str
    variant: str
    source: str
    summary: str
    property: str | None = None
    invariant: str | None = None
    status: str = "reproducible"
    max_examples: int = 2000
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    # what an upstream bug report needs (kvsim repro ID --report); all optional
    affected: str = ""  # the releases and configurations affected, in words
    upstream_files: tuple[UpstreamSite, ...] = ()
    harm: str = ""  # one of HARMS
    consequence: str = ""  # what a user sees, in one or two sentences
    fix: str = ""  # the smallest fix, in words
    fix_variant: str | None = None  # a variant of the model that has that fix (None: no fix is modelled)
    verdicts: tuple[Verdict, ...] = ()
    # the failure mechanism the model's timed simulation names when this bug shows in a run (None: it names none)
    mechanism: str | None = None

    def __post_init__(self) -> None:
        if self.status not in VALID_STATUSES:
            raise ConfigError(f"bug {self.id}.status", f"one of {VALID_STATUSES}", self.status)
        if self.harm and self.harm not in HARMS:
            raise ConfigError(f"bug {self.id}.harm", f"one of {HARMS}", self.harm)
        if (self.property is None) == (self.invariant is None):
            raise ConfigError(f"bug {self.id}", "exactly one of property and invariant", (self.property, self.invariant))

    @builtins.property
    def driver(self) -> str:
        return "hypothesis" if self.property is not None else "explore"

    @builtins.property
    def check(self) -> str:
        """The name of what must fail: the property or the invariant."""
        return self.property if self.property is not None else self.invariant  # type: ignore[return-value]


class Registry:
    def __init__(self) -> None:
        self.models: dict[str, ModelDescriptor] = {}
        self.properties: dict[tuple[str, str], Any] = {}
        self.bugs: dict[str, BugReport] = {}

    def add_model(self, descriptor: ModelDescriptor) -> ModelDescriptor:
        if descriptor.name in self.models and self.models[descriptor.name] is not descriptor:
            raise ConfigError("model name", "a name not registered yet", descriptor.name)
        self.models[descriptor.name] = descriptor
        return descriptor

    def add_property(self, prop: Any) -> Any:
        key = (prop.model, prop.name)
        if prop.model not in self.models:
            raise ConfigError(f"property {prop.name}.model", "a registered model", prop.model)
        if key in self.properties and self.properties[key] is not prop:
            raise ConfigError("property name", f"a name not yet used in model {prop.model}", prop.name)
        self.properties[key] = prop
        return prop

    def add_bug(self, bug: BugReport) -> BugReport:
        if bug.id in self.bugs:
            raise ConfigError("bug id", "a unique id", bug.id)
        model = self.model(bug.model)
        model.variant(bug.variant)
        if bug.property is not None and (bug.model, bug.property) not in self.properties:
            raise ConfigError(f"bug {bug.id}.property", f"a property of model {bug.model}", bug.property)
        if bug.invariant is not None:
            system = model.build_system("fixed", dict(bug.params))
            names = [inv.name for inv in system.invariants] + [getattr(system, "liveness", "liveness")]
            if bug.invariant not in names:
                raise ConfigError(f"bug {bug.id}.invariant", f"one of {', '.join(names)}", bug.invariant)
        self.bugs[bug.id] = bug
        return bug

    def add_from(self, *modules: ModuleType) -> None:
        """Register every property and bug report a module defines, in definition order."""
        for module in modules:
            items: Iterable[Any] = vars(module).values()
            for item in items:
                if isinstance(item, KvProperty) and item.home == module.__name__:
                    self.add_property(item)
            for item in vars(module).values():
                if isinstance(item, BugReport):
                    self.add_bug(item)
                elif isinstance(item, tuple) and item and all(isinstance(b, BugReport) for b in item):
                    for bug in item:
                        self.add_bug(bug)

    def model(self, name: str) -> ModelDescriptor:
        if name not in self.models:
            raise ConfigError("MODEL", f"one of {', '.join(self.models)}", name)
        return self.models[name]

    def properties_of(self, model: str) -> list[Any]:
        return [p for (m, _), p in self.properties.items() if m == model]

    def property(self, model: str, name: str) -> Any:
        if (model, name) not in self.properties:
            names = ", ".join(p.name for p in self.properties_of(model))
            raise ConfigError("property", f"one of {names}", name)
        return self.properties[(model, name)]

    def bug(self, bug_id: str) -> BugReport:
        if bug_id not in self.bugs:
            raise ConfigError("BUG_ID", f"one of {', '.join(self.bugs)}", bug_id)
        return self.bugs[bug_id]


REGISTRY = Registry()
