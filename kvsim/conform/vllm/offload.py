"""vLLM's CPU offloading manager (`vllm/v1/kv_offload/cpu/manager.py`) against the `kv-offload` model.

Two targets:

* `CPUOffloadingManager`: the release's manager (with the LRU and with the ARC policy) and the model's,
  driven in lockstep by one Hypothesis state machine over several requests: prepare_store,
  complete_store (success or failure), prepare_load, complete_load, touch, lookup,
  on_request_finished, reset_cache, take_events and get_stats. After every step every observable
  is compared: the return value, the pending events in order, the pool counters and the free list,
  each key's (ref_cnt, slot), the policy's order (LRU recency; ARC T1, T2, B1, B2 and the target),
  the store-threshold tracker and the batch's allocation sizes and skipped stores. The model states
  0.33.0; a release without the request-scoped cache access (0.30.0 and before) is skipped with a
  note (the `offload_rename` target covers those).
* `offload_rename`: the #52615 rename on the real code. The release given (new names: 0.30.0, the first
  with them) and vLLM 0.29.0 (the last with the old names, fetched like any release) run the same
  operation sequences (store_threshold 1, LRU and ARC), each read through its naming
  (`kvsim.models.kv_offload.names`), and their traces are compared; two directed programs show the two
  behaviour changes 0.30.0 made beside the rename (the ARC T1 fallback, the admission tracker keeping
  the offer's own keys). A release with the request-scoped access (0.31.0+) is skipped with a note:
  its LRU is a different structure, not the rename's neighbour.

Settled: vLLM 0.31.0 (request-scoped access, no metadata-only release event on a failed store) diverges
from the model at the first failed store's event list; the model states 0.33.0, which emits
`OffloadingEvent(keys, removed=True, metadata_only=True)` there (`take_events` drops keys a retry owns).
Observation (not compared): keys repeated within one `prepare_store` call get two slots upstream and in
the model alike; the first is leaked and its write-pending count never drops (the scheduler passes
distinct keys, so the harness draws distinct keys).

Conventions: keys are `make_offload_key(str(i).encode(), 0)` (upstream's own function) for small
integers i, distinct within one call (the scheduler's contract); request contexts are upstream's
`ReqContext` with no recorded key positions (so LRU ranks are the order of assignment); the policy
factory is a stand-in returning the loaded LRU and ARC classes; `OffloadingConnectorStats` is a
stand-in recording `set_gauge` / `observe_histogram` / `increase_counter` calls in order; loads and
completions are drawn from what the model says is ready or pinned (upstream asserts otherwise).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from kvsim.engine.errors import ConfigError
from kvsim.models.kv_offload.manager import CPUOffloadingManager
from kvsim.models.kv_offload.names import NEW_NAMES, OLD_NAMES, Naming
from kvsim.models.kv_offload.status import CPUOffloadingMetrics as M

from ..loader import load_definitions, names_in
from ..source import EngineSource, resolve_source
from ..targets import RunOptions, Target, TargetResult

RELPATH = "vllm/v1/kv_offload/cpu/manager.py"
POLICIES = "vllm/v1/kv_offload/cpu/policies/"
BASE = "vllm/v1/kv_offload/base.py"
OLD_RELEASE = "0.29.0"  # the last vLLM release before #52615 (0.30.0 is the first with the new names)
KEYS = 6  # keys 0..5
MAX_REQUESTS = 3  # requests active at once


class StatsStandIn:
    """`OffloadingConnectorStats`: the calls `get_stats` makes, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_gauge(self, name: str, value: float) -> None:
        self.calls.append(("gauge", name, value))

    def observe_histogram(self, name: str, value: float) -> None:
        self.calls.append(("histogram", name, value))

    def increase_counter(self, name: str, value: int) -> None:
        self.calls.append(("counter", name, value))


@dataclass
class Upstream:
    manager: type
    req_context: type
    make_key: Callable[[bytes, int], bytes]
    naming: Naming
    request_scoped: bool  # the 0.31.0+ request-scoped cache access (`_RequestCacheAccess`)


