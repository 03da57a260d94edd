"""Timed simulation of the KV cache manager (`kvsim simulate kv-cache-manager`).

A seeded request workload driven through the same `CacheManagerSystem` that `explore` searches; this module is a
timing policy over it, never a second manager. The workload: `requests` requests arrive as a Poisson stream
(`arrival_rate` per second); each belongs to one of `families` shared-prefix families (drawn uniformly from the
simulator's generator): every prompt shares `shared` leading tokens, prompts of one family are equal (the system's
own prompt rule, `CacheManagerConfig.prompt`). The pool has `num_blocks` blocks of `block_size` tokens.

Each scheduler step (`step_time` seconds), in vLLM's order (running requests first, then waiting ones, FCFS):

* every running request decodes (`Decode`); when the pool cannot give its block (`Deferred`), the most recently
  scheduled running request is preempted (`Preempt`: freed, back to the front of the waiting queue) and the
  decode is retried, as `Scheduler.schedule` preempts from the tail of its running queue;
* a running request stops early (`Finish`, a stop token) with probability `stop_prob` per step;
* arrived waiting requests are scheduled (`Schedule`) in order until one is deferred (the pool is full).

A request finishes by itself after `max_tokens` outputs (the system frees it inside `Decode`). What a step did is
read from its effects: `Allocated` (the hit in tokens), `Deferred`, `Freed` and `Events` (`BlockRemoved`: a cached
block evicted). A flagged step (a step check broke, e.g. the connector's hit under `pre_48195` with hybrid groups)
has no successor: it ends the run, recorded as the crash. The summary: finished, preemptions, deferrals, the prefix
hit rate (hit tokens over the prompt tokens of every schedule), evictions, the free blocks over time, and the
invariants on the final state.

No messaging: the model takes no faults. The P/D hand-off (`ProducerSchedulerSystem`, `kv-cache-manager-pd`) is
its own workload over its own system (`scheduler_sim`).
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

from .actions import Allocated, Decode, Deferred, Events, Finish, Freed, Preempt, Schedule
from .kv_cache_utils import check_chain
from .kv_events import BlockRemoved
from .system import GROUP_CHOICES, RUNNING, CacheManagerConfig, CacheManagerSystem
from .variants import CacheManagerVariant

MAX_REQUESTS = 20_000


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate kv-cache-manager --param`: the workload, the pool, the step time."""

    requests: int = param(200, "requests in the workload", minimum=1, maximum=MAX_REQUESTS)
    families: int = param(4, "shared-prefix families (equal families: equal prompts)", minimum=1, maximum=64)
    prompt_len: int = param(32, "tokens in each prompt", minimum=1, maximum=4096)
    shared: int = param(16, "leading prompt tokens every family shares", minimum=0, maximum=4096)
    max_tokens: int = param(16, "output tokens a request samples before it finishes", minimum=1, maximum=4096)
    num_blocks: int = param(40, "blocks in the pool, the null block (block 0) included", minimum=2, maximum=1 << 16)
    block_size: int = param(4, "tokens per block", minimum=1, maximum=256)
    arrival_rate: float = param(20.0, "mean arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    step_time: float = param(0.02, "seconds per scheduler step", minimum=1e-3, maximum=60.0)
    stop_prob: float = param(0.02, "chance per step that a running request stops early (a stop token)",
                             minimum=0.0, maximum=1.0)
    groups: str = param("full", "the KV cache groups, in group order", choices=GROUP_CHOICES)
    sliding_window: int = param(16, "tokens a sliding-window group attends to (groups with swa)", minimum=2,
                                maximum=1 << 16)
    attention_chunk_size: int = param(16, "tokens of a chunk of chunked local attention (groups with local; a "
                                      "multiple of block_size)", minimum=1, maximum=1 << 16)

    def __post_init__(self) -> None:
        if self.shared > self.prompt_len:
            raise ConfigError("param shared", f"at most prompt_len ({self.prompt_len})", self.shared)
        check_chain(self.prompt_len + self.max_tokens, self.block_size, "param prompt_len + max_tokens")
        need = 1 + len(self.groups.split(",")) * -(-(self.prompt_len + self.max_tokens) // self.block_size)
        if self.num_blocks < need:  # else a lone request is deferred for ever
            raise ConfigError("param num_blocks", f"at least {need} (one request's prompt and outputs in every group, "
                              "and the null block)", self.num_blocks)


@dataclass(frozen=True)
class WorkloadConfig(CacheManagerConfig):
    """The system's config for a workload: as many requests as the simulation has (the explorer keeps three)."""

    max_requests: ClassVar[int] = MAX_REQUESTS


def simulate(sim: Simulator, recorder: TraceRecorder, variant: CacheManagerVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    rng = sim.rng
    families = tuple(rng.randrange(params.families) for _ in range(params.requests))
    config = WorkloadConfig(num_blocks=params.num_blocks, block_size=params.block_size, prompts=families,
                            prompt_len=params.prompt_len, shared=params.shared, max_tokens=params.max_tokens,
                            resets=0, groups=params.groups, sliding_window=params.sliding_window,
                            attention_chunk_size=params.attention_chunk_size)
    run = _Run(sim, recorder, CacheManagerSystem(variant, config), params.stop_prob)
    return run.run(params.requests, params.arrival_rate, params.step_time)


class _Run(WorkloadRun):
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: CacheManagerSystem, stop_prob: float) \
            -> None:
        super().__init__(sim, recorder, system)
        self.stop_prob = stop_prob
        self.finished = 0
        self.counts = {"schedules": 0, "decodes": 0, "preemptions": 0, "early_stops": 0, "deferrals": 0}
        self.prompt_tokens = self.hit_tokens = self.evictions = 0
        self.free_samples: list[int] = []
        self.pool_digest = SameAnswer(lambda pool: digest((pool.refs, pool.free, len(pool.cached)), 16))

    def apply(self, action: tuple) -> str:
        """Take `action`; returns what happened to its request: "allocated", "deferred", "finished" or "freed"."""
        outcome = ""
        for effect in self.driver.apply(action):
            kind = type(effect)
            if kind is Allocated:
                outcome = "allocated"
                if type(action) is Schedule:
                    self.prompt_tokens += self.system.cfg.prompt_len
                    self.hit_tokens += effect.num_hit_tokens
            elif kind is Deferred:
                outcome = "deferred"
                self.counts["deferrals"] += 1
            elif kind is Freed:
                outcome = "freed" if type(action) is Preempt else "finished"
            elif kind is Events:
                self.evictions += sum(len(e.block_hashes) for e in effect.events if type(e) is BlockRemoved)
        state = self.driver.state
        pool = state.manager.pool  # the pool's fingerprint, not the whole state's: its chained hashes are long
        self.recorder.record(self.sim.now, action[0], {"action": list(action), "outcome": outcome,
                                                      "free": len(pool.free), "pool": self.pool_digest(pool)})
        if state.flags:  # a flagged state has no successor: its flag is the crash
            (invariant, message), = state.flags
            self.crash = (self.sim.now, invariant, message)
            self.recorder.record(self.sim.now, "crash", {"invariant": invariant, "message": message})
            self.sim.stop()
        return outcome

    def tick(self, step_time: float) -> None:
        if self._decode_running() and self._admit():
            self.free_samples.append(len(self.driver.state.manager.pool.free))
            if self.finished < len(self.system.cfg.prompts):
                self.sim.schedule(step_time, self.tick, step_time)

    def _end(self, rid: int) -> None:
        self.running.remove(rid)
        self.finished += 1

    def _decode_running(self) -> bool:
        """Decode every running request, preempting from the tail under pressure; False once the run crashed."""
        rng = self.sim.rng
        for rid in list(self.running):
            if rid not in self.running:  # preempted for an earlier request's block this step
                continue
            if self.stop_prob and rng.random() < self.stop_prob:
                self.apply(Finish(rid))
                self.counts["early_stops"] += 1
                self._end(rid)
            else:
                while True:
                    outcome = self.apply(Decode(rid))
                    self.counts["decodes"] += outcome != "deferred"
                    if outcome != "deferred" or self.crash:
                        break
                    victim = self.running[-1]
                    self.apply(Preempt(victim))
                    self.counts["preemptions"] += 1
                    self.running.remove(victim)
                    self.waiting.insert(0, victim)
                    if victim == rid or self.crash:
                        break
                if outcome == "finished":
                    self._end(rid)
            if self.crash:
                return False
        return True

    def _admit(self) -> bool:
        """Schedule waiting requests in order until one is deferred; False once the run crashed."""
        while self.waiting:
            rid = self.waiting[0]
            outcome = self.apply(Schedule(rid))
            if self.crash:
                return False
            if outcome == "deferred":
                break
            self.waiting.pop(0)
            self.counts["schedules"] += 1
            if outcome == "finished":
                self.finished += 1
            else:
                self.running.append(rid)
        return True

    def summary(self) -> dict[str, Any]:
        state, system = self.driver.state, self.system
        violations = [f"{self.crash[1]}: {self.crash[2]}"] if self.crash else []
        if not state.flags:
            bad = first_violation(system, state)
            if bad is not None:
                violations.append(f"{bad[0]}: {bad[1]}")
        samples = self.free_samples
        usable = system.cfg.num_blocks - 1  # the null block is never free
        step = max(1, len(samples) // 10)
        return {
            "violations": violations,
            "requests": len(system.cfg.prompts),
            "finished": self.finished,
            "running": sum(r.status == RUNNING for r in state.requests),
            **self.counts,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": round(self.hit_tokens / self.prompt_tokens, 6) if self.prompt_tokens else None,
            "evictions": self.evictions,
            "steps": len(samples),
            "blocks_usable": usable,
            "free_blocks_min": min(samples) if samples else None,
            "free_blocks_mean": round(sum(samples) / len(samples), 3) if samples else None,
            "free_blocks_over_time": samples[::step],
            "crashed": self.crash is not None,
            "crash_time": self.crash[0] if self.crash else None,
        }
