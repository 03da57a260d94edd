"""Timed simulation of the paged-SWA decode scheduler (`kvsim simulate swa-budget`).

A random workload (Poisson arrivals, uniform prompt and output lengths, all
drawn from the simulator's seeded generator) is driven through the same
`SwaScheduler` transition system that `explore` searches, with a fixed
policy per scheduler tick, in the order the upstream decode loop uses:
resume retracted requests, admit new ones, then decode; under memory
pressure retract the most recently admitted request. A failed `_pre_alloc`
stops the run, as it stops the decode scheduler.

This change has no messaging, so the model takes no message faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.engine.canon import digest
from kvsim.engine.params import param
from kvsim.engine.sim import Driver, FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from .variants import SwaVariant
from .scheduler import ARRIVE, DECODE, RESUME, RETRACT, Arrive, Decode, Resume, Retract, SchedulerConfig, SwaScheduler


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate swa-budget --param`: the workload and the pools."""

    requests: int = param(200, "requests in the workload", minimum=1, maximum=100_000)
    page_size: int = param(16, "tokens per page (both pools)", minimum=1, maximum=1024)
    sliding_window: int = param(64, "SWA window in tokens", minimum=1, maximum=1 << 16)
    full_pages: int = param(64, "pages in the full-attention pool", minimum=1, maximum=1 << 16)
    swa_pages: int = param(40, "pages in the SWA pool", minimum=1, maximum=1 << 16)
    prompt_max: int = param(200, "longest prompt (tokens; prompts are uniform in 1..prompt_max)", minimum=1,
                            maximum=1 << 16)
    output_max: int = param(100, "longest output (tokens; uniform in 1..output_max)", minimum=1, maximum=1 << 16)
    arrival_rate: float = param(50.0, "mean arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    step_time: float = param(0.02, "seconds per decode step", minimum=1e-3, maximum=60.0)
    reserved_decode_tokens: int = param(0, "num_reserved_decode_tokens per running request", minimum=0,
                                        maximum=1 << 16)


def simulate(sim: Simulator, recorder: TraceRecorder, variant: SwaVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    rng = sim.rng
    n = params.requests
    prompts = tuple(rng.randint(1, params.prompt_max) for _ in range(n))
    outputs = tuple(rng.randint(1, params.output_max) for _ in range(n))
    config = SchedulerConfig(params.page_size, params.sliding_window, params.full_pages,
                             params.swa_pages, prompts, outputs, params.reserved_decode_tokens)
    run = _Run(sim, recorder, SwaScheduler(variant, config))
    sim.poisson_arrivals(n, params.arrival_rate, run.arrive)
    sim.schedule(0.0, run.tick, params.step_time)
    sim.run()
    return run.summary(), run.driver


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: SwaScheduler) -> None:
        self.sim, self.recorder, self.system = sim, recorder, system
        self.driver = Driver(system)
        self.arrived = 0
        self.counts = {ARRIVE: 0, DECODE: 0, RETRACT: 0, RESUME: 0}
        self.resumed_requests = 0
        self.peak_retracted = 0
        self.finish_time: dict[int, float] = {}
        self.crash: tuple[float, str] | None = None

    @property
    def state(self) -> Any:
        return self.driver.state

    def arrive(self, rid: int) -> None:
        self.arrived = rid + 1
        self.recorder.record(self.sim.now, "arrival", {"rid": rid})

    def apply(self, action: tuple) -> int:
        """Take `action`; returns how many requests it resumed (0 for other actions)."""
        resumed = 0
        for effect in self.driver.apply(action):
            if effect.tag == "finished":
                self.finish_time[effect.rid] = self.sim.now
            elif effect.tag == "resumed":
                resumed = effect.count
        state = self.state
        self.counts[action[0]] += 1
        self.resumed_requests += resumed
        self.peak_retracted = max(self.peak_retracted, len(state.retracted))
        self.recorder.record(self.sim.now, action[0], {"action": list(action), "state": digest(state, 16),
                                                      "full_free": state.full_free,
                                                      "swa_free": state.swa_free})
        if state.flags:  # a flagged state has no successor: its one flag is the crash
            (invariant, message), = state.flags
            self.crash = (self.sim.now, message)
            self.recorder.record(self.sim.now, "crash", {"invariant": invariant, "message": message})
            self.sim.stop()
        return resumed

    def tick(self, step_time: float) -> None:
        system = self.system
        if self.state.retracted:
            if self.apply(Resume()) == 0 and not self.crash:
                self.counts[RESUME] -= 1  # nothing fitted: not a resume worth counting
            if self.crash:
                return
        while self.state.next_arrival < self.arrived and Arrive() in system.enabled(self.state):
            self.apply(Arrive())
        while self.state.running and Decode() not in system.enabled(self.state):
            self.apply(Retract(self.state.running[-1].rid))
        if self.state.running:
            self.apply(Decode())
        if system.done(self.state):
            return
        self.sim.schedule(step_time, self.tick, step_time)
    def summary(self) -> dict[str, Any]:
        state, cfg = self.state, self.system.config
        leaked_full = cfg.full_pages - state.full_free - sum(r.full_pages for r in state.running)
        leaked_swa = cfg.swa_pages - state.swa_free - sum(r.swa_pages for r in state.running)
        latencies = sorted(self.finish_time.values())
        violations = [f"{self.state.flags[0][0]}: {self.crash[1]}"] if self.crash else []
        if leaked_full or leaked_swa:
            violations.append(f"leaked pages: expected 0, got full {leaked_full}, SWA {leaked_swa}")
        return {
            "violations": violations,
            "requests": self.system.n,
            "finished": len(state.finished),
            "retractions": self.counts[RETRACT],
            "resumes": self.counts[RESUME],
            "resumed_requests": self.resumed_requests,
            "decode_steps": self.counts[DECODE],
            "peak_retracted_queue": self.peak_retracted,
            "crashed": self.crash is not None,
            "crash_time": self.crash[0] if self.crash else None,
            "crash": self.crash[1] if self.crash else None,
            "leaked_pages": {"full": leaked_full, "swa": leaked_swa},
            "last_finish_time": latencies[-1] if latencies else None,
        }
