"""Run a model on the timed simulator, record its trace, and replay a trace."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .. import __version__
from ..engine.canon import to_jsonable
from ..engine.errors import ConfigError, TraceError
from ..engine.descriptor import ModelDescriptor
from ..engine.params import config_from, resolve
from ..engine.sim import DEFAULT_MAX_EVENTS, Driver, FaultPlan, Simulator
from ..engine.trace import Diverged, ReplayResult, StreamComparer, Trace, TraceReader, TraceRecorder, compare


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
    stopped_by: str | None = None  # the work budget that ended the run early ("max-events", "max-seconds")

    @property
    def digest(self) -> str:
        return self.recorder.digest()

    @property
    def complete(self) -> bool:
        return self.stopped_by is None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "variant": self.variant, "seed": self.seed, "events": self.events,
                "sim_time": round(self.sim_time, 9), "seconds": round(self.seconds, 4), "digest": self.digest,
                "complete": self.complete, "stopped_by": self.stopped_by, "summary": dict(self.summary)}


def check_faults(spec: ModelDescriptor, plan: FaultPlan) -> None:
    """Fault kinds and crash peers the model has (a ConfigError listing what it has)."""
    unsupported = [k for k in plan.kinds if k not in spec.fault_kinds]
    if unsupported:
        supported = ", ".join(spec.fault_kinds) or "none"
        raise ConfigError("--faults", f"fault kinds model {spec.name} supports ({supported})", ",".join(unsupported))
    for peer, _ in plan.crashes:
        if peer not in spec.peers:
            raise ConfigError("--faults crash", f"a peer model {spec.name} has ({', '.join(spec.peers) or 'none'})",
                              peer)


def simulate_model(spec: ModelDescriptor, variant: Any, seed: int, params: Mapping[str, Any] | list[str] = (),
                   faults: str | None = None, *, max_events: int | None = DEFAULT_MAX_EVENTS,
                   max_seconds: float | None = None, keep_steps: bool = True,
                   on_step: Callable[[dict[str, Any], Simulator], None] | None = None) -> SimulationResult:
    """One seeded run: the variant name and parameter values are resolved here, once.

    `max_events` and `max_seconds` bound the run (it then ends incomplete, `stopped_by` says which);
    `on_step(line, sim)` sees every step as it is recorded; `keep_steps=False` keeps none in memory.
    """
    if spec.simulate is None:
        raise ConfigError("MODEL", "a model with a timed simulation", spec.name)
    if type(seed) is not int:
        raise ConfigError("--seed", "an integer", seed)
    record = spec.variant(variant)
    values = resolve(spec.sim_params, params)
    config = config_from(spec.sim_config, values)
    plan = FaultPlan.parse(faults)
    check_faults(spec, plan)
    header = {"model": spec.name, "variant": record.name, "seed": seed, "params": values, "faults": plan.to_spec(),
              "version": __version__}
    sim = Simulator(seed, max_events=max_events, max_seconds=max_seconds)
    recorder = TraceRecorder(header, keep=keep_steps,
                             on_step=None if on_step is None else (lambda line: on_step(line, sim)))
    start = time.perf_counter()
    summary, driver = spec.simulate(sim, recorder, record, config, plan)
    if sim.stopped_by is not None:
        recorder.end_extra = {"incomplete": sim.stopped_by, "events": sim.events_run}
    return SimulationResult(spec.name, record.name, seed, sim.events_run, sim.now, time.perf_counter() - start,
                            summary, recorder, driver, sim.stopped_by)


def header_params(path: str, spec: ModelDescriptor, params: Mapping[str, Any]) -> dict[str, Any]:
    """A trace header's params, typed as JSON gives them: names, types (no strings for numbers) and ranges."""
    specs = {s.name: s for s in spec.sim_params}
    typed = {}
    for name, value in params.items():
        s = specs.get(name)
        if s is not None and s.kind == "ints" and isinstance(value, list):
            value = tuple(value)
        if s is not None and s.kind != "str" and isinstance(value, str):
            raise TraceError(path, 1, f"header field params.{name}: expected {s.expected()}, got the string "
                                      f"{to_jsonable(value)!r}")
        typed[name] = value
    try:
        resolve(spec.sim_params, typed)
    except ConfigError as exc:
        raise TraceError(path, 1, f"header field params: {exc}") from None
    return typed