def load(source: EngineSource) -> Upstream:
    base_names = names_in(source.file(POLICIES + "base.py"), imports=False)
    naming = NEW_NAMES if "ChunkStatus" in base_names else OLD_NAMES
    wanted = [n for n in (naming.status_class, "CachePolicy", "order_request_keys") if n in base_names]
    base = load_definitions(source.file(POLICIES + "base.py"), wanted, where=POLICIES + "base.py",
                            version=source.label)
    mods: dict[str, Any] = {"vllm.v1.kv_offload.cpu.policies.base": base}
    lru = load_definitions(source.file(POLICIES + "lru.py"), ["LRUCachePolicy"], where=POLICIES + "lru.py",
                           version=source.label, modules=mods).LRUCachePolicy
    arc = load_definitions(source.file(POLICIES + "arc.py"), ["ARCCachePolicy"], where=POLICIES + "arc.py",
                           version=source.label, modules=mods).ARCCachePolicy
    table = {"lru": lru, "arc": arc}

    class CachePolicyFactory:
        @staticmethod
        def get_cache_policy_cls(name: str, module_path: str | None = None) -> type:
            return table[name]

    mods["vllm.v1.kv_offload.cpu.policies.factory"] = SimpleNamespace(CachePolicyFactory=CachePolicyFactory)
    mods["vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics"] = SimpleNamespace(
        OffloadingConnectorStats=StatsStandIn)
    manager = load_definitions(source.file(RELPATH), ["CPUOffloadingManager"], where=RELPATH, version=source.label,
                               modules=mods).CPUOffloadingManager
    glue = load_definitions(source.file(BASE), ["ReqContext", "make_offload_key"], where=BASE, version=source.label)
    scoped = "_RequestCacheAccess" in names_in(source.file(RELPATH), imports=False)
    return Upstream(manager, glue.ReqContext, glue.make_offload_key, naming, scoped)


# -- one side of a lockstep: an upstream manager, or the model -------------------------------------

class UpstreamSide:
    def __init__(self, up: Upstream, policy: str, capacity: int, threshold: int, tracker: int) -> None:
        self.up, self.n = up, up.naming
        self.m = up.manager(**{self.n.capacity_arg: capacity}, cache_policy=policy, enable_events=True,
                            store_threshold=threshold, max_tracker_size=tracker)
        self.keys = [up.make_key(str(i).encode(), 0) for i in range(KEYS)]
        self.key_of = {k: i for i, k in enumerate(self.keys)}
        self.contexts: dict[int, Any] = {}

    def ctx(self, req: int) -> Any:
        if req not in self.contexts:
            self.contexts[req] = self.up.req_context(req_id=f"req-{req}")
        return self.contexts[req]

    def ks(self, keys: list[int]) -> list[bytes]:
        return [self.keys[k] for k in keys]

    def ints(self, keys: Any) -> list[int]:
        return [self.key_of[k] for k in keys]

    def call(self, op: str, args: tuple) -> Any:
        m, n = self.m, self.n
        if op == "prepare_store":
            keys, req = args
            out = m.prepare_store(self.ks(keys), self.ctx(req))
            if out is None:
                return None
            return (self.ints(out.keys_to_store), [int(x) for x in getattr(out.store_spec, n.spec_ids)],
                    self.ints(out.evicted_keys))
        if op == "complete_store":
            keys, req, success = args
            return m.complete_store(self.ks(keys), self.ctx(req), success=success)
        if op == "prepare_load":
            keys, req = args
            return [int(x) for x in getattr(m.prepare_load(self.ks(keys), self.ctx(req)), n.spec_ids)]
        if op == "complete_load":
            keys, req = args
            return m.complete_load(self.ks(keys), self.ctx(req))
        if op == "touch":
            keys, req = args
            return m.touch(self.ks(keys), self.ctx(req))
        if op == "lookup":
            key, req = args
            result = m.lookup(self.keys[key], self.ctx(req))
            return getattr(result, "name", result)
        if op == "on_request_finished":
            (req,) = args
            return m.on_request_finished(self.ctx(req))
        if op == "reset_cache":
            return m.reset_cache()
        if op == "take_events":
            return [self.event(e) for e in m.take_events()]
        if op == "get_stats":
            return m.get_stats().calls
        raise ValueError(op)

    def event(self, e: Any) -> tuple:
        return (self.ints(e.keys), e.removed, getattr(e, "metadata_only", False))

    def observe(self) -> dict[str, Any]:
        m, n = self.m, self.n
        policy = m._policy
        slots = {}
        for i, key in enumerate(self.keys):
            chunk = policy.get(key)
            if chunk is not None:
                slots[i] = (chunk.ref_cnt, getattr(chunk, n.status_id))
        if hasattr(policy, "t1"):
            order: Any = {"t1": self.ints(policy.t1), "t2": self.ints(policy.t2), "b1": self.ints(policy.b1),
                          "b2": self.ints(policy.b2), "target": policy.target_t1_size}
        elif hasattr(policy, "_ranks"):
            order = {"recency": self.ints(sorted(policy._ranks, key=policy._ranks.__getitem__))}
        else:  # 0.30.0 and before: an ordered map of the evictable keys
            order = {"evictable": self.ints(getattr(policy, "evictable_" + n.lru_chunks))}
        return {"events": [self.event(e) for e in (m.events or [])], "allocated": getattr(m, n.num_allocated),
                "free_list": list(m._free_list), "evictable": getattr(m, n.num_evictable),
                "write_pending": getattr(m, n.num_write_pending), "free": getattr(m, n.get_num_free)(),
                "slots": slots, "policy": order,
                "tracker": None if m.counts is None else [(self.key_of[k], c) for k, c in m.counts.items()],
                "allocation_sizes": list(m.allocation_sizes_in_current_batch),
                "stores_skipped": m.stores_skipped_in_current_batch}


