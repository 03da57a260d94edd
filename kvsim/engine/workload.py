"""What a scheduler's timed workload shares, whatever the model (kv-cache-manager's `sim` and `scheduler_sim`,
radix-cache's `sim`): the driver over the system, the queues a scheduler keeps, Poisson arrivals, and a scheduler
step every `step_time` seconds until the policy stops. The policy is the subclass; every state change goes
through the system's transitions (`Driver`)."""

from __future__ import annotations

from typing import Any

from .sim import Driver, Simulator
from .trace import TraceRecorder


class WorkloadRun:
    """A timing policy's run: a subclass gives `tick(step_time)` (one scheduler step; it schedules the next) and
    `summary()`."""

    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: Any) -> None:
        self.sim, self.recorder, self.system = sim, recorder, system
        self.driver = Driver(system)
        self.waiting: list[int] = []  # arrived, not running: FCFS, preempted requests at the front
        self.running: list[int] = []  # in the order they were scheduled
        self.crash: tuple[float, str, str] | None = None

    def arrive(self, rid: int) -> None:
        self.waiting.append(rid)
        self.recorder.record(self.sim.now, "arrival", {"rid": rid})

    def tick(self, step_time: float) -> None:
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, requests: int, arrival_rate: float, step_time: float) -> tuple[dict[str, Any], Driver]:
        self.sim.poisson_arrivals(requests, arrival_rate, self.arrive)
        self.sim.schedule(0.0, self.tick, step_time)
        self.sim.run()
        return self.summary(), self.driver
