"""The CPU offloading manager under several requests, as a transition system (`kvsim explore kv-offload`).

Request r offers the keys `r*stride .. r*stride + prompt_len - 1` (overlapping windows share keys). Its
scheduler side stores them (`prepare_store`; the keys to store become one transfer job), loads the
longest prefix that looks up as HIT (`prepare_load`, one job), touches them, and finishes
(`on_request_finished`) once no job of its is in flight. Transfers complete (`complete_store`,
`complete_load`); a failed store is a fault with a budget. `reset_cache` runs with no transfer in
flight (the scheduler flushes first), a bounded number of times. After every step the connector
drains `take_events` and `get_stats`; both come back as the step's effects, so the state holds none.

Abstractions (sound for the behaviour): the store-threshold tracker's counts are kept up to the
threshold (a count only matters through `count >= store_threshold`; the tracker order is kept), and a
finished request's access record is dropped (it makes no more calls; upstream keeps the record in the
request's own context, which the scheduler discards).

Invariants on every state: 3.3 items 2 and 3 on the manager, the jobs matching the slots (every
write-pending key belongs to exactly one store job, every load in flight pins its keys), and the
step checks of items 4-6 (recorded by the step that broke them). Liveness (`every_job_concludes`):
from every state all requests can finish, every pending store completed or failed, every load completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.actions import Rules
from kvsim.engine.system import Invariant, Sometimes, Thawed

from . import checks
from .actions import (CompleteLoad, CompleteStore, Events, Finish, Load, Loaded, NothingToStore, Reset, Stats,
                      Store, Stored, StoreRefused, Touch)
from .manager import CPUOffloadingManager, ManagerState
from .policies import thaw_policy
from .status import CPUOffloadingMetrics, LookupResult
from .variants import FIXED, OffloadVariant


@dataclass(frozen=True)
class OffloadSystemConfig:
    """`kvsim explore kv-offload --param`: the cache, the requests and the fault budgets (one place each)."""

    num_chunks: int = param(2, "CPU chunk slots (the manager's capacity)", minimum=0, maximum=8)
    cache_policy: str = param("lru", "the cache policy", choices=("lru", "arc"))
    requests: int = param(2, "requests offering keys", minimum=1, maximum=4)
    prompt_len: int = param(2, "keys each request offers", minimum=1, maximum=4)
    stride: int = param(1, "key offset between consecutive requests (< prompt_len: shared keys)", minimum=0,
                        maximum=4)
    store_threshold: int = param(1, "offers a key needs before it is stored (>= 2: the tracker)", minimum=1,
                                 maximum=3)
    max_tracker_size: int = param(4, "keys the store-threshold tracker holds", minimum=1, maximum=16)
    store_failures: int = param(1, "failed stores (complete_store success=False) allowed", minimum=0,
                                maximum=64)
    resets: int = param(0, "reset_cache calls allowed", minimum=0, maximum=48)
    # the timed simulation's workload: each request's keys (not a --param; empty: the windows above)
    prompts: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.cache_policy not in ("lru", "arc"):
            raise ConfigError("param cache_policy", "one of lru, arc", self.cache_policy)
        if self.prompts and len(self.prompts) != self.requests:
            raise ConfigError("prompts", f"one key tuple per request ({self.requests})", len(self.prompts))

    def keys_of(self, req: int) -> tuple[int, ...]:
        if self.prompts:
            return self.prompts[req]
        return tuple(range(req * self.stride, req * self.stride + self.prompt_len))


class Job(NamedTuple):
    store: tuple[int, ...] | None  # keys of the store in flight
    load: tuple[int, ...] | None  # keys of the load in flight
    finished: bool


class OffloadState(NamedTuple):
    manager: ManagerState
    jobs: tuple[Job, ...]
    failures_left: int
    resets_left: int
    fault: tuple[str, str] | None = None  # (invariant, message) a step broke


class OffloadSystem:
    liveness = "every_job_concludes"

    def __init__(self, variant: OffloadVariant = FIXED, config: OffloadSystemConfig = OffloadSystemConfig()) -> None:
        self.name, self.variant, self.cfg = "kv-offload", variant, config
        self.keys = tuple(sorted({k for r in range(config.requests) for k in config.keys_of(r)}))
        self.thawed: Thawed[CPUOffloadingManager] = Thawed()  # the manager the last transition left
        self.invariants = (
            Invariant("capacity_and_free_list", self._capacity, "3.3 item 2: allocation high-water mark and "
                      "LIFO free list partition [0, allocated) with the live slots"),
            Invariant("counters", lambda s: checks.counters(s.manager), "3.3 item 3: evictable and write-pending "
                      "counts equal the ref_cnt census"),
            Invariant("jobs_match_slots", self._jobs, "every write-pending key is in exactly one store job; "
                      "every load in flight pins its keys"),
            Invariant("no_input_key_evicted", _fault("no_input_key_evicted"), "3.3 item 4 (#35846): prepare_store "
                      "never evicts a key it was offered"),
            Invariant("store_semantics", _fault("store_semantics"), "3.3 item 4: distinct free slots co-indexed "
                      "with the keys, idle victims only, None changes no slot"),
            Invariant("load_semantics", _fault("load_semantics"), "3.3 item 5: the keys' slots in key order"),
            Invariant("failed_store_recovers", _fault("failed_store_recovers"), "3.3 item 6: a failed store's "
                      "keys miss, their slots are free, other chunks unchanged"),
        )
        self.sometimes = (
            Sometimes("a_store_completes", lambda s: any(c.ref_cnt >= 0 for c in self._resident(s).values()),
                      "a stored key is ready (complete_store succeeded)"),
            Sometimes("a_cached_key_is_evicted", lambda s, a, t: type(a) is Store and any(
                c.ref_cnt == 0 and k not in self._resident(t) for k, c in self._resident(s).items()),
                "prepare_store evicts a ready key to make room", step=True),
            Sometimes("a_load_hits", lambda s: any(j.load for j in s.jobs),
                      "prepare_load finds a ready prefix and loads it"),
        )

    def _resident(self, s: OffloadState) -> dict:
        """The keys the cache policy holds, with their chunk status (ref_cnt -1: write pending)."""
        return thaw_policy(s.manager.policy, self.cfg.num_chunks).resident()

    # -- the contract ----------------------------------------------------------------------------
    def manager(self, state: ManagerState | None = None) -> CPUOffloadingManager:
        """A manager object of `state` the caller may change (the one the last step left, if it is its state)."""
        cfg = self.cfg
        if state is None:
            return CPUOffloadingManager(cfg.num_chunks, cfg.cache_policy, True, cfg.store_threshold,
                                        cfg.max_tracker_size, self.variant)
        return self.thawed.take(state, lambda: self._thaw(state))

    def _reader(self, state: ManagerState) -> CPUOffloadingManager:
        """A manager object of `state` to read only (lookups): the one the last step left, if it is its state, left
        kept; else a thawed one (the kept one stays for the step it is kept for)."""
        live = self.thawed.peek(state)
        return self._thaw(state) if live is None else live

    def _thaw(self, state: ManagerState) -> CPUOffloadingManager:
        cfg = self.cfg
        return CPUOffloadingManager.thaw(state, cfg.num_chunks, cfg.store_threshold, cfg.max_tracker_size,
                                         self.variant)

    def initial_states(self) -> tuple[OffloadState, ...]:
        jobs = (Job(None, None, False),) * self.cfg.requests
        return (OffloadState(self.manager().freeze(), jobs, self.cfg.store_failures, self.cfg.resets),)

    def done(self, s: OffloadState) -> bool:
        return s.fault is None and all(j.finished for j in s.jobs)

    def ready_prefix(self, m: CPUOffloadingManager, req: int) -> tuple[int, ...]:
        """The keys a load would take: the longest prefix of the request's keys that look up as HIT."""
        out = []
        for key in self.cfg.keys_of(req):
            if m.lookup(key) is not LookupResult.HIT:
                break
            out.append(key)
        return tuple(out)

    def enabled(self, s: OffloadState) -> list[tuple]:
        if s.fault is not None:
            return []
        actions: list[tuple] = []
        m = self._reader(s.manager) if any(not j.finished and j.load is None for j in s.jobs) else None
        for r in range(len(s.jobs)):
            actions.extend(self._enabled_for(s, r, m))
        if self._can_reset(s):
            actions.append(Reset())
        return actions

    @staticmethod
    def _can_reset(s: OffloadState) -> bool:
        """reset_cache: resets left and no transfer in flight (a state with a fault enables nothing at all)."""
        return bool(s.resets_left) and all(j.store is None and j.load is None for j in s.jobs)

    def allows(self, s: OffloadState, a: tuple) -> bool:
        """`a in self.enabled(s)`, answered from the rule of `a`'s record type (`RULES`)."""
        return RULES.allows(self, s, a)

    def enabled_for(self, s: OffloadState, r: int) -> list[tuple]:
        """The enabled actions of request r alone (a timing policy asks this, not the whole list)."""
        return [] if s.fault is not None else self._enabled_for(s, r, None)

    def _enabled_for(self, s: OffloadState, r: int, m: CPUOffloadingManager | None) -> list[tuple]:
        actions: list[tuple] = []
        job = s.jobs[r]
        if job.store is not None:
            actions.append(CompleteStore(r, True))
            if s.failures_left:
                actions.append(CompleteStore(r, False))
        if job.load is not None:
            actions.append(CompleteLoad(r))
        if job.finished:
            return actions
        if job.store is None:
            actions.append(Store(r))
        if job.load is None:
            m = m or self._reader(s.manager)
            if self.ready_prefix(m, r):
                actions.append(Load(r))
        actions.append(Touch(r))
        if job.store is None and job.load is None:
            actions.append(Finish(r))
        return actions

    def step(self, s: OffloadState, action: tuple) -> OffloadState:
        return self.transition(s, action)[0]

    def transition(self, s: OffloadState, action: tuple) -> tuple[OffloadState, tuple[tuple, ...]]:
        m = self.manager(s.manager)
        effect, action = RULES.effect(action)
        jobs = list(s.jobs)
        effects: list[tuple] = []
        ch: dict[str, object] = {}  # what the rule changes besides the manager and the jobs: fault, budgets
        effect(self, s, action, m, jobs, effects, ch)
        events = m.take_events()
        if events:
            effects.append(Events(events))
        stats = m.get_stats()
        effects.append(Stats(stats["gauges"][CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC],
                             stats["histograms"][CPUOffloadingMetrics.CPU_ALLOCATION_SIZE],
                             stats["counters"].get(CPUOffloadingMetrics.STORES_SKIPPED, 0)))
        if type(action) is Finish:  # a finished request acts no more: the scheduler drops its context
            m.forget_request(action.req)
        frozen = m.freeze()
        if frozen.counts is not None:  # counts above the threshold behave alike (see the module doc)
            cap = self.cfg.store_threshold
            frozen = frozen._replace(counts=tuple((k, min(c, cap)) for k, c in frozen.counts))
        else:
            self.thawed.keep(frozen, m)  # `m` is exactly `frozen`: the next step from this state reuses it
        return OffloadState(frozen, tuple(jobs), ch.get("failures_left", s.failures_left),
                            ch.get("resets_left", s.resets_left), ch.get("fault")), tuple(effects)

    # -- invariants ------------------------------------------------------------------------------
    def _capacity(self, s: OffloadState) -> str | None:
        return checks.capacity_and_free_list(s.manager, self.cfg.num_chunks)

    def _jobs(self, s: OffloadState) -> str | None:
        slots = checks.resident(s.manager)
        pending = sorted(k for k, (ref, _) in slots.items() if ref == -1)
        stored = sorted(k for j in s.jobs if j.store is not None for k in j.store)
        if stored != pending:
            return f"write-pending keys: expected exactly the store jobs' keys {stored}, got {pending}"
        for key, (ref, _) in slots.items():
            loads = sum(j.load.count(key) for j in s.jobs if j.load is not None)
            if ref >= 0 and ref != loads:
                return f"key {key}: expected ref_cnt {loads} (loads in flight), got {ref}"
        return None