class ModelSide:
    def __init__(self, policy: str, capacity: int, threshold: int, tracker: int) -> None:
        self.m = CPUOffloadingManager(capacity, policy, True, threshold, tracker)

    def call(self, op: str, args: tuple) -> Any:
        m = self.m
        if op == "prepare_store":
            out = m.prepare_store(*args)
            return None if out is None else (list(out.keys_to_store), list(out.chunk_ids), list(out.evicted_keys))
        if op == "complete_store":
            keys, _req, success = args
            return m.complete_store(keys, success)
        if op == "prepare_load":
            return list(m.prepare_load(*args))
        if op in ("complete_load", "touch"):
            return getattr(m, op)(args[0])
        if op == "lookup":
            return m.lookup(args[0]).value
        if op == "on_request_finished":
            return m.on_request_finished(args[0])
        if op == "reset_cache":
            return m.reset_cache()
        if op == "take_events":
            return [(list(e.keys), e.removed, e.metadata_only) for e in m.take_events()]
        if op == "get_stats":
            return stats_calls(m.get_stats())
        raise ValueError(op)

    def observe(self) -> dict[str, Any]:
        m = self.m
        policy = m._policy
        slots = {k: (c.ref_cnt, c.chunk_id) for k, c in sorted(m.resident().items())}
        if hasattr(policy, "t1"):
            order: Any = {"t1": list(policy.t1), "t2": list(policy.t2), "b1": list(policy.b1), "b2": list(policy.b2),
                          "target": policy.target_t1_size}
        else:
            order = {"recency": list(policy.chunks)}
        return {"events": [(list(e.keys), e.removed, e.metadata_only) for e in m.events or []],
                "allocated": m._num_allocated_chunks, "free_list": list(m._free_list),
                "evictable": m._num_evictable_cache_chunks, "write_pending": m._num_write_pending_chunks,
                "free": m._get_num_free_chunks(), "slots": slots, "policy": order,
                "tracker": None if m.counts is None else list(m.counts.items()),
                "allocation_sizes": list(m.allocation_sizes_in_current_batch),
                "stores_skipped": m.stores_skipped_in_current_batch}


