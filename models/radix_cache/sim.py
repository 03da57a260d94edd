"""Timed simulation of the radix cache under SGLang's scheduler (`kvsim simulate radix-cache`).

A seeded shared-prefix workload driven through the same `RadixCacheSystem` that `explore` searches; this module is
a timing policy over it, never a second cache. `requests` requests arrive as a Poisson stream (`arrival_rate` per
second); each belongs to one of `families` prompt families (drawn uniformly from the simulator's generator): every
prompt shares `shared` leading tokens and prompts of one family are equal (the system's own prompt rule,
`Prompts.prompt`), so a later request of a family hits the earlier one's prompt and outputs in the tree. The pool
has `num_pages` pages of `page_size` tokens.

Each scheduler step (`step_time` seconds) is, as SGLang's event loop runs one (`get_next_batch_to_run`), either a
prefill batch or a decode batch:

* prefill: the arrived waiting requests are admitted (`Admit`) in queue order until one is deferred (its demand
  does not fit the free and evictable tokens); a step that admits at least one is a prefill step;
* otherwise every running request decodes (`Decode`; with `num_draft_tokens` > 0, EAGLE speculative decoding,
  `Verify`: the drafts' allocation and a verify accepting 1 .. num_draft_tokens tokens, each draft after the first
  accepted with probability `accept_prob` while the previous one was). When one is deferred (its next page does not fit),
  requests are retracted (`Retract`) in `retract_decode`'s order, the request it pops first: fewest outputs, then
  the longest input (`_get_decode_retraction_order`), then the latest scheduled, among those the system lets
  retract (whose next decode does not fit), never the last running one (retract_decode keeps one), and the decode
  is tried again. A retracted request goes back to the front of the waiting queue with its outputs, and is
  matched again when admitted.

A request finishes by itself after `max_tokens` outputs (the system releases it with a checkpoint, so its KV stays
in the tree). What a step did is read from its effects (`Admitted`: the prefix hit; `Deferred`; `Released`). The
system's invariants are asked of the state every step ends in (the step checks, such as `match_is_longest`, are
flags its transition records); the first violation ends the run, recorded with its time. The summary: finished,
the prefill and decode steps, retractions, deferrals, the prefix hit rate (matched tokens over the input tokens
of every admission), the tokens accepted per verify (speculative decoding), the free pages and the tree's cached
tokens over time.

No messaging: the model takes no faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvsim.engine.canon import digest
from kvsim.engine.params import param
from kvsim.engine.sim import Driver, FaultPlan, Simulator
from kvsim.engine.system import SameAnswer, first_violation
from kvsim.engine.trace import TraceRecorder
from kvsim.engine.workload import WorkloadRun

from .request_loop import RUNNING, Admit, Decode, Retract
from .system import Admitted, Deferred, RadixCacheConfig, RadixCacheSystem, Released, Verify, cached_tokens
from .variants import RadixCacheVariant

MAX_REQUESTS = 20_000


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate radix-cache --param`: the workload, the pool, the step time."""

    requests: int = param(200, "requests in the workload", minimum=1, maximum=MAX_REQUESTS)
    families: int = param(4, "prompt families (equal families: equal prompts)", minimum=1, maximum=64)
    prompt_len: int = param(32, "tokens in each prompt", minimum=2, maximum=4096)
    shared: int = param(16, "leading prompt tokens every family shares", minimum=0, maximum=4096)
    max_tokens: int = param(16, "output tokens a request samples before it finishes", minimum=1, maximum=4096)
    num_pages: int = param(48, "pages in the pool, page 0 (reserved) not counted", minimum=1, maximum=1 << 16)
    page_size: int = param(4, "tokens per page", minimum=1, maximum=256)
    need_sort: bool = param(False, "the allocator stages freed pages and sorts them when an alloc runs short")
    num_draft_tokens: int = param(0, "EAGLE speculative decoding's draft tokens per step (topk 1); 0: none",
                                  minimum=0, maximum=8)
    accept_prob: float = param(0.7, "with num_draft_tokens: the chance a draft is accepted, once the one before was",
                               minimum=0.0, maximum=1.0)
    arrival_rate: float = param(20.0, "mean arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    step_time: float = param(0.02, "seconds per scheduler step", minimum=1e-3, maximum=60.0)


@dataclass(frozen=True)
class WorkloadConfig(RadixCacheConfig):
    """The system's config for a workload: as many requests as the simulation has (the explorer keeps three)."""

    max_requests: ClassVar[int] = MAX_REQUESTS


def simulate(sim: Simulator, recorder: TraceRecorder, variant: RadixCacheVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    rng = sim.rng
    families = tuple(rng.randrange(params.families) for _ in range(params.requests))
    config = WorkloadConfig(num_pages=params.num_pages, page_size=params.page_size, prompts=families,
                            prompt_len=params.prompt_len, shared=params.shared, max_tokens=params.max_tokens,
                            need_sort=params.need_sort, num_draft_tokens=params.num_draft_tokens)
    return _Run(sim, recorder, RadixCacheSystem(variant, config), params.accept_prob).run(
        params.requests, params.arrival_rate, params.step_time)


class _Run(WorkloadRun):
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: RadixCacheSystem, accept_prob: float) -> None:
        super().__init__(sim, recorder, system)
        self.accept_prob = accept_prob
        self.accepted = self.verifies = 0
        self.finished = 0
        self.counts = {"prefill_steps": 0, "decode_steps": 0, "admissions": 0, "decodes": 0, "retractions": 0,
                       "deferrals": 0}
        self.input_tokens = self.hit_tokens = 0
        self.free_samples: list[int] = []
        self.cached_samples: list[int] = []
        self.cached = SameAnswer(lambda *cached: digest(cached, 16))  # the free list: rebuilt, mostly equal

    def apply(self, action: tuple) -> str:
        """Take `action`; returns what happened to its request: "admitted", "decoded", "deferred", "finished" or
        "retracted"."""
        before = self.driver.state
        outcome = "decoded" if type(action) in (Decode, Verify) else ""
        for effect in self.driver.apply(action):
            kind = type(effect)
            if kind is Admitted:
                outcome = "admitted"
                req = before.requests[action.req]
                self.input_tokens += self.system.cfg.prompt_len + len(req.output_ids)
                self.hit_tokens += effect.prefix_len
            elif kind is Deferred:
                outcome = "deferred"
                self.counts["deferrals"] += 1
            elif kind is Released:
                outcome = "finished" if effect.checkpointed else "retracted"
        if type(action) is Verify and outcome != "deferred":  # a deferred verify took no step: not counted
            self.verifies += 1
            self.accepted += action.accepted
        state = self.driver.state
        self.recorder.record(self.sim.now, action[0], {
            "action": list(action), "outcome": outcome, "free_pages": len(state.allocator.free_pages),
            "cached": self.cached(state.allocator, state.tree.evictable_size, state.tree.protected_size)})
        bad = first_violation(self.system, state)
        if bad is not None:  # a flagged state has no successor; any violation ends the run as its crash
            self.crash = (self.sim.now, bad[0], bad[1])
            self.recorder.record(self.sim.now, "crash", {"invariant": bad[0], "message": bad[1]})
            self.sim.stop()
        if outcome == "finished":
            self.running.remove(action.req)
            self.finished += 1
        return outcome

    def tick(self, step_time: float) -> None:
        if self._prefill() or self._decode():
            state = self.driver.state
            self.free_samples.append(len(state.allocator.free_pages) + len(state.allocator.staged_pages))
            self.cached_samples.append(cached_tokens(state.tree))
        if not self.crash and self.finished < len(self.system.cfg.prompts):
            self.sim.schedule(step_time, self.tick, step_time)

    def _prefill(self) -> bool:
        """Admit waiting requests in order until one is deferred; True when this step admitted any."""
        admitted = False
        while self.waiting and not self.crash:
            rid = self.waiting[0]
            outcome = self.apply(Admit(rid))
            if outcome == "deferred" or self.crash:
                break
            self.waiting.pop(0)
            self.counts["admissions"] += 1
            admitted = True
            if outcome == "admitted":
                self.running.append(rid)
        self.counts["prefill_steps"] += admitted
        return admitted

    def _decode(self) -> bool:
        """Decode every running request, retracting in retract_decode's order while one does not fit."""
        if not self.running:
            return False
        self.counts["decode_steps"] += 1
        for rid in list(self.running):
            while rid in self.running and not self.crash:
                outcome = self.apply(self._step(rid))
                if outcome != "deferred":
                    self.counts["decodes"] += 1
                    break
                victim = self._victim()
                if victim is None:
                    break
                self.apply(Retract(victim))
                self.counts["retractions"] += 1
                self.running.remove(victim)
                self.waiting.insert(0, victim)
            if self.crash:
                break
        return True

    def _step(self, rid: int) -> tuple:
        """The request's decode; with speculative decoding a verify, its accepted tokens drawn."""
        cfg = self.system.cfg
        if not cfg.num_draft_tokens:
            return Decode(rid)
        most = min(cfg.num_draft_tokens, cfg.max_tokens - len(self.driver.state.requests[rid].output_ids))
        accepted = 1
        while accepted < most and self.sim.rng.random() < self.accept_prob:
            accepted += 1
        return Verify(rid, accepted)

    def _victim(self) -> int | None:
        """The request retract_decode pops first among those the system lets retract, never the last one."""
        if len(self.running) < 2:
            return None
        state, prompt_len = self.driver.state, self.system.cfg.prompt_len
        enabled = set(self.driver.enabled())
        order = sorted(range(len(self.running)), key=lambda i: (len(state.requests[self.running[i]].output_ids),
                                                                -prompt_len), reverse=True)
        for i in reversed(order):
            if Retract(self.running[i]) in enabled:
                return self.running[i]
        return None

    def summary(self) -> dict[str, Any]:
        state, system = self.driver.state, self.system
        violations = [f"{self.crash[1]}: {self.crash[2]}"] if self.crash else []
        step = max(1, len(self.free_samples) // 10)
        samples = self.free_samples
        return {
            "violations": violations,
            "requests": len(system.cfg.prompts),
            "finished": self.finished,
            "running": sum(r.status == RUNNING for r in state.requests),
            **self.counts,
            "input_tokens": self.input_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": round(self.hit_tokens / self.input_tokens, 6) if self.input_tokens else None,
            "accepted_per_verify": round(self.accepted / self.verifies, 6) if self.verifies else None,
            "pages": system.cfg.num_pages,
            "free_pages_min": min(samples) if samples else None,
            "free_pages_mean": round(sum(samples) / len(samples), 3) if samples else None,
            "free_pages_over_time": samples[::step],
            "cached_tokens_over_time": self.cached_samples[::step],
            "crashed": self.crash is not None,
            "crash_time": self.crash[0] if self.crash else None,
        }
