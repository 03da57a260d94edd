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

from typing import Any, Mapping

from kvsim.engine.canon import digest
from kvsim.engine.params import ParamSpec
from kvsim.engine.sim import FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from .scheduler import ARRIVE, DECODE, RESUME, RETRACT, SchedState, SchedulerConfig, SwaScheduler

SIM_PARAMS = (
    ParamSpec("requests", "int", 200, "requests in the workload", minimum=1, maximum=100_000),
    ParamSpec("page_size", "int", 16, "tokens per page (both pools)", minimum=1),
    ParamSpec("sliding_window", "int", 64, "SWA window in tokens", minimum=1),
    ParamSpec("full_pages", "int", 64, "pages in the full-attention pool", minimum=1),
    ParamSpec("swa_pages", "int", 40, "pages in the SWA pool", minimum=1),
    ParamSpec("prompt_max", "int", 200, "longest prompt (tokens; prompts are uniform in 1..prompt_max)", minimum=1),
    ParamSpec("output_max", "int", 100, "longest output (tokens; uniform in 1..output_max)", minimum=1),
    ParamSpec("arrival_rate", "float", 50.0, "mean arrivals per second (Poisson)", minimum=1e-6),
    ParamSpec("step_time", "float", 0.02, "seconds per decode step", minimum=1e-6),
    ParamSpec("reserved_decode_tokens", "int", 0, "num_reserved_decode_tokens per running request", minimum=0),
)


def simulate(sim: Simulator, recorder: TraceRecorder, variant: str, params: Mapping[str, Any],
             faults: FaultPlan) -> dict[str, Any]:
    rng = sim.rng
    n = params["requests"]
    prompts = tuple(rng.randint(1, params["prompt_max"]) for _ in range(n))
    outputs = tuple(rng.randint(1, params["output_max"]) for _ in range(n))
    config = SchedulerConfig(params["page_size"], params["sliding_window"], params["full_pages"],
                             params["swa_pages"], prompts, outputs, params["reserved_decode_tokens"])
    system = SwaScheduler(config, variant)
    run = _Run(sim, recorder, system)
    sim.poisson_arrivals(n, params["arrival_rate"], run.arrive)
    sim.schedule(0.0, run.tick, params["step_time"])
    sim.run()
    return run.summary()


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: SwaScheduler) -> None:
        self.sim, self.recorder, self.system = sim, recorder, system
        self.state: SchedState = system.initial_states()[0]
        self.arrived = 0
        self.counts = {ARRIVE: 0, DECODE: 0, RETRACT: 0, RESUME: 0}
        self.resumed_requests = 0
        self.peak_retracted = 0
        self.finish_time: dict[int, float] = {}
        self.crash: tuple[float, str] | None = None

    def arrive(self, rid: int) -> None:
        self.arrived = rid + 1
        self.recorder.record(self.sim.now, "arrival", {"rid": rid})

    def apply(self, action: tuple) -> None:
        before = self.state
        self.state = self.system.step(before, action)
        self.counts[action[0]] += 1
        if action[0] == RESUME:
            self.resumed_requests += len(before.retracted) - len(self.state.retracted)
        for rid in set(self.state.finished) - set(before.finished):
            self.finish_time[rid] = self.sim.now
        self.peak_retracted = max(self.peak_retracted, len(self.state.retracted))
        self.recorder.record(self.sim.now, action[0], {"action": list(action), "state": digest(self.state, 16),
                                                      "full_free": self.state.full_free,
                                                      "swa_free": self.state.swa_free})
        if self.state.fault is not None:
            self.crash = (self.sim.now, self.state.fault[1])
            self.recorder.record(self.sim.now, "crash", {"invariant": self.state.fault[0],
                                                        "message": self.state.fault[1]})
            self.sim.stop()

    def tick(self, step_time: float) -> None:
        system = self.system
        if self.state.retracted:
            before = self.state.retracted
            self.apply((RESUME,))
            if self.crash:
                return
            if self.state.retracted == before:
                self.counts[RESUME] -= 1  # nothing fitted: not a resume worth counting
        while self.state.next_arrival < self.arrived and (ARRIVE,) in system.enabled(self.state):
            self.apply((ARRIVE,))
        while self.state.running and (DECODE,) not in system.enabled(self.state):
            self.apply((RETRACT, self.state.running[-1].rid))
        if self.state.running:
            self.apply((DECODE,))
        if system.done(self.state):
            return
        self.sim.schedule(step_time, self.tick, step_time)

    def summary(self) -> dict[str, Any]:
        state, cfg = self.state, self.system.config
        leaked_full = cfg.full_pages - state.full_free - sum(r.full_pages for r in state.running)
        leaked_swa = cfg.swa_pages - state.swa_free - sum(r.swa_pages for r in state.running)
        latencies = sorted(self.finish_time.values())
        violations = [f"{self.state.fault[0]}: {self.crash[1]}"] if self.crash else []
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