def _first(*found: tuple[str, str | None]) -> tuple[str, str] | None:
    for name, message in found:
        if message is not None:
            return name, message
    return None


def _fault(name: str):
    def check(s: OffloadState) -> str | None:
        return s.fault[1] if s.fault is not None and s.fault[0] == name else None
    check.__name__ = name
    return check


# -- the rules: each action's precondition beside its effect, by record type ----------------------------------
# An effect is `effect(system, state, action, manager, jobs, effects, ch)`: it acts on the live manager and the
# jobs list, appends what it did to `effects` and writes into `ch` the fault it found and the budgets it spent.
# A precondition is `when(system, state, action)`: a request's action is enabled when `enabled_for` lists it
# (one request's conditions, written once there), a reset by `_can_reset`.
RULES = Rules()


def _request_action(self: OffloadSystem, s: OffloadState, a: tuple) -> bool:
    return a in self.enabled_for(s, a.req)


@RULES.rule(Store, when=_request_action)
def _store(self: OffloadSystem, s: OffloadState, a: Store, m: CPUOffloadingManager, jobs: list,
           fx: list, ch: dict) -> None:
    r = a.req
    keys = self.cfg.keys_of(r)
    out = m.prepare_store(keys, r)
    after = m.freeze()
    ch["fault"] = _first(("no_input_key_evicted", checks.no_input_key_evicted(keys, out)),
                         ("store_semantics", checks.store_semantics(s.manager, after, keys, out)))
    if out is None:
        fx.append(StoreRefused(r, keys))
    elif not out.keys_to_store:
        fx.append(NothingToStore(r))
    else:
        jobs[r] = jobs[r]._replace(store=out.keys_to_store)
        fx.append(Stored(r, out.keys_to_store, out.chunk_ids, out.evicted_keys))