def replay_trace(trace: Trace, spec: ModelDescriptor) -> ReplayResult:
    """Re-run a trace read whole (`read_trace`) and compare; `kvsim replay` streams instead (`replay_file`)."""
    header = trace.header
    params = header_params(trace.path, spec, header["params"])
    try:
        result = simulate_model(spec, header["variant"], header["seed"], params, header["faults"] or None,
                                max_events=(trace.end or {}).get("events", DEFAULT_MAX_EVENTS))
    except ConfigError as exc:
        raise TraceError(trace.path, 1, f"header does not describe a run: {exc}") from None
    return compare(trace, result.recorder)


def replay_file(path: str, models: Mapping[str, ModelDescriptor], *, max_events: int | None = DEFAULT_MAX_EVENTS,
                max_seconds: float | None = None) -> ReplayResult:
    """Re-run the run a trace file describes and compare it line by line as the re-run records its steps.

    The header is checked (schema, model, variant, parameter names, types and ranges, fault spec)
    before anything runs; memory holds one line of the file; the first different line ends the re-run.
    """
    with TraceReader(path) as reader:
        header = reader.header
        spec = models.get(header["model"])
        if spec is None:
            raise TraceError(path, 1, f"header field model: unknown model {header['model']!r} "
                                      f"(known: {', '.join(models)})")
        if spec.simulate is None:
            raise TraceError(path, 1, f"header field model: {spec.name} has no timed simulation")
        warnings = []
        version = header.get("version")
        if version != __version__:
            warnings.append(f"{path}: written by kvsim {version or 'of an unknown version'}, replayed by kvsim "
                            f"{__version__} (trace format {header['kvsim_trace']} is the same)")
        params = header_params(path, spec, header["params"])
        sims: list[Simulator] = []
        trace_events: list[int] = []

        def on_end(end: dict[str, Any]) -> None:  # a trace a budget stopped: re-run the events it ran, no more
            if end.get("incomplete") is not None and sims:
                trace_events.append(end["events"])
                sims[0].max_events = end["events"]

        comparer = StreamComparer(reader, on_end)
        if reader.at_end() and (reader.end or {}).get("incomplete") is not None:  # a trace of no steps
            max_events = (reader.end or {})["events"]

        def on_step(line: dict[str, Any], sim: Simulator) -> None:
            if not sims:
                sims.append(sim)
            comparer(line)

        try:
            try:
                # the header is checked before the first event: a bad name or value is reported, nothing runs
                spec.variant(header["variant"])
                FaultPlan.parse(header["faults"] or None)
                result = simulate_model(spec, header["variant"], header["seed"], params, header["faults"] or None,
                                        max_events=max_events, max_seconds=max_seconds, keep_steps=False,
                                        on_step=on_step)
            except ConfigError as exc:
                raise TraceError(path, 1, f"header does not describe a run: {exc}") from None
        except Diverged as d:
            return ReplayResult(path, comparer.matched, "", False, d.line, d.expected, d.got, warnings=tuple(warnings))
        steps = comparer.matched
        if reader.end is None:
            if result.stopped_by is not None:  # our budget, not the trace's, ended the re-run
                return ReplayResult(path, steps, result.digest, True, complete=False, stopped_by=result.stopped_by,
                                    warnings=tuple(warnings))
            step = reader.next_step()
            if step is not None:
                return ReplayResult(path, steps, result.digest, False, reader.line,
                                    f"the re-run ends after {steps} steps", step[1], warnings=tuple(warnings))
        end = reader.end or {}
        if end.get("incomplete") is not None and end.get("events") != result.events:
            return ReplayResult(path, steps, result.digest, False, reader.end_line,
                                f"the re-run ran {result.events} events", f"{end.get('events')} events in the trace",
                                warnings=tuple(warnings))
        if result.digest != end.get("digest"):
            return ReplayResult(path, steps, result.digest, False, reader.end_line, result.digest, end.get("digest"),
                                warnings=tuple(warnings))
        return ReplayResult(path, steps, result.digest, True, warnings=tuple(warnings))
