"""One descriptor per model: what every driver needs to know about it, declared once.

`models/<model>/__init__.py` builds its `DESCRIPTOR`:

    DESCRIPTOR = ModelDescriptor(
        name="swa-budget", summary=..., source="sglang af7c62e (PR #33794)",
        variants=VARIANTS,                  # a VariantTable of flag records
        config=SchedulerConfig,             # explore parameters: the fields declared with `param()`
        system=SwaScheduler,                # system(variant, config) -> TransitionSystem
        sim_config=SimConfig, simulate=sim.simulate, fault_kinds=(...), peers=(...))

Parameters are generated from the config dataclasses' field metadata, so a
bound or default is written in exactly one place; the engine resolves names
and values once (`RunSpec`), and a model only ever sees a variant record and
a config instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .conformance.declare import ConformTarget, with_model
from .errors import ConfigError
from .params import ParamSpec, config_from, params_of, resolve
from .variants import Variant, VariantTable


@dataclass(frozen=True)
class ModelDescriptor:
    name: str
    summary: str
    source: str
    variants: VariantTable[Any]
    config: type | None = None  # the transition system's config dataclass (explore, stateful properties)
    system: Callable[[Any, Any], Any] | None = None  # system(variant, config)
    sim_config: type | None = None  # the timed simulation's config dataclass
    simulate: Callable[..., Mapping[str, Any]] | None = None  # simulate(sim, recorder, variant, config, faults)
    fault_kinds: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()  # who `crash=PEER@T` may name
    # the failure mechanisms the simulation names in its summary's "named" rooms (a report's `mechanism`)
    mechanisms: tuple[str, ...] = ()
    data_params: tuple[ParamSpec, ...] = ()  # parameters only data-property strategies read (none of the system's)
    # the engines' code this model is checked against (`kvsim conform`): declarations, adapters loaded lazily
    conform: tuple[ConformTarget, ...] = ()
    params: tuple[ParamSpec, ...] = field(init=False)
    sim_params: tuple[ParamSpec, ...] = field(init=False)

    def __post_init__(self) -> None:
        if (self.system is None) != (self.config is None):
            raise ValueError(f"model {self.name}: a transition system comes with its config dataclass")
        if (self.simulate is None) != (self.sim_config is None):
            raise ValueError(f"model {self.name}: a simulation comes with its config dataclass")
        system_params = params_of(self.config) if self.config is not None else ()
        object.__setattr__(self, "params", system_params + self.data_params)
        object.__setattr__(self, "sim_params", params_of(self.sim_config) if self.sim_config is not None else ())
        object.__setattr__(self, "conform", with_model(tuple(self.conform), self.name))
        for target in self.conform:
            self.variant(target.variant_name(None))  # every release's variant is one of the model's
            for _, name in target.releases:
                self.variant(name)

    def variant(self, name: str | Variant) -> Any:
        return self.variants.resolve(name)

    def build_system(self, variant: str | Variant, values: Mapping[str, Any] = ()) -> Any:
        """The transition system for a variant and (partial, typed) parameter values."""
        if self.system is None or self.config is None:
            raise ConfigError("MODEL", "a model with a transition system", self.name)
        resolved = resolve(self.params, dict(values))
        return self.system(self.variant(variant), config_from(self.config, resolved))

    def build_sim_config(self, values: Mapping[str, Any] | list[str] = ()) -> Any:
        """The simulation's config instance for (partial) parameter values."""
        if self.sim_config is None:
            raise ConfigError("MODEL", "a model with a timed simulation", self.name)
        return config_from(self.sim_config, resolve(self.sim_params, values))



@dataclass(frozen=True)
class RunSpec:
    """Model, variant and parameters resolved once (the command line builds one and passes it down).

    `params` holds every value (defaults included); `given` only what the user set, which is what a
    replay line or a saved counterexample repeats.
    """

    model: ModelDescriptor
    variant: Any
    params: Mapping[str, Any]
    given: Mapping[str, Any]

    @classmethod
    def resolve(cls, model: ModelDescriptor, variant: str | Variant, given: Mapping[str, Any] | list[str] = (),
                specs: tuple[ParamSpec, ...] | None = None) -> "RunSpec":
        specs = model.params if specs is None else specs
        values = resolve(specs, given)
        if isinstance(given, Mapping):
            names = set(given)
        else:
            names = {text.partition("=")[0].strip() for text in given}
        return cls(model, model.variant(variant), values, {k: v for k, v in values.items() if k in names})

    def system(self) -> Any:
        """The transition system of this run (the config takes its own fields; data parameters stay out)."""
        return self.model.build_system(self.variant, self.params)