@RULES.rule(CompleteStore, when=_request_action)
def _complete_store(self: OffloadSystem, s: OffloadState, a: CompleteStore, m: CPUOffloadingManager, jobs: list,
                    fx: list, ch: dict) -> None:
    r, success = a.req, a.success
    keys = jobs[r].store
    m.complete_store(keys, success)
    jobs[r] = jobs[r]._replace(store=None)
    if not success:
        ch["failures_left"] = s.failures_left - 1
        ch["fault"] = _first(("failed_store_recovers", checks.failed_store_recovers(s.manager, m.freeze(), keys)))


@RULES.rule(Load, when=_request_action)
def _load(self: OffloadSystem, s: OffloadState, a: Load, m: CPUOffloadingManager, jobs: list,
          fx: list, ch: dict) -> None:
    r = a.req
    keys = self.ready_prefix(m, r)
    ids = m.prepare_load(keys, r)
    ch["fault"] = _first(("load_semantics", checks.load_semantics(s.manager, keys, ids)))
    jobs[r] = jobs[r]._replace(load=keys)
    fx.append(Loaded(r, keys, ids))


@RULES.rule(CompleteLoad, when=_request_action)
def _complete_load(self: OffloadSystem, s: OffloadState, a: CompleteLoad, m: CPUOffloadingManager, jobs: list,
                   fx: list, ch: dict) -> None:
    m.complete_load(jobs[a.req].load)
    jobs[a.req] = jobs[a.req]._replace(load=None)


@RULES.rule(Touch, when=_request_action)
def _touch(self: OffloadSystem, s: OffloadState, a: Touch, m: CPUOffloadingManager, jobs: list,
           fx: list, ch: dict) -> None:
    m.touch(self.cfg.keys_of(a.req))


@RULES.rule(Finish, when=_request_action)
def _finish(self: OffloadSystem, s: OffloadState, a: Finish, m: CPUOffloadingManager, jobs: list, fx: list,
            ch: dict) -> None:
    m.on_request_finished(a.req)
    jobs[a.req] = jobs[a.req]._replace(finished=True)


@RULES.rule(Reset, when=lambda self, s, a: s.fault is None and self._can_reset(s))
def _reset(self: OffloadSystem, s: OffloadState, a: Reset, m: CPUOffloadingManager, jobs: list,
           fx: list, ch: dict) -> None:
    m.reset_cache()
    ch["resets_left"] = s.resets_left - 1
