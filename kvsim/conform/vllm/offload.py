"""vLLM's CPU offloading manager (`vllm/v1/kv_offload/cpu/manager.py`) against the `kv-offload` model.

Two Locksteps:

* `MANAGER` (`CPUOffloadingManager`): the release's manager (with the LRU and with the ARC policy) and the
  model's, driven by one state machine over several requests: prepare_store, a store whose transfer completes at
  once, complete_store (success or failure, some write-pending keys and maybe one more), prepare_load,
  complete_load, touch, lookup, on_request_finished, reset_cache, take_events and get_stats. After every step
  every observable is compared: the return value, the pending events in order, the pool counters and the free
  list, each key's (ref_cnt, slot), the policy's order (LRU recency; ARC T1, T2, B1, B2 and the target), the
  store-threshold tracker and the batch's allocation sizes and skipped stores. Probes run directed programs (the
  model's trace and the release's must be equal) on paths random programs reach rarely: the ARC T1 fallback, B2
  ghost hits lowering the target, two evictions from a T1 one above the target, a write-pending key in T2, a
  reused key evicted before its request finishes, the offer's own idle keys passed over by eviction, a key a
  request only saw, LRU's heap (a repinned, a pinned and an outgrown one), the order of one call's keys, failed
  stores with events on and off, a full tracker, a request finished after a reset, and three with recorded key
  positions (one request's keys evicted tail first, a request's access raising an older key to its rank, ARC
  finishing a request in position order, a request's rank taken anew after a reset). The model states 0.33.0;
  a release without the request-scoped cache access (0.30.0 and before) is skipped with a note (the
  `offload_rename` target covers those).
* `RENAME` (`offload_rename`, both sides code under test): the #52615 rename on the real code. The release given
  (new names: 0.30.0, the first with them) and vLLM 0.29.0 (the last with the old names, fetched like any release,
  loaded without the mutant of a `--mutants` run) run the same programs (store_threshold 1, LRU and ARC), each
  read through its naming (`kvsim.models.kv_offload.names`: #52615 renamed OffloadPolicy's `block_level` value
  too); the loads and completions are drawn from the keys the new release holds ready or pinned (the model, which
  states 0.33.0, need not agree with those releases). Two probes run the directed programs of the two behaviour changes 0.30.0 made beside the rename (the
  ARC T1 fallback, the admission tracker keeping the offer's own keys): each must give different traces on the
  two releases. A release with the request-scoped access (0.31.0+) is skipped with a note: its LRU is a
  different structure, not the rename's neighbour.

Settled: vLLM 0.31.0 (request-scoped access, no metadata-only release event on a failed store) diverges
from the model at the first failed store's event list; the model states 0.33.0, which emits
`OffloadingEvent(keys, removed=True, metadata_only=True)` there (`take_events` drops keys a retry owns).
Observation (not compared): keys repeated within one `prepare_store` call get two slots upstream and in
the model alike; the first is leaked and its write-pending count never drops. Not reachable from vLLM
0.33.0's scheduler (settled by reading `offloading/scheduler.py`, not by a run): its three calls pass one key
(the CoW hand-off), one boundary key per KV cache group (`_make_boundary_key`: the group index is in the key),
or the new chunk keys of one request, each (group, chunk) pair once, a chunk's hash chained over its own prefix
length (`make_offload_key(hash, group_idx)`): keys of one call are distinct short of a hash collision. So the
harness draws distinct keys, as the scheduler's contract, and the leak is no finding.

Conventions: keys are `make_offload_key(str(i).encode(), 0)` (upstream's own function) for small
integers i, distinct within one call (the scheduler's contract); request contexts are upstream's
`ReqContext`. Where the release's LRU ranks by position (0.33.0's `_RequestRank`) a program's configuration
draws key positions (issue 30) as vLLM 0.33.0's scheduler records them: every key gets its end token (a
drawn order of 16, 32, ..., 96: a key's position is its own in every request, its hash chaining over its
prefix), set on a request's context before its first call, in every request or (`mixed`) in the even ones
only (the odd ones record none, as a context the scheduler makes only to finish a request); or none at all
(LRU ranks are then the order of assignment). 0.31.0 and 0.32.0 record positions but their LRU does not
read them, so none are drawn there. The policy
factory is a stand-in returning the loaded LRU and ARC classes; `OffloadingConnectorStats` is a
stand-in recording `set_gauge` / `observe_histogram` / `increase_counter` calls in order; loads and
completions are drawn from what the model says is ready or pinned (upstream asserts otherwise); a store that
completes at once completes the call's keys each side holds write-pending.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Lockstep, Operation, Probe, sampled, strategy_of
from kvsim.engine.errors import ConfigError
from kvsim.models.kv_offload.manager import CPUOffloadingManager
from kvsim.models.kv_offload.names import NEW_NAMES, OLD_NAMES, Naming
from kvsim.models.kv_offload.status import CPUOffloadingMetrics as M

from ..loader import load_definitions, mutated, names_in

RELPATH = "vllm/v1/kv_offload/cpu/manager.py"
POLICIES = "vllm/v1/kv_offload/cpu/policies/"
LRU, ARC = POLICIES + "lru.py", POLICIES + "arc.py"
BASE = "vllm/v1/kv_offload/base.py"
OLD_RELEASE = "0.29.0"  # the last vLLM release before #52615 (0.30.0 is the first with the new names)
KEYS = 6  # keys 0..5
CHUNK_TOKENS = 16  # tokens per chunk: key positions are end tokens, multiples of it
MAX_REQUESTS = 3  # requests active at once
STEPS = 80  # calls per program: ARC's ghost lists, its T1 fallback and its trimming need long ones
RENAME_STEPS = 50  # two releases of the same structure: shorter programs reach their code


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


def manager_modules(lru: type, arc: type) -> dict[str, Any]:
    """The engine modules the manager imports that kvsim stands in for: the policy factory (the loaded LRU and
    ARC classes by name) and the connector's stats."""
    table = {"lru": lru, "arc": arc}

    class CachePolicyFactory:
        @staticmethod
        def get_cache_policy_cls(name: str, module_path: str | None = None) -> type:
            return table[name]

    return {"vllm.v1.kv_offload.cpu.policies.factory": SimpleNamespace(CachePolicyFactory=CachePolicyFactory),
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics": SimpleNamespace(
                OffloadingConnectorStats=StatsStandIn)}


