"""Run a model on the timed simulator, record its trace, and replay a trace."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from .. import __version__
from ..engine.errors import ConfigError, TraceError
from ..engine.descriptor import ModelDescriptor
from ..engine.params import config_from, resolve
from ..engine.sim import Driver, FaultPlan, Simulator
from ..engine.trace import ReplayResult, Trace, TraceRecorder, compare


@dataclass
class SimulationResult:
    model: str
    variant: str
    seed: int
    events: int
    sim_time: float
    seconds: float
    summary: Mapping[str, Any]
    recorder: TraceRecorder
    driver: Driver  # the transition system's state as the run left it, and the actions it took

    @property
    def digest(self) -> str:
        return self.recorder.digest()

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "variant": self.variant, "seed": self.seed, "events": self.events,
                "sim_time": round(self.sim_time, 9), "seconds": round(self.seconds, 4), "digest": self.digest,
                "summary": dict(self.summary)}


def simulate_model(spec: ModelDescriptor, variant: Any, seed: int, params: Mapping[str, Any] | list[str] = (),
                   faults: str | None = None) -> SimulationResult:
    """One seeded run: the variant name and parameter values are resolved here, once."""
    if spec.simulate is None:
        raise ConfigError("MODEL", "a model with a timed simulation", spec.name)
    record = spec.variant(variant)
    values = resolve(spec.sim_params, params)
    config = config_from(spec.sim_config, values)
    plan = FaultPlan.parse(faults)
    unsupported = [k for k in plan.kinds if k not in spec.fault_kinds]
    if unsupported:
        supported = ", ".join(spec.fault_kinds) or "none"
        raise ConfigError("--faults", f"fault kinds model {spec.name} supports ({supported})", ",".join(unsupported))
    header = {"model": spec.name, "variant": record.name, "seed": seed, "params": values, "faults": plan.to_spec(),
              "version": __version__}
    recorder = TraceRecorder(header)
    sim = Simulator(seed)
    start = time.perf_counter()
    summary, driver = spec.simulate(sim, recorder, record, config, plan)
    return SimulationResult(spec.name, record.name, seed, sim.events_run, sim.now, time.perf_counter() - start,
                            summary, recorder, driver)


def replay_trace(trace: Trace, spec: ModelDescriptor) -> ReplayResult:
    header = trace.header
    try:
        result = simulate_model(spec, header["variant"], header["seed"], header["params"], header["faults"] or None)
    except ConfigError as exc:
        raise TraceError(trace.path, 1, f"header does not describe a run: {exc}") from None
    return compare(trace, result.recorder)
