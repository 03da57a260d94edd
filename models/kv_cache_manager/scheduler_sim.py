"""Timed simulation of the P/D hand-off (`kvsim simulate kv-cache-manager-pd`).

A seeded workload driven through the same `ProducerSchedulerSystem` that `explore` searches; this module is a
timing policy over it, never a second scheduler. `requests` requests arrive as a Poisson stream (`arrival_rate` per
second); each is a producer (`do_remote_decode`: it prefills here, samples one token and is finished into the
producing connector) with probability `producer_share`, else a local request (`max_tokens` outputs, freed when it
finishes). Every prompt is `prompt_len` tokens of its own (the system's prompt rule); a producer's is cut short by
the prefill backoff over an MTP drafter's lookahead (`mtp_lookahead`, #55055) where the variant has it.

Each scheduler step (`step_time` seconds), in vLLM's order under async scheduling (a step is scheduled before the
previous step's output is processed):

* every running request whose output is back decodes (`Decode`); when the pool cannot give its block
  (`Deferred`), the most recently scheduled running request is preempted (`Preempt`, from the tail of the running
  queue as `Scheduler.schedule` does; its output may still be in flight: #50297's race) and the decode retried;
* unless a request was preempted this step (vLLM schedules no waiting request then), waiting requests that may
  have a step are scheduled (`Schedule`) FCFS until one is deferred;
* the previous step's outputs return (`Output`, one per request it scheduled, a stale one first): a producer that
  sampled its token is handed to the connector (`Handed`), a local one at its budget is freed;
* the deliveries the decode side has finished by then are reported (`Deliver`: `finished_sending` arrives with a
  step's connector output); each producer's read takes a delay drawn from an exponential law of mean
  `delivery_latency` from its hand-off.

The system's invariants are checked on the state each step ends in; the first that fails ends the run and is
reported with its time (on `pre_50297` a producer preempted with its final step in flight is finished with no
blocks: `finished_into_producer_owns_blocks`). The summary: requests handed off and delivered, preemptions (with
an output in flight), dropped stale outputs, the blocks held awaiting delivery over time and their peak, the free
blocks, and the invariants on the final state. No messaging: the model takes no faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvsim.engine.canon import digest
from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.sim import Driver, FaultPlan, Simulator
from kvsim.engine.system import SameAnswer, first_violation
from kvsim.engine.trace import TraceRecorder
from kvsim.engine.workload import WorkloadRun

from .kv_cache_manager import cdiv
from .kv_cache_utils import check_chain
from .scheduler import (DONE, RUNNING, SENDING, Decode, Deferred, Deliver, Dropped, Freed, Handed, Output,
                        Preempt, ProducerSchedulerConfig, ProducerSchedulerSystem, Schedule)
from .variants import CacheManagerVariant

MAX_REQUESTS = 20_000


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate kv-cache-manager-pd --param`: the workload, the pool, the step time, the decode side's read."""

    requests: int = param(200, "requests in the workload", minimum=1, maximum=MAX_REQUESTS)
    producer_share: float = param(0.5, "chance that a request is a producer (do_remote_decode), else local",
                                  minimum=0.0, maximum=1.0)
    prompt_len: int = param(16, "tokens in each prompt", minimum=1, maximum=4096)
    max_tokens: int = param(8, "output tokens a local request samples", minimum=1, maximum=4096)
    num_blocks: int = param(24, "blocks in the pool, the null block (block 0) included", minimum=2, maximum=1 << 16)
    block_size: int = param(4, "tokens per block", minimum=1, maximum=256)
    arrival_rate: float = param(40.0, "mean arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    step_time: float = param(0.02, "seconds per scheduler step", minimum=1e-3, maximum=60.0)
    delivery_latency: float = param(0.1, "mean seconds the decode side takes to read a producer's blocks "
                                         "(exponential), until finished_sending", minimum=0.0, maximum=3600.0)
    mtp_lookahead: int = param(0, "num_prefill_lookahead_tokens: the MTP drafter's lookahead (0: none; #55055)",
                               minimum=0, maximum=16)

    def __post_init__(self) -> None:
        check_chain(self.prompt_len + self.max_tokens + self.mtp_lookahead, self.block_size,
                    "param prompt_len + max_tokens + mtp_lookahead")
        need = 1 + cdiv(self.prompt_len + self.max_tokens, self.block_size)
        if self.num_blocks < need:  # else a lone local request is deferred for ever
            raise ConfigError("param num_blocks", f"at least {need} (one request's prompt and outputs, and the null "
                              "block)", self.num_blocks)


@dataclass(frozen=True)
class WorkloadConfig(ProducerSchedulerConfig):
    """The system's config for a workload: as many requests as the simulation has (the explorer keeps three), each
    a producer or local as drawn (`kinds`), not the first `producers` ones."""

    max_requests: ClassVar[int] = MAX_REQUESTS
    kinds: tuple[bool, ...] = ()  # request r is a producer when kinds[r]

    def is_producer(self, req: int) -> bool:
        return self.kinds[req]


def simulate(sim: Simulator, recorder: TraceRecorder, variant: CacheManagerVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    rng = sim.rng
    kinds = tuple(rng.random() < params.producer_share for _ in range(params.requests))
    producers = sum(kinds)
    config = WorkloadConfig(num_blocks=params.num_blocks, block_size=params.block_size, prompt_len=params.prompt_len,
                            producers=producers, local=len(kinds) - producers, max_tokens=params.max_tokens,
                            mtp_lookahead=params.mtp_lookahead, kinds=kinds)
    run = _Run(sim, recorder, ProducerSchedulerSystem(variant, config), params.delivery_latency)
    return run.run(params.requests, params.arrival_rate, params.step_time)


class _Run(WorkloadRun):
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: ProducerSchedulerSystem,
                 delivery_latency: float) -> None:
        super().__init__(sim, recorder, system)
        self.delivery_latency = delivery_latency
        self.batch: list[int] = []  # the requests the previous step scheduled: their outputs return this step
        self.read: list[int] = []  # producers whose blocks the decode side has read: finished_sending is due
        self.done = 0
        self.counts = {"schedules": 0, "decodes": 0, "deferrals": 0, "preemptions": 0, "preempted_in_flight": 0,
                       "dropped_outputs": 0, "handed_off": 0, "delivered": 0}
        self.awaiting = self.awaiting_peak = 0  # blocks held by producers awaiting delivery
        self.awaiting_samples: list[int] = []
        self.free_samples: list[int] = []
        self.pool_digest = SameAnswer(lambda pool: digest((pool.refs, pool.free), 16))

    def apply(self, action: tuple) -> tuple:
        effects = self.driver.apply(action)
        pool = self.driver.state.manager.pool
        self.recorder.record(self.sim.now, action[0], {
            "action": list(action), "effects": [e[0] for e in effects], "free": len(pool.free),
            "pool": self.pool_digest(pool)})
        return effects

    # -- one scheduler step ------------------------------------------------------------------------------------
    def tick(self, step_time: float) -> None:
        batch: list[int] = []
        preempted = self._decode_running(batch)
        if not preempted:
            self._admit(batch)
        for rid in self.batch:
            self._output(rid)
        self.batch = batch
        read, self.read = self.read, []
        for rid in read:
            self._deliver(rid)
        state = self.driver.state
        self.awaiting_samples.append(self.awaiting)
        self.free_samples.append(len(state.manager.pool.free))
        bad = first_violation(self.system, state)
        if bad is not None:
            self.crash = (self.sim.now, *bad)
            self.recorder.record(self.sim.now, "violation", {"invariant": bad[0], "message": bad[1]})
            self.sim.stop()
        elif self.done < len(state.requests):
            self.sim.schedule(step_time, self.tick, step_time)

    def _decode_running(self, batch: list[int]) -> bool:
        """Decode every running request whose output is back, preempting from the tail under pressure; whether
        a request was preempted."""
        preempted = False
        for rid in list(self.running):
            if rid not in self.running or self.driver.state.requests[rid].in_flight:
                continue  # preempted this step for an earlier request's block, or its output not back yet
            while True:
                if type(self.apply(Decode(rid))[0]) is not Deferred:
                    self.counts["decodes"] += 1
                    batch.append(rid)
                    break
                self.counts["deferrals"] += 1
                victim = self.running.pop()
                in_flight = self.driver.state.requests[victim].in_flight
                self.apply(Preempt(victim))
                preempted = True
                self.counts["preemptions"] += 1
                self.counts["preempted_in_flight"] += in_flight
                self.waiting.insert(0, victim)
                if victim == rid:
                    break
        return preempted

    def _admit(self, batch: list[int]) -> None:
        """Schedule the waiting requests that may have a step, FCFS, until one is deferred (the pool is full);
        one whose stale output it must wait for is skipped."""
        steps = set(self.system._steps(self.driver.state))
        for rid in list(self.waiting):
            if rid not in steps:
                continue
            if type(self.apply(Schedule(rid))[0]) is Deferred:
                self.counts["deferrals"] += 1
                return
            self.counts["schedules"] += 1
            self.waiting.remove(rid)
            self.running.append(rid)
            batch.append(rid)

    def _output(self, rid: int) -> None:
        for effect in self.apply(Output(rid)):
            kind = type(effect)
            if kind is Dropped:
                self.counts["dropped_outputs"] += 1
            elif kind is Handed:
                self.counts["handed_off"] += 1
                self.awaiting += len(effect.blocks)
                self.awaiting_peak = max(self.awaiting_peak, self.awaiting)
                delay = self.sim.rng.expovariate(1 / self.delivery_latency) if self.delivery_latency else 0.0
                self.sim.schedule(delay, self._read, rid)
            elif kind is Freed:
                self.done += 1
        if self.driver.state.requests[rid].status in (SENDING, DONE):  # finished: it leaves the queues
            for queue in (self.running, self.waiting):
                if rid in queue:
                    queue.remove(rid)

    def _read(self, rid: int) -> None:
        """The decode side has read producer rid's blocks: its finished_sending comes with the next step."""
        self.read.append(rid)
        self.recorder.record(self.sim.now, "read", {"rid": rid})

    def _deliver(self, rid: int) -> None:
        self.awaiting -= len(self.driver.state.requests[rid].handed)
        self.apply(Deliver(rid))
        self.counts["delivered"] += 1
        self.done += 1

    def summary(self) -> dict[str, Any]:
        state, system = self.driver.state, self.system
        violations = [f"{self.crash[1]}: {self.crash[2]}"] if self.crash else []
        if self.crash is None:
            bad = first_violation(system, state)
            if bad is not None:
                violations.append(f"{bad[0]}: {bad[1]}")
        awaiting, free = self.awaiting_samples, self.free_samples
        every = max(1, len(awaiting) // 10)
        return {
            "violations": violations,
            "violation_time": self.crash[0] if self.crash else None,
            "requests": len(state.requests),
            "producers": sum(system.cfg.kinds),
            "done": self.done,
            "running": sum(r.status == RUNNING for r in state.requests),
            "sending": sum(r.status == SENDING for r in state.requests),
            **self.counts,
            "steps": len(awaiting),
            "blocks_usable": system.cfg.num_blocks - 1,  # the null block is never free
            "awaiting_delivery_peak": self.awaiting_peak,
            "awaiting_delivery_mean": round(sum(awaiting) / len(awaiting), 3) if awaiting else None,
            "awaiting_delivery_over_time": awaiting[::every],
            "free_blocks_min": min(free) if free else None,
            "free_blocks_over_time": free[::every],
        }