def loading(upstream: Any, up: SimpleNamespace) -> dict[str, Any]:
    return {"modules": manager_modules(up.LRUCachePolicy, up.ARCCachePolicy)} if upstream.file == RELPATH else {}


@dataclass
class Upstream:
    manager: type
    req_context: type
    make_key: Callable[[bytes, int], bytes]
    naming: Naming
    request_scoped: bool  # the 0.31.0+ request-scoped cache access (`_RequestCacheAccess`)
    positional: bool = False  # 0.33.0's position-aware LRU (`_RequestRank`, `on_request_access`)


def naming_of(source: Any) -> Naming:
    return NEW_NAMES if "ChunkStatus" in names_in(source.file(POLICIES + "base.py"), imports=False) else OLD_NAMES


def upstream_of(ctx: Context) -> Upstream:
    """The release's manager as loaded by the declaration (read once per run)."""
    if "up" not in ctx.state:
        up = ctx.up
        ctx.state["up"] = Upstream(up.CPUOffloadingManager, up.ReqContext, up.make_offload_key, naming_of(ctx.source),
                                   "_RequestCacheAccess" in names_in(ctx.source.file(RELPATH), imports=False),
                                   "_RequestRank" in names_in(ctx.source.file(LRU), imports=False))
    return ctx.state["up"]


def load_release(source: Any) -> Upstream:
    """Another release's manager (the rename's old side), loaded as the declaration loads this one's."""
    def load(relpath: str, names: list[str], **kw: Any) -> SimpleNamespace:
        return load_definitions(source.file(relpath), names, where=relpath, version=source.label, **kw)

    with mutated(None):  # a --mutants run mutates the release under test, not this one
        lru, arc = load(LRU, ["LRUCachePolicy"]).LRUCachePolicy, load(ARC, ["ARCCachePolicy"]).ARCCachePolicy
        manager = load(RELPATH, ["CPUOffloadingManager"], modules=manager_modules(lru, arc)).CPUOffloadingManager
        glue = load(BASE, ["ReqContext", "make_offload_key"])
    scoped = "_RequestCacheAccess" in names_in(source.file(RELPATH), imports=False)
    return Upstream(manager, glue.ReqContext, glue.make_offload_key, naming_of(source), scoped,
                    "_RequestRank" in names_in(source.file(LRU), imports=False))


# -- the sides: an upstream manager, or the model (which also says what is ready and pinned) ---------------------

class UpstreamSide:
    """One release's manager; `tracker_order`: whether the admission tracker's order is observed (the rename's
    programs never fill the tracker, where its order matters, and 0.30.0 changed it beside the rename)."""

    def __init__(self, up: Upstream, config: dict[str, Any], tracker_order: bool = True) -> None:
        self.up, self.n, self.tracker_order, self.config = up, up.naming, tracker_order, config
        self.m = up.manager(**{self.n.capacity_arg: config["capacity"]}, cache_policy=config["policy"],
                            enable_events=config["events"], store_threshold=config["threshold"],
                            max_tracker_size=config["tracker"])
        self.keys = [up.make_key(str(i).encode(), 0) for i in range(KEYS)]
        self.key_of = {k: i for i, k in enumerate(self.keys)}
        self.contexts: dict[int, Any] = {}

    def ctx(self, req: int) -> Any:
        if req not in self.contexts:
            self.contexts[req] = context = self.up.req_context(req_id=f"req-{req}")
            for key, end_token in positions_of(self.config, req).items():
                context.set_offload_key_position(self.keys[key], end_token)
        return self.contexts[req]

    def ks(self, keys: Any) -> list[bytes]:
        return [self.keys[k] for k in keys]

    def ints(self, keys: Any) -> list[int]:
        return [self.key_of[k] for k in keys]

    def pending(self, keys: Any) -> list[int]:
        """The call's keys this manager holds write-pending (ref_cnt -1)."""
        policy = self.m._policy
        return [k for k in keys if (c := policy.get(self.keys[k])) is not None and c.ref_cnt == -1]

    def call(self, op: str, args: Any) -> Any:
        m, n = self.m, self.n
        if op == "prepare_store":
            keys, req = args
            out = m.prepare_store(self.ks(keys), self.ctx(req))
            if out is None:
                return None
            return {"keys_to_store": self.ints(out.keys_to_store),
                    "chunk_ids": [int(x) for x in getattr(out.store_spec, n.spec_ids)],
                    "evicted_keys": self.ints(out.evicted_keys)}
        if op in COMPOUND:
            return COMPOUND[op](self, args)
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
            return m.on_request_finished(self.ctx(args))
        if op == "on_new_request":  # the offload policy's value, read through the naming
            value = m.on_new_request(self.ctx(args)).policy.value
            return "chunk_level" if value == n.chunk_level else value
        if op == "get_load_source":
            key, req = args
            return m.get_load_source(self.keys[key], self.ctx(req)).value
        if op == "reset_cache":
            return m.reset_cache()
        if op == "take_events":
            return [self.event(e) for e in m.take_events() or ()]
        if op == "get_stats":
            return [list(c) for c in m.get_stats().calls]
        raise ValueError(op)

    def event(self, e: Any) -> dict[str, Any]:
        return {"keys": self.ints(e.keys), "removed": e.removed, "metadata_only": getattr(e, "metadata_only", False)}

    def tracker(self, counts: Any) -> list[list[int]]:
        pairs = [[self.key_of[k], c] for k, c in counts.items()]
        return pairs if self.tracker_order else sorted(pairs)

    def observe(self) -> dict[str, Any]:
        m, n = self.m, self.n
        policy = m._policy
        slots = {}
        for i, key in enumerate(self.keys):
            chunk = policy.get(key)
            if chunk is not None:
                slots[i] = {"ref_cnt": chunk.ref_cnt, "slot": getattr(chunk, n.status_id)}
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
                "tracker": None if m.counts is None else self.tracker(m.counts),
                "allocation_sizes": list(m.allocation_sizes_in_current_batch),
                "stores_skipped": m.stores_skipped_in_current_batch}


