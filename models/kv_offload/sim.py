"""Timed offload traffic over the CPU offloading manager (`kvsim simulate kv-offload`).

A seeded stream of requests (Poisson arrivals) over shared documents: request r reads document d
(popularity 1/(d + 1)) and offers its first 1..max_chunks chunk keys. The simulation is a timing
policy over the transition system (`system.OffloadSystem`, built with these prompts): at arrival a
request touches its keys, loads the prefix that is a HIT (the load completes after `load_time` per
chunk) and stores the rest (`prepare_store`; the store completes after `store_time` per chunk, or fails
with probability `store_failure_rate`); it finishes once its transfers are done. Every change of the
model goes through `Driver.apply`, and what a step did (the keys stored, the evictions, the slots
loaded, the events and stats drained) comes back as its effects.

The summary: the hit rate (chunks loaded from the CPU cache over chunks offered), evictions, refused
stores (no room: every idle chunk protected or pinned), failed stores, the peak number of write-pending
chunks, and the invariants on the final state. Run it once per policy to compare LRU and ARC on the
same stream (same seed, same arrivals and prompts).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Iterable

from kvsim.engine.actions import decode
from kvsim.engine.params import param
from kvsim.engine.sim import Driver, FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from .actions import ACTIONS, CompleteLoad, CompleteStore, Finish, Load, Loaded, Store, Stored, StoreRefused, Touch
from .system import OffloadSystem, OffloadSystemConfig
from .variants import OffloadVariant

FAULT_KINDS: tuple[str, ...] = ()  # a failed store is the workload's `store_failure_rate`, not a message fault
PEERS: tuple[str, ...] = ()


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate kv-offload --param`: the cache, the request stream and the transfer timings."""

    requests: int = param(200, "requests in the stream", minimum=1, maximum=20_000)
    arrival_rate: float = param(50.0, "mean request arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    num_chunks: int = param(32, "CPU chunk slots", minimum=0, maximum=1024)
    cache_policy: str = param("lru", "the cache policy", choices=("lru", "arc"))
    documents: int = param(40, "shared documents (popularity 1/(d+1))", minimum=1, maximum=10_000)
    max_chunks: int = param(8, "most chunk keys one request offers (uniform in 1..max_chunks)", minimum=1,
                            maximum=64)
    store_time: float = param(0.01, "seconds per chunk of a GPU->CPU store", minimum=0.0, maximum=60.0)
    load_time: float = param(0.005, "seconds per chunk of a CPU->GPU load", minimum=0.0, maximum=60.0)
    store_failure_rate: float = param(0.01, "probability a store transfer fails", minimum=0.0, maximum=1.0)
    store_threshold: int = param(1, "offers a key needs before it is stored", minimum=1, maximum=16)


def workload(sim: Simulator, params: SimConfig) -> tuple[tuple[int, ...], ...]:
    """Each request's keys: the first 1..max_chunks chunks of a document drawn by popularity."""
    rng = sim.rng
    cum_weights = list(accumulate(1.0 / (d + 1) for d in range(params.documents)))
    docs = range(params.documents)
    prompts = []
    for _ in range(params.requests):
        doc = rng.choices(docs, cum_weights=cum_weights)[0]
        length = rng.randint(1, params.max_chunks)
        prompts.append(tuple(doc * params.max_chunks + i for i in range(length)))
    return tuple(prompts)


def simulate(sim: Simulator, recorder: TraceRecorder, variant: OffloadVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    prompts = workload(sim, params)
    config = OffloadSystemConfig(num_chunks=params.num_chunks, cache_policy=params.cache_policy,
                                 requests=params.requests, store_threshold=params.store_threshold,
                                 max_tracker_size=64_000, store_failures=params.requests, resets=0, prompts=prompts)
    run = _Run(sim, recorder, OffloadSystem(variant, config), params)
    sim.poisson_arrivals(params.requests, params.arrival_rate, run.arrive)
    sim.run()
    return run.summary(), run.driver


def trace_actions(steps: Iterable[dict[str, Any]]) -> list[tuple]:
    """The actions a recorded run applied, in order, decoded from its trace steps."""
    return [decode([step["event"], *step["data"]], ACTIONS) for step in steps if step["event"] in ACTIONS]


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: OffloadSystem, params: SimConfig) -> None:
        self.sim, self.rec, self.system, self.p = sim, recorder, system, params
        self.driver = Driver(system)
        self.offered = self.hits = self.evictions = self.refused = self.failed = self.stored = 0
        self.peak_pending = 0
        self.timeline: list[tuple[float, int, int]] = []  # (time, cumulative hits, cumulative evictions)

    @property
    def state(self) -> Any:
        return self.driver.state

    def apply(self, action: tuple) -> tuple[tuple, ...]:
        self.rec.record(self.sim.now, action[0], list(action[1:]))
        effects = self.driver.apply(action)
        for e in effects:
            follow = _FOLLOW.get(type(e))
            if follow is not None:
                follow(self, e)
        self.peak_pending = max(self.peak_pending, self.state.manager.num_write_pending_chunks)
        self.timeline.append((self.sim.now, self.hits, self.evictions))
        return effects

    # -- what an effect sets in motion (`_FOLLOW`, by record type) ---------------------------------------
    def _on_stored(self, e: Stored) -> None:
        self.stored += len(e.keys)
        self.evictions += len(e.evicted)
        self.sim.schedule(self.p.store_time * len(e.keys), self._store_done, e.req)

    def _on_store_refused(self, e: StoreRefused) -> None:
        self.refused += 1

    def _on_loaded(self, e: Loaded) -> None:
        self.hits += len(e.keys)
        self.sim.schedule(self.p.load_time * len(e.keys), self._load_done, e.req)

    def arrive(self, r: int) -> None:
        self.offered += len(self.system.cfg.keys_of(r))
        self.apply(Touch(r))
        if Load(r) in self.system.enabled_for(self.state, r):
            self.apply(Load(r))
        self.apply(Store(r))
        self._maybe_finish(r)

    def _store_done(self, r: int) -> None:
        success = self.sim.rng.random() >= self.p.store_failure_rate
        self.failed += not success
        self.apply(CompleteStore(r, success))
        self._maybe_finish(r)

    def _load_done(self, r: int) -> None:
        self.apply(CompleteLoad(r))
        self._maybe_finish(r)

    def _maybe_finish(self, r: int) -> None:
        job = self.state.jobs[r]
        if job.store is None and job.load is None and not job.finished:
            self.apply(Finish(r))

    def summary(self) -> dict[str, Any]:
        s, system = self.state, self.system
        violations = [f"{inv.name}: {msg}" for inv in system.invariants if (msg := inv.check(s)) is not None]
        unfinished = sum(not j.finished for j in s.jobs)
        if unfinished and self.sim.stopped_by is None:
            violations.append(f"requests never finished: expected none, got {unfinished}")
        return {
            "policy": self.p.cache_policy,
            "requests": self.p.requests,
            "chunks_offered": self.offered,
            "chunk_hits": self.hits,
            "hit_rate": round(self.hits / self.offered, 6) if self.offered else 0.0,
            "chunks_stored": self.stored,
            "evictions": self.evictions,
            "refused_stores": self.refused,
            "failed_stores": self.failed,
            "peak_pending_writes": self.peak_pending,
            "violations": violations,
        }


_FOLLOW = {Stored: _Run._on_stored, StoreRefused: _Run._on_store_refused, Loaded: _Run._on_loaded}