def stats_calls(stats: dict[str, Any]) -> list[tuple]:
    """The model's `get_stats` as the calls upstream makes, in upstream's order."""
    g = stats["gauges"]
    calls = [("gauge", M.CPU_CACHE_USAGE_PERC, g[M.CPU_CACHE_USAGE_PERC])]
    calls += [("histogram", M.CPU_ALLOCATION_SIZE, v) for v in stats["histograms"][M.CPU_ALLOCATION_SIZE]]
    calls += [("gauge", M.CPU_CACHE_WRITE_USAGE_PERC, g[M.CPU_CACHE_WRITE_USAGE_PERC]),
              ("gauge", M.CPU_CACHE_READ_USAGE_PERC, g[M.CPU_CACHE_READ_USAGE_PERC])]
    calls += [("counter", name, v) for name, v in stats["counters"].items()]
    return calls


class Divergence(AssertionError):
    pass


def run_machine(make_sides: Callable[[str, int, int, int], tuple[Any, Any]], policies: tuple[str, ...],
                options: RunOptions, result: TargetResult, steps: int = 50,
                thresholds: tuple[int, ...] = (1, 1, 2)) -> list[str]:
    """Drive two sides (`make_sides(policy, capacity, threshold, tracker)` -> (a, b)) in lockstep; the program
    of the shrunk divergence, if any (the message goes into `result`)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

    program: list[str] = []
    keys_st = st.lists(st.integers(0, KEYS - 1), unique=True, min_size=1, max_size=4)

    class Lockstep(RuleBasedStateMachine):
        @initialize(policy=st.sampled_from(policies), capacity=st.sampled_from((2, 3, 1, 4, 0, 5)),
                    threshold=st.sampled_from(thresholds),
                    tracker=st.integers(1, 6))
        def start(self, policy: str, capacity: int, threshold: int, tracker: int) -> None:
            program.clear()
            program.append(f"CPUOffloadingManager({capacity}, {policy!r}, store_threshold={threshold}, "
                           f"max_tracker_size={tracker})")
            self.a, self.b = make_sides(policy, capacity, threshold, tracker)
            self.model = CPUOffloadingManager(capacity, policy, True, threshold, tracker)  # what is ready, pinned
            self.active = list(range(MAX_REQUESTS))
            self.next_req = MAX_REQUESTS
            self.step("observe", ())

        def step(self, op: str, args: tuple) -> None:
            if op != "observe":
                program.append(f"{op}{args!r}")
                ra, rb = self.a.call(op, args), self.b.call(op, args)
                self.shadow(op, args)
            else:
                ra = rb = None
            oa, ob = self.a.observe(), self.b.observe()
            result.compared += 1
            if ra != rb or oa != ob:
                diff = {k: (oa[k], ob[k]) for k in oa if oa[k] != ob.get(k)}
                raise Divergence(f"after {'; '.join(program)}: returned {ra!r} vs {rb!r}; observations differ in "
                                 f"{diff}")

        def shadow(self, op: str, args: tuple) -> None:
            """The state the harness draws from (which keys are ready or pinned)."""
            m = self.model
            if op == "prepare_store":
                m.prepare_store(*args)
            elif op == "complete_store":
                m.complete_store(args[0], args[2])
            elif op == "prepare_load":
                m.prepare_load(*args)
            elif op in ("complete_load", "touch"):
                getattr(m, op)(args[0])
            elif op == "on_request_finished":
                m.on_request_finished(args[0])
            elif op in ("reset_cache", "take_events", "get_stats"):
                getattr(m, op)()

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), keys=keys_st)
        def prepare_store(self, pick: int, keys: list[int]) -> None:
            self.step("prepare_store", (keys, self.active[pick]))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), keys=keys_st)
        def store_and_complete(self, pick: int, keys: list[int]) -> None:
            """A store whose transfer completes at once (so chunks turn idle and later stores evict)."""
            req = self.active[pick]
            self.step("prepare_store", (keys, req))
            pending = [k for k in keys if (c := self.model.resident().get(k)) is not None and c.ref_cnt == -1]
            if pending:
                self.step("complete_store", (pending, req, True))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), mask=st.lists(st.booleans(), min_size=KEYS, max_size=KEYS),
              extra=st.one_of(st.none(), st.integers(0, KEYS - 1)), success=st.booleans())
        def complete_store(self, pick: int, mask: list[bool], extra: int | None, success: bool) -> None:
            """A subset of the write-pending keys (all of them if the mask picks none), maybe one more key."""
            pending = sorted(k for k, c in self.model.resident().items() if c.ref_cnt == -1)
            keys = [k for k in pending if mask[k]] or pending
            if extra is not None and extra not in keys:
                keys.append(extra)
            if keys:
                self.step("complete_store", (keys, self.active[pick], success))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), data=st.data())
        def prepare_load(self, pick: int, data: Any) -> None:
            ready = sorted(k for k, c in self.model.resident().items() if c.ref_cnt >= 0)
            if ready:
                keys = data.draw(st.permutations(ready).flatmap(lambda p: st.integers(1, len(p)).map(lambda n: p[:n])))
                self.step("prepare_load", (list(keys), self.active[pick]))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), data=st.data())
        def complete_load(self, pick: int, data: Any) -> None:
            pinned = sorted(k for k, c in self.model.resident().items() if c.ref_cnt > 0)
            if pinned:
                keys = data.draw(st.lists(st.sampled_from(pinned), unique=True, min_size=1))
                self.step("complete_load", (keys, self.active[pick]))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), keys=keys_st)
        def touch(self, pick: int, keys: list[int]) -> None:
            self.step("touch", (keys, self.active[pick]))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1), key=st.integers(0, KEYS - 1))
        def lookup(self, pick: int, key: int) -> None:
            self.step("lookup", (key, self.active[pick]))

        @rule(pick=st.integers(0, MAX_REQUESTS - 1))
        def on_request_finished(self, pick: int) -> None:
            req = self.active[pick]
            self.step("on_request_finished", (req,))
            self.active[pick] = self.next_req  # a finished request sees no more keys (upstream asserts)
            self.next_req += 1

        @precondition(lambda self: not any(c.ref_cnt > 0 for c in self.model.resident().values()))
        @rule(roll=st.integers(0, 9))
        def reset_cache(self, roll: int) -> None:  # the scheduler flushes in-flight loads before a reset
            if roll == 0:  # rare: a reset empties the cache the other rules work on
                self.step("reset_cache", ())

        @rule()
        def take_events(self) -> None:
            self.step("take_events", ())

        @rule()
        def get_stats(self) -> None:
            self.step("get_stats", ())

    budget = settings(max_examples=options.max_examples, stateful_step_count=steps, database=None, deadline=None,
                      derandomize=options.seed is None, suppress_health_check=list(HealthCheck),
                      phases=(Phase.explicit, Phase.generate, Phase.shrink))
    try:
        run_state_machine_as_test(Lockstep, settings=budget)  # --seed: random generation, not derandomized
    except Divergence as exc:
        result.diverge({"program": list(program)}, "see message", "see message", str(exc))
    return list(program)


def run_lockstep(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    up = load(source)
    result = TargetResult("CPUOffloadingManager", source.version)
    if not up.request_scoped:
        result.status = "skipped"
        result.note = (f"{source.label} predates the request-scoped cache access (vLLM 0.31.0); the model states "
                       f"0.33.0: see the offload_rename target for this release")
        return result.finish(started)

    def sides(policy: str, capacity: int, threshold: int, tracker: int) -> tuple[Any, Any]:
        return UpstreamSide(up, policy, capacity, threshold, tracker), ModelSide(policy, capacity, threshold, tracker)

    run_machine(sides, ("lru", "arc"), options, result)
    result.note = f"names: {up.naming.label}; {result.compared} steps compared (LRU and ARC)"
    return result.finish(started)


# Directed programs for the two behaviour changes 0.30.0 made beside the rename (the random lockstep
# reaches the first rarely): each must give a different trace on 0.29.0 and on a release after it.
ARC_T1_FALLBACK = (  # ARC: T1 below the target and no idle key in T2: 0.29.0 gives up (None), 0.30.0 takes T1
    ("arc", 3, 1), ("prepare_store", ([0, 1, 2], 0)), ("complete_store", ([0, 1, 2], 0, True)),
    ("prepare_store", ([3], 0)), ("complete_store", ([3], 0, True)), ("prepare_store", ([4], 0)),
    ("complete_store", ([4], 0, True)), ("touch", ([0, 1], 0)), ("touch", ([3, 4], 0)),
    ("prepare_load", ([3, 4], 0)), ("prepare_store", ([5], 0)))
TRACKER_KEEPS_OFFER = (  # store_threshold 2, tracker of 1: 0.29.0 evicts the offer's own key, 0.30.0 keeps it
    ("lru", 0, 2, 1), ("prepare_store", ([0, 1], 0)))
BESIDE_THE_RENAME = {"ARC evict falls back to T1 when T2 has no idle key": ARC_T1_FALLBACK,
                     "the admission tracker no longer evicts the offer's own keys": TRACKER_KEEPS_OFFER}


def run_program(a: Any, b: Any, ops: tuple) -> str | None:
    """Step two sides through `ops`; the first difference (None: the traces are equal)."""
    for op, args in ops:
        ra, rb = a.call(op, args), b.call(op, args)
        oa, ob = a.observe(), b.observe()
        if ra != rb or oa != ob:
            return f"at {op}{args!r}: returned {ra!r} vs {rb!r}, observations differ in " \
                   f"{sorted(k for k in oa if oa[k] != ob.get(k))}"
    return None


def run_rename(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    new = load(source)
    result = TargetResult("offload_rename", source.version)
    if new.naming is not NEW_NAMES:
        result.status = "skipped"
        result.note = f"{source.label} has the old names (before #52615): compare a release with the new names"
        return result.finish(started)
    if new.request_scoped:
        result.status = "skipped"
        result.note = (f"{source.label} has the request-scoped cache access and the rank-ordered LRU (0.31.0 and "
                       f"later): not the rename's neighbour; compare --version 0.30.0, the first release with the new "
                       f"names, against {OLD_RELEASE}")
        return result.finish(started)
    try:
        old = load(resolve_source("vllm", version=OLD_RELEASE))
    except ConfigError as exc:
        result.status = "skipped"
        result.note = f"vLLM {OLD_RELEASE} (the old names) is not available: {exc}"
        return result.finish(started)

    def sides(policy: str, capacity: int, threshold: int, tracker: int) -> tuple[Any, Any]:
        return (UpstreamSide(old, policy, capacity, threshold, tracker),
                UpstreamSide(new, policy, capacity, threshold, tracker))

    run_machine(sides, ("lru", "arc"), options, result, thresholds=(1,))
    beside = []
    for what, program in BESIDE_THE_RENAME.items():
        policy, capacity, threshold, *tracker = program[0]
        differs = run_program(*sides(policy, capacity, threshold, tracker[0] if tracker else 64_000), program[1:])
        beside.append(f"{what}: {'differs ' + differs if differs else 'same trace'}")
    result.note = (f"vLLM {OLD_RELEASE} ({old.naming.label}) vs {source.label} ({new.naming.label}), "
                   f"store_threshold 1; behaviour changes beside the rename: " + "; ".join(beside))
    return result.finish(started)


TARGETS = (
    Target("vllm", "CPUOffloadingManager", RELPATH, ("CPUOffloadingManager",),
           "kv-offload", "the manager (LRU and ARC) in lockstep with the model, one Hypothesis state machine; every "
           "return value, the events, counters, slots and policy order after every step", run_lockstep),
    Target("vllm", "offload_rename", RELPATH, ("CPUOffloadingManager",), "kv-offload",
           f"the #52615 rename: this release (new names) and vLLM {OLD_RELEASE} (old names) in lockstep, each "
           "read through its naming", run_rename),
)