def store_and_complete(side: Any, args: Any) -> dict[str, Any]:
    """A store whose transfer completes at once (so chunks turn idle and later stores evict): prepare_store, then
    complete_store of the call's keys this side holds write-pending."""
    keys, req = args
    stored = side.call("prepare_store", (keys, req))
    pending = side.pending(keys)
    completed = side.call("complete_store", (pending, req, True)) if pending else None
    return {"prepare_store": stored, "completed": pending, "complete_store": completed}


def load_and_complete(side: Any, args: Any) -> dict[str, Any]:
    """A load whose transfer completes at once: prepare_load, then complete_load of the same keys (the chunks are
    pinned and released again without a recency change)."""
    keys, req = args
    return {"prepare_load": side.call("prepare_load", (keys, req)),
            "complete_load": side.call("complete_load", (keys, req))}


COMPOUND = {"store_and_complete": store_and_complete, "load_and_complete": load_and_complete}


class ModelSide:
    """The model's manager; also the view the operations draw from (what is ready or pinned, the requests)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.m = CPUOffloadingManager(config["capacity"], config["policy"], config["events"], config["threshold"],
                                      config["tracker"])
        self.active = list(range(MAX_REQUESTS))
        self.next_req = MAX_REQUESTS
        self.config = config

    def ctx(self, req: int) -> None:
        """The request's context records its positions before its first call (as the scheduler's does)."""
        if req not in self.m._contexts:
            context = self.m.req_context(req)
            for key, end_token in positions_of(self.config, req).items():
                context.set_offload_key_position(key, end_token)

    def pending(self, keys: Any) -> list[int]:
        resident = self.m.resident()
        return [k for k in keys if k in resident and resident[k].ref_cnt == -1]

    def call(self, op: str, args: Any) -> Any:
        m = self.m
        req = request_of(op, args)
        if req is not None:
            self.ctx(req)
        if op == "on_request_finished":  # a finished request sees no more keys (upstream asserts)
            self.active[self.active.index(args)] = self.next_req
            self.next_req += 1
            return m.on_request_finished(args)
        if op == "on_new_request":
            return m.on_new_request(args)
        if op == "get_load_source":
            return m.get_load_source(args[0])
        if op == "prepare_store":
            out = m.prepare_store(*args)
            return None if out is None else {"keys_to_store": list(out.keys_to_store),
                                             "chunk_ids": list(out.chunk_ids), "evicted_keys": list(out.evicted_keys)}
        if op in COMPOUND:
            return COMPOUND[op](self, args)
        if op == "complete_store":
            keys, _req, success = args
            return m.complete_store(keys, success)
        if op == "prepare_load":
            return list(m.prepare_load(*args))
        if op in ("complete_load", "touch"):
            return getattr(m, op)(args[0])
        if op == "lookup":
            return m.lookup(args[0]).value
        if op == "reset_cache":
            return m.reset_cache()
        if op == "take_events":
            return [{"keys": list(e.keys), "removed": e.removed, "metadata_only": e.metadata_only}
                    for e in m.take_events()]
        if op == "get_stats":
            return [list(c) for c in stats_calls(m.get_stats())]
        raise ValueError(op)

    def observe(self) -> dict[str, Any]:
        m = self.m
        policy = m._policy
        slots = {k: {"ref_cnt": c.ref_cnt, "slot": c.chunk_id} for k, c in sorted(m.resident().items())}
        if hasattr(policy, "t1"):
            order: Any = {"t1": list(policy.t1), "t2": list(policy.t2), "b1": list(policy.b1), "b2": list(policy.b2),
                          "target": policy.target_t1_size}
        else:
            order = {"recency": list(policy.chunks)}
        return {"events": [{"keys": list(e.keys), "removed": e.removed, "metadata_only": e.metadata_only}
                           for e in m.events or []],
                "allocated": m._num_allocated_chunks, "free_list": list(m._free_list),
                "evictable": m._num_evictable_cache_chunks, "write_pending": m._num_write_pending_chunks,
                "free": m._get_num_free_chunks(), "slots": slots, "policy": order,
                "tracker": None if m.counts is None else [list(kv) for kv in m.counts.items()],
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


class ReleaseView:
    """What the rename's operations draw from: the release's own state (which keys it holds ready or pinned, as
    the scheduler knows them) and the requests still active; stepped by `ShadowedSide` to track the requests."""

    def __init__(self, side: UpstreamSide) -> None:
        self.side = side
        self.m = self  # the operations read `view.m.resident()`
        self.active = list(range(MAX_REQUESTS))
        self.next_req = MAX_REQUESTS

    def resident(self) -> dict[int, Any]:
        policy = self.side.m._policy
        return {i: chunk for i, key in enumerate(self.side.keys) if (chunk := policy.get(key)) is not None}

    def call(self, op: str, args: Any) -> None:
        if op == "on_request_finished":
            self.active[self.active.index(args)] = self.next_req
            self.next_req += 1


class ShadowedSide:
    """A code-under-test side that also steps the view the operations draw from (the rename's old release)."""

    def __init__(self, side: UpstreamSide, view: ReleaseView) -> None:
        self.side, self.view = side, view

    def pending(self, keys: Any) -> list[int]:
        return self.side.pending(keys)

    def call(self, op: str, args: Any) -> Any:
        self.view.call(op, args)
        return self.side.call(op, args)

    def observe(self) -> dict[str, Any]:
        return self.side.observe()


# -- the operations --------------------------------------------------------------------------------------------

POSITIONS = st.one_of(st.none(), st.tuples(st.permutations(range(1, KEYS + 1)).map(
    lambda order: tuple(CHUNK_TOKENS * i for i in order)), st.booleans()))  # (end tokens, mixed), or None


def positions_of(config: dict[str, Any], req: int) -> dict[int, int]:
    """The key positions request `req`'s context records: every key's end token (the scheduler records one for
    every key it offloads; a key's position is its own, as a chunk's hash chains over its prefix), or none (no
    positions drawn, or `mixed` and an odd request: a context made without them, as the scheduler's for a
    request it only finishes)."""
    drawn = config.get("positions")
    if drawn is None or (drawn[1] and req % 2):
        return {}
    return dict(enumerate(drawn[0]))


def request_of(op: str, args: Any) -> int | None:
    """The request a call is made for (None: a call without one)."""
    if op in ("on_request_finished", "on_new_request"):
        return args
    return args[1] if isinstance(args, tuple) and len(args) >= 2 else None


KEY_LISTS = st.lists(st.integers(0, KEYS - 1), unique=True, min_size=1, max_size=4)
TOUCHES = st.lists(st.integers(0, KEYS - 1), unique=True, min_size=1, max_size=KEYS)


def _with_request(keys: Any, active: tuple[int, ...]) -> Any:
    return st.tuples(keys, st.sampled_from(active))


def with_request(keys: Any) -> Callable[[ModelSide], Any]:
    return lambda view: strategy_of(_with_request, keys, tuple(view.active))


def completions(view: ModelSide) -> Any:
    """A subset of the write-pending keys (all of them if the mask picks none), maybe one more key (with none
    pending: one key)."""
    pending = tuple(sorted(k for k, c in view.m.resident().items() if c.ref_cnt == -1))
    return strategy_of(_completions, pending, tuple(view.active))


def _completions(pending: tuple[int, ...], active: tuple[int, ...]) -> Any:
    def pick(drawn: tuple) -> tuple:
        mask, extra, req, success = drawn
        keys = [k for k in pending if mask[k]] or list(pending)
        if extra is not None and extra not in keys:
            keys.append(extra)
        return keys, req, success
    extra = st.one_of(st.none(), st.integers(0, KEYS - 1)) if pending else st.integers(0, KEYS - 1)
    return st.tuples(st.lists(st.booleans(), min_size=KEYS, max_size=KEYS), extra, st.sampled_from(active),
                     st.booleans()).map(pick)


def loads(view: ModelSide) -> Any:
    ready = tuple(sorted(k for k, c in view.m.resident().items() if c.ref_cnt >= 0))
    return strategy_of(_loads, ready, tuple(view.active)) if ready else None


def _loads(ready: tuple[int, ...], active: tuple[int, ...]) -> Any:
    keys = st.permutations(ready).flatmap(lambda p: st.integers(1, len(p)).map(lambda n: list(p[:n])))
    return st.tuples(keys, st.sampled_from(active))


def load_completions(view: ModelSide) -> Any:
    pinned = tuple(sorted(k for k, c in view.m.resident().items() if c.ref_cnt > 0))
    return strategy_of(_load_completions, pinned, tuple(view.active)) if pinned else None


def _load_completions(pinned: tuple[int, ...], active: tuple[int, ...]) -> Any:
    return st.tuples(st.lists(st.sampled_from(pinned), unique=True, min_size=1), st.sampled_from(active))


def resettable(view: ModelSide) -> Any:
    """The scheduler flushes in-flight loads before a reset: enabled while no chunk is pinned."""
    return None if any(c.ref_cnt > 0 for c in view.m.resident().values()) else st.just(())


OPERATIONS = (  # the stores and their completions repeated: they are what the other operations work on
    Operation("prepare_store", with_request(KEY_LISTS)),
    Operation("prepare_store", with_request(KEY_LISTS)),
    Operation("store_and_complete", with_request(KEY_LISTS)),
    Operation("store_and_complete", with_request(KEY_LISTS)),
    Operation("store_and_complete", with_request(KEY_LISTS)),
    Operation("complete_store", completions),
    Operation("complete_store", completions),
    Operation("prepare_load", loads),
    Operation("complete_load", load_completions),
    Operation("load_and_complete", loads),
    Operation("touch", with_request(TOUCHES)),
    Operation("touch", with_request(TOUCHES)),
    Operation("lookup", with_request(st.integers(0, KEYS - 1))),
    Operation("on_request_finished", lambda view: sampled(view.active)),
    Operation("on_new_request", lambda view: sampled(view.active)),
    Operation("get_load_source", with_request(st.integers(0, KEYS - 1))),
    Operation("reset_cache", resettable),
    Operation("take_events", st.just(())),
    Operation("get_stats", st.just(())),
)


def configs(thresholds: tuple[int, ...], policies: tuple[str, ...] = ("lru", "arc"), trackers: Any = None,
            positions: bool = False) -> Any:
    """A manager's configuration; `positions`: the requests' contexts may record key positions (`positions`: each
    key's end token and whether odd requests record none (`mixed`), or None)."""
    return st.fixed_dictionaries({"policy": st.sampled_from(policies),
                                  "capacity": st.sampled_from((2, 3, 1, 4, 0, 5)),
                                  "threshold": st.sampled_from(thresholds),
                                  "tracker": st.integers(1, 6) if trackers is None else trackers,
                                  "events": st.sampled_from((True, True, True, False)),
                                  **({"positions": POSITIONS} if positions else {})})


# -- CPUOffloadingManager: the release against the model ----------------------------------------------------------

def manager_skip(ctx: Context) -> tuple[str, str] | None:
    up = upstream_of(ctx)
    if not up.request_scoped:
        return ("skipped", f"{ctx.source.label} predates the request-scoped cache access (vLLM 0.31.0); the model "
                           f"states 0.33.0: see the offload_rename target for this release")
    return None


def manager_configs(ctx: Context) -> Any:
    """Contexts with key positions where the release's LRU reads them (0.33.0's `_RequestRank`); before that
    (0.31.0, 0.32.0: positions recorded, LRU ranking by counter alone) none are drawn."""
    return configs((1, 1, 2), positions=upstream_of(ctx).positional)


def manager_note(ctx: Context) -> str:
    up = upstream_of(ctx)
    drawn = ("contexts with key positions (all requests, or the even ones) and without" if up.positional else
             "contexts without key positions (this release's LRU does not rank by position)")
    return f"names: {up.naming.label}; LRU and ARC, every observable after every step; {drawn}"


def manager_sides(ctx: Context, config: dict[str, Any]) -> tuple[Any, Any]:
    return ModelSide(config), UpstreamSide(upstream_of(ctx), config)


def config(policy: str, capacity: int, threshold: int = 1, tracker: int = 64_000,
           positions: tuple[int, ...] | None = None, mixed: bool = False) -> dict[str, Any]:
    return {"policy": policy, "capacity": capacity, "threshold": threshold, "tracker": tracker, "events": True,
            **({"positions": (positions, mixed)} if positions is not None else {})}


# Directed programs: paths a random program reaches rarely, run on the model and the release (each must give the
# same trace), and on 0.29.0 and the release after it (`RENAME`'s probes: each must give different traces).
ARC_T1_FALLBACK = (  # ARC: T1 below the target and no idle key in T2: 0.29.0 gives up (None), 0.30.0 takes T1
    config("arc", 3),
    ("prepare_store", ([0, 1, 2], 0)), ("complete_store", ([0, 1, 2], 0, True)),
    ("prepare_store", ([3], 0)), ("complete_store", ([3], 0, True)), ("prepare_store", ([4], 0)),
    ("complete_store", ([4], 0, True)), ("touch", ([0, 1], 0)), ("touch", ([3, 4], 0)),
    ("prepare_load", ([3, 4], 0)), ("prepare_store", ([5], 0)))
TRACKER_KEEPS_OFFER = (  # store_threshold 2, tracker of 1: 0.29.0 evicts the offer's own key, 0.30.0 keeps it
    config("lru", 0, threshold=2, tracker=1), ("prepare_store", ([0, 1], 0)))
LRU_REPINNED = (  # a load pins and releases key 0 without a recency change: its heap entry is there twice
    config("lru", 2), ("store_and_complete", ([0, 1], 0)), ("load_and_complete", ([0], 0)),
    ("lookup", (0, 0)), ("prepare_store", ([2, 3], 1)), ("lookup", (2, 1)))
LRU_COMPACTED = (  # many touches of idle keys: the lazy heap outgrows twice the evictable keys and is rebuilt
    config("lru", 5), ("store_and_complete", ([0, 1, 2, 3, 4], 0)),
    *(("touch", ([0, 1, 2, 3, 4] if i % 2 else [4, 3, 2, 1, 0], 1)) for i in range(14)),
    ("prepare_store", ([5], 1)))

FAILED_STORE = (  # a failed store of pending keys, with events on: a metadata-only removal event (0.31.0 had none);
    # random programs reach failed stores of pending keys mostly with events off
    config("lru", 2), ("prepare_store", ([0, 1], 0)), ("complete_store", ([0], 0, False)), ("take_events", ()))
FAILED_STORE_QUIET = ({**FAILED_STORE[0], "events": False},) + FAILED_STORE[1:]  # the same with events off
ARC_TARGET_LOWERED = (  # two B1 ghost hits (other requests) raise ARC's target to 2; a B2 ghost hit with B1 empty
    # lowers it by max(1, |B1| / |B2|) = 1, and a second one to 0
    config("arc", 2), ("store_and_complete", ([0, 1], 0)), ("touch", ([0, 1], 0)),
    ("store_and_complete", ([2], 0)), ("store_and_complete", ([3], 0)), ("store_and_complete", ([2], 1)),
    ("store_and_complete", ([3], 2)), ("store_and_complete", ([1], 3)), ("store_and_complete", ([0], 4)),
    ("take_events", ()))
STALE_REQUEST_FINISHED = (  # request 0's accesses (after a first reset) predate a second one: its finish must not
    # reorder the keys request 1 stored again after it
    config("lru", 2), ("reset_cache", ()), ("store_and_complete", ([0, 1], 0)), ("reset_cache", ()),
    ("store_and_complete", ([0, 1], 1)), ("on_request_finished", 0), ("prepare_store", ([2], 1)))
LRU_ONE_CALL = (  # keys stored by one call are ranked in the call's order: the first is evicted first
    config("lru", 2), ("store_and_complete", ([1, 0], 0)), ("prepare_store", ([2], 0)))
LRU_PINNED_ENTRY = (  # a load pins the oldest key, whose heap entry stays: eviction passes over it
    config("lru", 2), ("store_and_complete", ([0, 1], 0)), ("prepare_load", ([0], 0)), ("prepare_store", ([2], 1)))
ARC_REUSED_EVICTED = (  # request 0 reused key 0, evicted before request 0 finishes: its finish leaves ARC's lists
    config("arc", 1), ("store_and_complete", ([0], 1)), ("load_and_complete", ([0], 0)),
    ("store_and_complete", ([1], 1)), ("on_request_finished", 0), ("take_events", ()))
ARC_SEEN_NOT_STORED = (  # request 0's offer of key 1 finds no room (None): key 1 is seen, not stored nor reused; stored
    # and promoted to T2 by request 1, it keeps its T2 place when request 0 finishes
    config("arc", 2), ("prepare_store", ([0, 2], 1)), ("prepare_store", ([1], 0)),
    ("complete_store", ([0, 2], 1, True)), ("store_and_complete", ([1], 1)), ("touch", ([1], 1)),
    ("touch", ([2], 1)), ("on_request_finished", 0), ("take_events", ()))
ARC_TWO_EVICTIONS = (  # B1 ghost hits raise the target to 3; a two-chunk eviction takes T1's oldest, then (T1 now
    # below the target) T2's
    config("arc", 4), ("store_and_complete", ([0, 1, 2, 3], 0)), ("touch", ([3], 0)),
    ("store_and_complete", ([4], 0)), ("store_and_complete", ([0], 1)), ("store_and_complete", ([1], 2)),
    ("prepare_store", ([2, 5], 3)))
ARC_T1_ABOVE_TARGET = (  # a ghost touched, then stored again into a failed store's slot, raises the target to 2
    # and leaves B1 empty; one request's touch moves key 1 to T2. Two fresh keys (no ghost hit) evict two chunks
    # from a T1 of 3, the target + 1: T1's two oldest (after the first, T1's virtual size 2 still meets the target)
    config("arc", 4), ("store_and_complete", ([0, 1, 2, 3], 0)), ("prepare_store", ([4], 0)),
    ("complete_store", ([4], 0, False)), ("touch", ([0], 1)), ("store_and_complete", ([0], 1)),
    ("touch", ([1], 1)), ("prepare_store", ([4, 5], 2)))
ONE_CHUNK_WRITE_USAGE = (  # a pool of one chunk, write-pending: its write usage is 1.0
    config("lru", 1), ("prepare_store", ([0], 0)), ("get_stats", ()))
ARC_PROTECTED = (  # the offer's own idle key is the oldest in T1: ARC evicts the next one
    config("arc", 2), ("store_and_complete", ([0, 1], 0)), ("prepare_store", ([0, 2], 1)))
ARC_PENDING_IN_T2 = (  # request 0 reuses key 0, which is evicted and stored again (write-pending) for request 0: its
    # finish moves the pending key to T2, and the failed store removes it from there
    config("arc", 1), ("store_and_complete", ([0], 1)), ("load_and_complete", ([0], 0)),
    ("store_and_complete", ([1], 1)), ("prepare_store", ([0], 0)), ("on_request_finished", 0),
    ("complete_store", ([0], 2, False)), ("take_events", ()))

ARC_RENAMED = (  # ARC without the T1 fallback: T2 promotion, evictions from T1 into B1, a ghost hit, a failed store
    config("arc", 3), ("store_and_complete", ([0, 1, 2], 0)), ("touch", ([0], 0)), ("store_and_complete", ([3], 0)),
    ("store_and_complete", ([1], 0)), ("touch", ([3], 0)), ("lookup", (2, 0)), ("prepare_load", ([0], 0)),
    ("complete_load", ([0], 0)), ("prepare_store", ([4], 0)), ("complete_store", ([4], 0, False)),
    ("take_events", ()), ("get_stats", ()), ("reset_cache", ()), ("store_and_complete", ([5, 4], 1)))
ARC_GHOSTS = (  # ARC without the T1 fallback: evictions from T2 into B2, a B2 ghost hit, the ghost lists trimmed,
    # touches of a T2 key and of a write-pending T1 key
    config("arc", 2), ("store_and_complete", ([0, 1], 0)), ("touch", ([0, 1], 0)), ("touch", ([0], 0)),
    ("store_and_complete", ([2], 0)), ("touch", ([1], 0)), ("store_and_complete", ([3], 0)),
    ("store_and_complete", ([4], 0)), ("store_and_complete", ([5], 0)), ("prepare_store", ([1], 1)),
    ("touch", ([1], 1)), ("complete_store", ([1], 1, True)), ("take_events", ()))
FULL_TRACKER = (  # store_threshold 2, a full tracker and an offer of untracked keys: the oldest count goes
    config("lru", 2, threshold=2, tracker=2), ("prepare_store", ([0], 0)), ("prepare_store", ([1], 0)),
    ("prepare_store", ([2], 0)), ("prepare_store", ([2], 0)), ("get_stats", ()))

IN_ORDER = tuple(CHUNK_TOKENS * i for i in range(1, KEYS + 1))  # key i ends at token 16 (i + 1)
LRU_TAIL_FIRST = (  # one request's keys share its rank, tail first: its last key is evicted first
    config("lru", 3, positions=IN_ORDER), ("store_and_complete", ([0, 1, 2], 0)), ("prepare_store", ([3], 1)))
LRU_ACCESS_RAISES_A_RANK = (  # request 1 (no positions) stores keys 1 and 2; request 0's access of key 1 raises it
    # to request 0's newer rank, so key 2 is now the oldest and is evicted (by counter alone key 1 would be); the
    # next eviction takes key 1 at its new rank, ahead of request 0's head key 0
    config("lru", 3, positions=IN_ORDER, mixed=True), ("store_and_complete", ([1], 1)),
    ("store_and_complete", ([2], 1)), ("store_and_complete", ([0], 0)), ("prepare_store", ([1], 0)),
    ("store_and_complete", ([3], 1)), ("prepare_store", ([4], 1)))
LRU_RANK_RENEWED_AFTER_A_RESET = (  # request 0 takes its rank after a first reset; after a second one its rank is
    # stale (another cache generation): its next store takes a new rank, above request 1's key, which is evicted
    # (a stale rank would rank request 0's key below it)
    config("lru", 2, positions=IN_ORDER, mixed=True), ("reset_cache", ()), ("store_and_complete", ([0], 0)),
    ("reset_cache", ()), ("store_and_complete", ([1], 1)), ("store_and_complete", ([2], 0)),
    ("prepare_store", ([3], 1)))
ARC_FINISH_IN_POSITION_ORDER = (  # request 0 saw its tail key first; its finish applies its keys tail to head in
    # position order, so the head is the most recent and the tail is evicted
    config("arc", 2, positions=IN_ORDER), ("store_and_complete", ([2], 0)), ("store_and_complete", ([0], 0)),
    ("on_request_finished", 0), ("prepare_store", ([4], 1)))


def directed(name: str, what: str, program: tuple) -> Probe:
    def check(ctx: Context) -> str | None:
        differs = run_program(ModelSide(program[0]), UpstreamSide(upstream_of(ctx), program[0]), program[1:])
        return None if differs is None else f"{what}: the model and {ctx.source.label} differ {differs}"
    return Probe(name, f"{what}: the model's trace and upstream's are equal", check)


def positioned(name: str, what: str, program: tuple) -> Probe:
    """A directed program with recorded key positions: on a release whose LRU ranks by position only."""
    probe = directed(name, what, program)

    def check(ctx: Context) -> str | None:
        if not upstream_of(ctx).positional:
            ctx.note(f"{name}: not run ({ctx.source.label}'s LRU does not rank by key position)")
            return None
        return probe.check(ctx)
    return Probe(name, probe.doc, check)


MANAGER = Lockstep(
    loading=loading, skip=manager_skip, start=manager_configs, sides=manager_sides,
    operations=OPERATIONS, steps=STEPS,
    probes=(directed("arc_evict_falls_back_to_t1", "ARC evict falls back to T1", ARC_T1_FALLBACK),
            directed("lru_evict_skips_a_repinned_entry", "LRU eviction skips a re-pinned key's second heap entry",
                     LRU_REPINNED),
            directed("lru_compacts_its_heap", "LRU rebuilds an outgrown heap", LRU_COMPACTED),
            directed("failed_store_removal_event", "a failed store removes its pending keys with an event",
                     FAILED_STORE),
            directed("failed_store_without_events", "a failed store with events off records no event",
                     FAILED_STORE_QUIET),
            directed("arc_b2_ghost_hit_lowers_the_target", "ARC: a B2 ghost hit lowers the T1 target by at least 1",
                     ARC_TARGET_LOWERED),
            directed("stale_request_finished", "a request finished after a reset leaves the new cache's order",
                     STALE_REQUEST_FINISHED),
            directed("lru_ranks_one_call_in_order", "LRU ranks the keys of one store in the call's order",
                     LRU_ONE_CALL),
            directed("lru_evict_skips_a_pinned_entry", "LRU eviction passes over a pinned key's heap entry",
                     LRU_PINNED_ENTRY),
            directed("arc_finish_of_an_evicted_reused_key", "ARC: a request's reused key evicted before it finishes",
                     ARC_REUSED_EVICTED),
            directed("arc_finish_keeps_a_key_it_only_saw", "ARC: a key a request saw but neither stored nor reused "
                                                           "keeps its T2 place", ARC_SEEN_NOT_STORED),
            directed("arc_two_evictions_track_t1", "ARC: one call's evictions track T1's shrinking size",
                     ARC_TWO_EVICTIONS),
            directed("arc_two_evictions_from_t1_above_target",
                     "ARC: two evictions from a T1 one above the target both take T1", ARC_T1_ABOVE_TARGET),
            directed("one_chunk_write_usage", "the write usage of a one-chunk pool", ONE_CHUNK_WRITE_USAGE),
            directed("arc_evict_skips_the_offer", "ARC eviction passes over the offer's own idle key", ARC_PROTECTED),
            directed("arc_failed_store_of_a_t2_key", "ARC: a failed store removes a write-pending key from T2",
                     ARC_PENDING_IN_T2),
            directed("arc_b2_ghost_stored_again", "ARC: a key evicted from T2 into B2 and stored again leaves B2",
                     ARC_GHOSTS),
            directed("arc_promotions_ghost_hits_failed_store", "ARC promotions, ghost hits and a failed store",
                     ARC_RENAMED),
            directed("full_tracker_drops_its_oldest", "a full admission tracker drops its oldest count",
                     FULL_TRACKER),
            *(positioned(name, what, program) for name, what, program in (
                ("lru_evicts_a_request_tail_first", "LRU evicts one request's keys tail first", LRU_TAIL_FIRST),
                ("lru_request_access_raises_a_rank", "LRU: a request's access raises an older key to its request's "
                                                     "rank", LRU_ACCESS_RAISES_A_RANK),
                ("arc_finishes_in_position_order", "ARC finishes a request's keys in position order",
                 ARC_FINISH_IN_POSITION_ORDER),
                ("lru_request_rank_renewed_after_a_reset", "LRU: a request's rank from another cache generation is "
                                                           "taken anew", LRU_RANK_RENEWED_AFTER_A_RESET)))),
    note=manager_note)


# -- offload_rename: vLLM 0.29.0 (old names) against the release given (new names) --------------------------------

def rename_skip(ctx: Context) -> tuple[str, str] | None:
    new = upstream_of(ctx)
    if new.naming is not NEW_NAMES:
        return ("skipped", f"{ctx.source.label} has the old names (before #52615): compare a release with the new "
                           f"names")
    if new.request_scoped:
        return ("skipped", f"{ctx.source.label} has the request-scoped cache access and the rank-ordered LRU (0.31.0 "
                           f"and later): not the rename's neighbour; compare --version 0.30.0, the first release with "
                           f"the new names, against {OLD_RELEASE}")
    from ..source import resolve_source

    try:
        ctx.state["old"] = load_release(resolve_source("vllm", version=OLD_RELEASE))
    except ConfigError as exc:
        return ("skipped", f"vLLM {OLD_RELEASE} (the old names) is not available: {exc}")
    return None


def rename_sides(ctx: Context, config: dict[str, Any]) -> tuple[Any, Any, Any]:
    new = UpstreamSide(upstream_of(ctx), config, tracker_order=False)
    view = ReleaseView(new)
    return ShadowedSide(UpstreamSide(ctx.state["old"], config, tracker_order=False), view), new, view


def run_program(a: Any, b: Any, ops: tuple) -> str | None:
    """Step two sides through `ops`; the first difference (None: the traces are equal)."""
    for op, args in ops:
        ra, rb = a.call(op, args), b.call(op, args)
        oa, ob = a.observe(), b.observe()
        if ra != rb or oa != ob:
            return f"at {op}{args!r}: returned {ra!r} vs {rb!r}, observations differ in " \
                   f"{sorted(k for k in oa if oa[k] != ob.get(k))}"
    return None


def beside_the_rename(name: str, what: str, program: tuple) -> Probe:
    def check(ctx: Context) -> str | None:
        config, ops = program[0], program[1:]
        differs = run_program(UpstreamSide(ctx.state["old"], config), UpstreamSide(upstream_of(ctx), config), ops)
        if differs is None:
            return f"{what}: the same trace on vLLM {OLD_RELEASE} and {ctx.source.label}"
        ctx.note(f"{what}: differs {differs}")
        return None
    return Probe(name, f"{what} (a behaviour change 0.30.0 made beside the rename)", check)


def renamed_alike(name: str, what: str, program: tuple) -> Probe:
    def check(ctx: Context) -> str | None:
        config, ops = program[0], program[1:]
        differs = run_program(UpstreamSide(ctx.state["old"], config), UpstreamSide(upstream_of(ctx), config), ops)
        return None if differs is None else f"{what}: vLLM {OLD_RELEASE} and {ctx.source.label} differ {differs}"
    return Probe(name, f"{what}: the same trace on both releases", check)


RENAME = Lockstep(
    loading=loading, skip=rename_skip, start=lambda ctx: configs((1, 1, 2), ("lru",), st.just(64_000)),
    sides=rename_sides,
    operations=OPERATIONS,
    steps=RENAME_STEPS, both_upstream=True,
    probes=(renamed_alike("arc_renamed_alike", "ARC stores, promotions, ghost hits and failed stores", ARC_RENAMED),
            renamed_alike("arc_ghosts_renamed_alike", "ARC's B2 ghosts and trimmed ghost lists", ARC_GHOSTS),
            renamed_alike("full_tracker_renamed_alike", "a full admission tracker", FULL_TRACKER),
            beside_the_rename("arc_t1_fallback_is_new", "ARC evict falls back to T1 when T2 has no idle key",
                              ARC_T1_FALLBACK),
            beside_the_rename("tracker_keeps_the_offer_is_new",
                              "the admission tracker no longer evicts the offer's own keys", TRACKER_KEEPS_OFFER)),
    note=lambda ctx: f"vLLM {OLD_RELEASE} ({ctx.state['old'].naming.label}) vs {ctx.source.label} "
                     f"({upstream_of(ctx).naming.label}), store_threshold 1")
