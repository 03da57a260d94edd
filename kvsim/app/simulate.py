"""Run a model on the timed simulator, record its trace, and replay a trace."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from .. import __version__
from ..engine.errors import ConfigError, TraceError
from ..engine.params import resolve
from ..engine.registry import ModelSpec
from ..engine.sim import FaultPlan, Simulator
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

    @property
    def digest(self) -> str:
        return self.recorder.digest()

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "variant": self.variant, "seed": self.seed, "events": self.events,
                "sim_time": round(self.sim_time, 9), "seconds": round(self.seconds, 4), "digest": self.digest,
                "summary": dict(self.summary)}


def simulate_model(spec: ModelSpec, variant: str, seed: int, params: Mapping[str, Any] | list[str] = (),
                   faults: str | None = None) -> SimulationResult:
    if spec.simulate is None:
        raise ConfigError("MODEL", "a model with a timed simulation", spec.name)
    spec.check_variant(variant)
    values = resolve(spec.sim_params, params)
    plan = FaultPlan.parse(faults)
    unsupported = [k for k in plan.kinds if k not in spec.fault_kinds]
    if unsupported:
        supported = ", ".join(spec.fault_kinds) or "none"
        raise ConfigError("--faults", f"fault kinds model {spec.name} supports ({supported})", ",".join(unsupported))
    header = {"model": spec.name, "variant": variant, "seed": seed, "params": values, "faults": plan.to_spec(),
              "version": __version__}
    recorder = TraceRecorder(header)
    sim = Simulator(seed)
    start = time.perf_counter()
    summary = spec.simulate(sim, recorder, variant, values, plan)
    return SimulationResult(spec.name, variant, seed, sim.events_run, sim.now, time.perf_counter() - start,
                            summary, recorder)


def replay_trace(trace: Trace, spec: ModelSpec) -> ReplayResult:
    header = trace.header
    try:
        result = simulate_model(spec, header["variant"], header["seed"], header["params"], header["faults"] or None)
    except ConfigError as exc:
        raise TraceError(trace.path, 1, f"header does not describe a run: {exc}") from None
    return compare(trace, result.recorder)
