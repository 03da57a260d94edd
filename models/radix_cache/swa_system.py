"""The unified radix cache's SWA component under a few requests, as a transition system (`kvsim explore
radix-cache-swa`): SGLang 0.5.14's `UnifiedRadixCache` (`unified_swa`) with the scheduler's early release of the
sliding-window lock (`ScheduleBatch.maybe_evict_swa` with `SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW` on), and
with `num_mamba_slots` a Mamba component over a Mamba state pool (`mamba`): a request owns a state slot while it
runs, its first caching donates a fresh one to the tree, its end hands its own over (each freed when the node has
a state already), a retraction frees it.

Request r's prompt: `shared` leading 1s, then its family's token `2 + prompts[r]` up to `prompt_len`; its outputs
are `8 + family`, `max_tokens` of them. Page size 1. The actions:

- `admit` (waiting): `match_prefix` (the key one token short of the input), `inc_lock_ref`, with Mamba the request's
  state slot (`HybridReqToTokenPool.alloc`, evicting Mamba states for it), evict the shortfall of either pool
  (`evict(num_tokens, swa_num_tokens)`), `alloc` the extend, the step, a sampled token; then `cache_unfinished_req`
  (a donated state slot, insert, re-match, move the lock) or, at `max_tokens`, `cache_finished_req`. A demand a
  pool cannot meet with its free and evictable slots (Mamba: the request's slot and, unless it finishes at once,
  the donated one) leaves the request waiting (`deferred`).
- `decode` (running): a slot of each pool (evicting for it; a request it does not fit is `deferred`),
  `decode_batch_idx` one more, then `maybe_evict_swa`: once `decode_batch_idx >= sliding_window_size`, with a
  window boundary (`swa_uuid_for_lock`) and not yet released, `dec_swa_lock_only(last_node, swa_uuid_for_lock)` and
  `swa_prefix_lock_released`. The call sits behind `hasattr(tree_cache, "dec_swa_lock_only")`, False for 0.5.13's
  UnifiedRadixCache: variant `pre_28161` (`has_dec_swa_lock_only`) skips it. Then a sampled token; at `max_tokens`
  `cache_finished_req` (insert, `dec_lock_ref(..., skip_swa=swa_prefix_lock_released)`).
- `retract` (running, only while its next decode does not fit): `cache_finished_req(is_insert=False)` (the row
  past the tree's part freed, the lock dropped, SWA skipped if released); back to waiting with its outputs.

Invariants: `lock_order` (every node's full lock_ref >= its swa lock_ref >= its mamba lock_ref >= 0, #28161's
per-node order), `mamba_lock_refs` (a node's Mamba count is the running requests locking that node that have not
released their window; 0.5.14 to 0.5.19 release it twice, bug `sglang-unified-mamba-lock-released-twice`),
`full_lock_refs` (a node's full count is the running requests locking it or below; sizes agree),
`swa_lock_within_window` (a node's swa count is at most the running requests locking it or below that still need
their window: decode position below the window, or no window boundary to release at; #28161: the early release is
a silent no-op on 0.5.13), `pool_accounting` (per pool: free + evictable + protected + held by running requests =
the pool, each slot once; for Mamba `_check_mamba_pool`'s available + evictable + protected + the running
requests' own slots), `all_free_when_done`; step checks recorded with `flag`: `evict_unlocked` (eviction takes
unlocked leaves only, tombstones only SWA-unlocked nodes, evicts only unlocked Mamba states, `_cascade_evict`'s lock
assertion, an insert's tombstone unlocked) and `no_double_free` (no slot freed while free; `cache_unfinished_req`'s
assertions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.engine.actions import Rules, tagged, type_table
from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.system import Invariant, Sometimes, flag, flagged

from .mamba import MambaSlotAllocator
from .unified_swa import (SWAAllocatorState, SWATokenToKVPoolAllocator, UnifiedRadixCache, UnifiedTreeNode,
                          UnifiedTreeState)
# ACTIONS: the action records, looked up beside the system (kvsim replay)
from .request_loop import ACTIONS, FINISHED, RUNNING, WAITING, Admit, Decode, Prompts, RequestLoop, Retract
from .variants import SWA_FIXED, UnifiedSwaVariant


Admitted = tagged("admitted", "req", "prefix_len")
Deferred = tagged("deferred", "req")
SwaLockReleased = tagged("swa_lock_released", "req")
Released = tagged("released", "req", "inserted")
EFFECTS = type_table((Admitted, Deferred, SwaLockReleased, Released))


@dataclass(frozen=True)
class UnifiedSwaConfig(Prompts):
    """`kvsim explore radix-cache-swa --param`: the two pools, the window, the requests."""

    num_slots: int = param(8, "slots in the full-attention pool (slot 0 reserved, not counted)", minimum=1,
                           maximum=16)
    num_swa_slots: int = param(6, "slots in the sliding-window pool (slot 0 reserved, not counted)", minimum=1,
                               maximum=16)
    sliding_window_size: int = param(2, "tokens of the sliding window", minimum=1, maximum=8)
    prompts: tuple[int, ...] = param((0, 0), "each request's prompt family (equal families: equal prompts)",
                                     minimum=0, maximum=3)
    prompt_len: int = param(3, "tokens in each prompt", minimum=2, maximum=8)
    shared: int = param(2, "leading prompt tokens every family shares", minimum=0, maximum=8)
    max_tokens: int = param(4, "output tokens a request samples before it finishes", minimum=1, maximum=5)
    num_mamba_slots: int = param(0, "slots in the Mamba state pool (slot 0 reserved, not counted); 0: no Mamba "
                                 "component", minimum=0, maximum=8)

    def __post_init__(self) -> None:
        self.check_requests()
        if self.num_mamba_slots == 1:  # a running request's own state and the one its first caching donates
            raise ConfigError("param num_mamba_slots", "0 (no Mamba component) or at least 2", self.num_mamba_slots)
        longest = self.prompt_len + self.max_tokens - 1  # a request's row before its last sample
        for name, size in (("num_slots", self.num_slots), ("num_swa_slots", self.num_swa_slots)):
            if size < longest:
                raise ConfigError(f"param {name}", f"room for a request's longest row ({longest} tokens)", size)


class RequestState(NamedTuple):
    status: str
    output_ids: tuple[int, ...]
    row: tuple[int, ...]  # req_to_token: full slots of its positions (empty unless running)
    cache_protected_len: int
    lock: tuple[int, ...] | None  # last_node's full token path, None unless running
    swa_uuid_for_lock: int | None  # the tree's renumbered uuid (0: one no node carries any more)
    swa_prefix_lock_released: bool
    decode_batch_idx: int
    mamba_pool_idx: int | None = None  # its own Mamba state slot (with a Mamba component, while running)


class UnifiedSwaState(NamedTuple):
    tree: UnifiedTreeState
    allocator: SWAAllocatorState
    requests: tuple[RequestState, ...]
    flags: tuple[tuple[str, str], ...] = ()
    mamba_free: tuple[int, ...] = ()  # the Mamba pool's free slots (with a Mamba component)


class Req:
    """The scheduler's request, live for one step."""

    def __init__(self, rid: int, cfg: UnifiedSwaConfig, rs: RequestState, tree: UnifiedRadixCache) -> None:
        self.rid, self.origin_input_ids = rid, cfg.prompt(rid)
        self.output_ids, self.row = list(rs.output_ids), list(rs.row)
        self.cache_protected_len = rs.cache_protected_len
        self.last_node = None if rs.lock is None else tree.node_at(rs.lock)
        self.swa_uuid_for_lock = rs.swa_uuid_for_lock
        self.swa_prefix_lock_released = rs.swa_prefix_lock_released
        self.decode_batch_idx = rs.decode_batch_idx
        self.mamba_pool_idx = rs.mamba_pool_idx

    @property
    def fill_ids(self) -> tuple[int, ...]:
        return self.origin_input_ids + tuple(self.output_ids)


class UnifiedSwaSystem(RequestLoop):
    def __init__(self, variant: UnifiedSwaVariant = SWA_FIXED, config: UnifiedSwaConfig = UnifiedSwaConfig()) -> None:
        self.name, self.variant, self.cfg = "radix-cache-swa", variant, config
        self.invariants = (
            Invariant("lock_order", self._lock_order, "every node: full lock_ref >= swa lock_ref >= mamba lock_ref "
                      ">= 0"),
            Invariant("full_lock_refs", self._full_lock_refs,
                      "a node's full lock count is the running requests locking it or below; the sizes agree"),
            Invariant("swa_lock_within_window", self._swa_lock_within_window,
                      "a node's swa lock count is at most the running requests locking it or below whose decode "
                      "position has not passed the sliding window (or that have no window boundary to release at)"),
            Invariant("mamba_lock_refs", self._mamba_lock_refs,
                      "a node's Mamba lock count is the running requests locking that node that have not released "
                      "their window (the early release drops the Mamba lock with SWA's); the Mamba sizes agree"),
            Invariant("pool_accounting", self._pool_accounting,
                      "per pool (full, SWA, Mamba): free + evictable + protected + held by running requests = the "
                      "pool, each slot once"),
            Invariant("all_free_when_done", self._all_free_when_done,
                      "once every request has ended nothing is protected"),
            Invariant("evict_unlocked", flagged("evict_unlocked"),
                      "eviction takes unlocked leaves, tombstones SWA-unlocked nodes, cascades into unlocked "
                      "components only (_cascade_evict's assert)"),
            Invariant("no_double_free", flagged("no_double_free"),
                      "no slot freed while free; cache_unfinished_req's assertions hold"),
        )
        self.sometimes = (
            Sometimes("a_window_lock_is_released",
                      lambda s, a, t: isinstance(a, Decode) and t.requests[a[1]].status == RUNNING and
                      _swa_locks(t) < _swa_locks(s),
                      "a decode past the sliding window releases the request's SWA lock (dec_swa_lock_only) while "
                      "the request runs on", step=True),
            Sometimes("a_prefix_hit", lambda s, a, t: isinstance(a, Admit) and _full_locks(t) > _full_locks(s) and
                      any(n.full_lock_ref > 1 for n in t.tree.nodes),
                      "an admit locks a node another running request locks too (a shared cached prefix)", step=True),
            Sometimes("a_request_finishes_and_is_cached",
                      lambda s: any(r.status == FINISHED for r in s.requests) and bool(s.tree.nodes),
                      "a finished request's KV is left in the tree (cache_finished_req)"),
        )

    # -- the contract ------------------------------------------------------------------------------------------
    def initial_states(self) -> tuple[UnifiedSwaState, ...]:
        cfg = self.cfg
        alloc = SWATokenToKVPoolAllocator(cfg.num_slots, cfg.num_swa_slots)
        mamba = MambaSlotAllocator(cfg.num_mamba_slots) if cfg.num_mamba_slots else None
        tree = UnifiedRadixCache(alloc, cfg.sliding_window_size, self.variant, mamba)
        requests = tuple(RequestState(WAITING, (), (), 0, None, None, False, 0) for _ in cfg.prompts)
        return (UnifiedSwaState(tree.freeze({}), alloc.freeze(), requests, (), mamba.freeze() if mamba else ()),)

    def allows(self, s: UnifiedSwaState, a: tuple) -> bool:
        return RULES.allows(self, s, a)

    def transition(self, s: UnifiedSwaState, action: tuple) -> tuple[UnifiedSwaState, tuple[tuple, ...]]:
        cfg = self.cfg
        alloc = SWATokenToKVPoolAllocator.thaw(s.allocator, cfg.num_slots, cfg.num_swa_slots)
        mamba = MambaSlotAllocator.thaw(s.mamba_free, cfg.num_mamba_slots) if cfg.num_mamba_slots else None
        tree = UnifiedRadixCache.thaw(s.tree, alloc, cfg.sliding_window_size, self.variant, mamba)
        self.watch(tree, alloc)
        effect, action = RULES.effect(action)
        reqs = {r: Req(r, cfg, rs, tree) for r, rs in enumerate(s.requests) if rs.status == RUNNING}
        statuses = [rs.status for rs in s.requests]
        fx: list[tuple] = []
        effect(self, s, action, tree, alloc, reqs, statuses, fx)
        uuids: dict[int, int] = {}
        frozen = tree.freeze(uuids)
        requests = tuple(self._frozen(s.requests[r], statuses[r], reqs.get(r), uuids) for r in range(len(statuses)))
        after = UnifiedSwaState(frozen, alloc.freeze(), requests, s.flags, mamba.freeze() if mamba else ())
        for problem in tree.problems:
            after = flag(after, "no_double_free" if "assert" in problem else "evict_unlocked", problem)
        for problem in alloc.problems + (mamba.problems if mamba else []):
            after = flag(after, "no_double_free", problem)
        return after, tuple(fx)

    @staticmethod
    def _frozen(before: RequestState, status: str, req: Req | None, uuids: dict[int, int]) -> RequestState:
        if req is None:
            return before
        if status != RUNNING:
            return RequestState(status, tuple(req.output_ids), (), 0, None, None, False, 0)
        uuid = None if req.swa_uuid_for_lock is None else uuids.get(req.swa_uuid_for_lock, 0)
        return RequestState(RUNNING, tuple(req.output_ids), tuple(req.row), req.cache_protected_len,
                            req.last_node.path(), uuid, req.swa_prefix_lock_released, req.decode_batch_idx,
                            req.mamba_pool_idx)

    # -- the scheduler's calls -----------------------------------------------------------------------------------
    def evict_for(self, tree: UnifiedRadixCache, alloc: SWATokenToKVPoolAllocator, need: int) -> bool:
        """Evict each pool's shortfall; whether `need` slots of each are free then."""
        full_short, swa_short = need - alloc.full_available_size(), need - alloc.swa_available_size()
        if full_short > 0 or swa_short > 0:
            tree.evict(max(full_short, 0), max(swa_short, 0))
        return alloc.full_available_size() >= need and alloc.swa_available_size() >= need

    def cache_unfinished_req(self, tree: UnifiedRadixCache, req: Req) -> None:
        token_ids = req.fill_ids[:len(req.row)]
        if tree.mamba is None:
            new_prefix_len = tree.insert(token_ids, req.row, req.cache_protected_len).prefix_len
        else:  # prepare_for_caching_req: a fresh slot, the request's state copied into it, donated to the tree
            donated = self.alloc_mamba_slot(tree)
            result = tree.insert(token_ids, req.row, req.cache_protected_len, mamba_value=donated)
            new_prefix_len = result.prefix_len
            if result.mamba_exist:  # cleanup_after_caching_req: the node had a state
                tree.mamba.allocator.free(donated)
        new_indices, new_last_node = tree.match_prefix(token_ids)
        if new_prefix_len > len(new_indices) or req.cache_protected_len > len(new_indices):
            tree.problems.append(f"cache_unfinished_req assert: prefix_len {new_prefix_len}, cache_protected_len "
                                 f"{req.cache_protected_len}, matched {len(new_indices)}")
        req.row[req.cache_protected_len:len(new_indices)] = new_indices[req.cache_protected_len:]
        tree.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
        req.swa_uuid_for_lock = tree.inc_lock_ref(new_last_node)
        req.cache_protected_len, req.last_node = len(new_indices), new_last_node

    def cache_finished_req(self, tree: UnifiedRadixCache, alloc: SWATokenToKVPoolAllocator, req: Req,
                           is_insert: bool) -> None:
        mamba_exist = True
        if is_insert:
            token_ids = req.fill_ids[:len(req.row)]
            if tree.mamba is None:
                tree.insert(token_ids, req.row, req.cache_protected_len)
            else:  # the request's own state is offered to the tree
                mamba_exist = tree.insert(token_ids, req.row, req.cache_protected_len,
                                          mamba_value=(req.mamba_pool_idx,)).mamba_exist
        else:
            alloc.free(req.row[req.cache_protected_len:])
        tree.dec_lock_ref(req.last_node, req.swa_uuid_for_lock, skip_swa=req.swa_prefix_lock_released)
        if tree.mamba is not None and req.mamba_pool_idx is not None:
            if mamba_exist:  # cleanup_after_caching_req: free_mamba_cache (a retraction inserts nothing)
                tree.mamba.allocator.free((req.mamba_pool_idx,))
            req.mamba_pool_idx = None

    def alloc_mamba_slot(self, tree: UnifiedRadixCache) -> tuple[int, ...]:
        """`MambaComponent._alloc_mamba_slot`: one slot, evicting a Mamba state for it if none is free."""
        slot = tree.mamba.allocator.alloc(1)
        if slot is None:
            tree.evict(0, 0, 1)
            slot = tree.mamba.allocator.alloc(1)
        if slot is None:
            tree.problems.append("Can not alloc mamba cache (assert)")
            return (0,)
        return slot

    def maybe_evict_swa(self, tree: UnifiedRadixCache, req: Req, fx: list) -> None:
        """Past the window, the SWA portion of the request's lock is released once (with
        SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW on)."""
        if (not req.swa_prefix_lock_released and req.swa_uuid_for_lock is not None and req.last_node is not None
                and req.decode_batch_idx >= self.cfg.sliding_window_size):
            if self.release_window(tree, req.last_node, req.swa_uuid_for_lock):
                req.swa_prefix_lock_released = True
                fx.append(SwaLockReleased(req.rid))

    def release_window(self, tree: UnifiedRadixCache, node: UnifiedTreeNode, swa_uuid_for_lock: int) -> bool:
        """`hasattr(self.tree_cache, "dec_swa_lock_only")` (the guard of `release_leaf_lock`), then the call;
        whether it ran. pre_28161: 0.5.13's UnifiedRadixCache has no such method."""
        if not self.variant.has_dec_swa_lock_only:
            return False
        tree.dec_swa_lock_only(node, swa_uuid_for_lock)
        return True

    def watch(self, tree: UnifiedRadixCache, alloc: SWATokenToKVPoolAllocator) -> None:
        """Called on every step's live tree and allocator before the step runs (a lockstep records their calls)."""

    def sample_and_maybe_finish(self, tree: UnifiedRadixCache, alloc: SWATokenToKVPoolAllocator, req: Req,
                                statuses: list, fx: list) -> bool:
        req.output_ids.append(self.cfg.output_token(req.rid))
        if len(req.output_ids) < self.cfg.max_tokens:
            return False
        self.cache_finished_req(tree, alloc, req, is_insert=True)
        statuses[req.rid] = FINISHED
        fx.append(Released(req.rid, True))
        return True

    # -- the invariants ------------------------------------------------------------------------------------------
    def _locks(self, s: UnifiedSwaState) -> list[tuple[RequestState, tuple[int, ...]]]:
        return [(r, r.lock) for r in s.requests if r.status == RUNNING and r.lock is not None]

    def _lock_order(self, s: UnifiedSwaState) -> str | None:
        for n in s.tree.nodes:
            if not n.full_lock_ref >= n.swa_lock_ref >= n.mamba_lock_ref >= 0:
                return f"node {list(n.path)}: full lock_ref {n.full_lock_ref}, swa lock_ref {n.swa_lock_ref}, " \
                       f"mamba lock_ref {n.mamba_lock_ref}: expected full >= swa >= mamba >= 0"
        return None

    def _mamba_lock_refs(self, s: UnifiedSwaState) -> str | None:
        """A request's lock takes the Mamba lock of its node (which always has a state: a match ends only at a
        node with one) until its early release or its end."""
        if not self.cfg.num_mamba_slots:
            return None
        holders = [path for r, path in self._locks(s) if not r.swa_prefix_lock_released]
        protected = evictable = 0
        for n in s.tree.nodes:
            want = holders.count(n.path)
            if n.mamba_lock_ref != want:
                return f"node {list(n.path)}: expected mamba lock_ref {want} (running requests locking it that " \
                       f"have not released their window), got {n.mamba_lock_ref}"
            if n.mamba_value is not None:
                protected += len(n.mamba_value) if n.mamba_lock_ref else 0
                evictable += 0 if n.mamba_lock_ref else len(n.mamba_value)
        if (protected, evictable) != (s.tree.mamba_protected_size, s.tree.mamba_evictable_size):
            return f"mamba: expected protected {protected} and evictable {evictable}, got " \
                   f"{s.tree.mamba_protected_size} and {s.tree.mamba_evictable_size}"
        return None

    def _full_lock_refs(self, s: UnifiedSwaState) -> str | None:
        protected = evictable = 0
        locks = self._locks(s)
        for n in s.tree.nodes:
            want = sum(1 for _, path in locks if path[:len(n.path)] == n.path)
            if n.full_lock_ref != want:
                return f"node {list(n.path)}: expected full lock_ref {want} (requests locking it or below), got " \
                       f"{n.full_lock_ref}"
            if n.full_lock_ref:
                protected += n.key_len
            else:
                evictable += n.key_len
        if (protected, evictable) != (s.tree.full_protected_size, s.tree.full_evictable_size):
            return f"full: expected protected {protected} and evictable {evictable}, got " \
                   f"{s.tree.full_protected_size} and {s.tree.full_evictable_size}"
        return None

    def _swa_lock_within_window(self, s: UnifiedSwaState) -> str | None:
        window = self.cfg.sliding_window_size
        needing = [path for r, path in self._locks(s) if r.decode_batch_idx < window or r.swa_uuid_for_lock is None]
        for n in s.tree.nodes:
            bound = sum(1 for path in needing if path[:len(n.path)] == n.path)
            if n.swa_lock_ref > bound:
                return f"node {list(n.path)}: swa lock_ref {n.swa_lock_ref}, but only {bound} running requests " \
                       f"locking it or below are within their sliding window ({window} tokens): a window lock " \
                       f"was kept past the window"
        return None

    def _pool_accounting(self, s: UnifiedSwaState) -> str | None:
        cfg, a = self.cfg, s.allocator
        mapping = dict(a.full_to_swa)
        held = [i for r in s.requests if r.status == RUNNING for i in r.row[r.cache_protected_len:]]
        swa_protected = sum(n.key_len for n in s.tree.nodes if n.swa_value is not None and n.swa_lock_ref)
        swa_evictable = sum(n.key_len for n in s.tree.nodes if n.swa_value is not None and not n.swa_lock_ref)
        if (swa_protected, swa_evictable) != (s.tree.swa_protected_size, s.tree.swa_evictable_size):
            return f"swa: expected protected {swa_protected} and evictable {swa_evictable}, got " \
                   f"{s.tree.swa_protected_size} and {s.tree.swa_evictable_size}"
        pools = [("full", cfg.num_slots, a.full_free, [i for n in s.tree.nodes for i in n.full_value], held),
                 ("swa", cfg.num_swa_slots, a.swa_free,
                  [i for n in s.tree.nodes if n.swa_value is not None for i in n.swa_value],
                  [mapping[i] for i in held if i in mapping])]
        if cfg.num_mamba_slots:  # _check_mamba_pool: available + evictable + protected (+ running) = the pool
            pools.append(("mamba", cfg.num_mamba_slots, s.mamba_free,
                          [i for n in s.tree.nodes if n.mamba_value is not None for i in n.mamba_value],
                          [r.mamba_pool_idx for r in s.requests if r.status == RUNNING]))
        for pool, size, free, tree_slots, held_slots in pools:
            owned = list(free) + tree_slots + held_slots
            if sorted(owned) != list(range(1, size + 1)):
                return f"{pool} pool: free {len(free)} + tree {len(tree_slots)} + held {len(held_slots)} slots " \
                       f"{sorted(owned)}: expected each of 1..{size} once"
        return None

    def _all_free_when_done(self, s: UnifiedSwaState) -> str | None:
        if any(r.status != FINISHED for r in s.requests):
            return None
        if s.tree.full_protected_size or s.tree.swa_protected_size or s.tree.mamba_protected_size:
            return f"all requests ended: protected full {s.tree.full_protected_size}, swa " \
                   f"{s.tree.swa_protected_size}, mamba {s.tree.mamba_protected_size}: expected 0"
        return None

    def _decode_short(self, s: UnifiedSwaState, r: int) -> bool:
        """The next decode's slot fits neither the free and evictable slots of one pool."""
        a, t = s.allocator, s.tree
        return len(a.full_free) + t.full_evictable_size < 1 or len(a.swa_free) + t.swa_evictable_size < 1


# -- the rules ---------------------------------------------------------------------------------------------------
RULES = Rules()


def _listed(self: UnifiedSwaSystem, s: UnifiedSwaState, a: tuple) -> bool:
    return a in self.enabled(s)


@RULES.rule(Admit, when=_listed)
def _admit(self: UnifiedSwaSystem, s: UnifiedSwaState, a: Admit, tree: UnifiedRadixCache,
           alloc: SWATokenToKVPoolAllocator, reqs: dict, statuses: list, fx: list) -> None:
    req = Req(a.req, self.cfg, s.requests[a.req], tree)
    tokens = req.fill_ids
    indices, last_node = tree.match_prefix(tokens[:len(tokens) - 1])
    uuid = tree.inc_lock_ref(last_node)
    demand = len(tokens) - len(indices)
    # with a Mamba component: its own state slot (HybridReqToTokenPool.alloc) and, unless this step finishes it,
    # the slot cache_unfinished_req donates
    mamba_demand = 0 if tree.mamba is None else 1 + (len(req.output_ids) + 1 < self.cfg.max_tokens)
    if (alloc.full_available_size() + tree.full_evictable_size_ < demand
            or alloc.swa_available_size() + tree.swa_evictable_size_ < demand
            or mamba_demand and tree.mamba.allocator.available_size() + tree.mamba.evictable_size_ < mamba_demand):
        tree.dec_lock_ref(last_node, uuid)
        fx.append(Deferred(a.req))
        return
    if mamba_demand:
        (req.mamba_pool_idx,) = self.alloc_mamba_slot(tree)
    fits = self.evict_for(tree, alloc, demand)
    out = alloc.alloc(demand) if fits else None
    if out is None:
        alloc.problems.append(f"alloc({demand}) failed after evicting for it")
        out = ()
    req.row, req.cache_protected_len, req.last_node, req.swa_uuid_for_lock = list(indices) + list(out), \
        len(indices), last_node, uuid
    req.swa_prefix_lock_released, req.decode_batch_idx = False, 0
    fx.append(Admitted(a.req, len(indices)))
    reqs[a.req] = req
    statuses[a.req] = RUNNING
    if not self.sample_and_maybe_finish(tree, alloc, req, statuses, fx):
        self.cache_unfinished_req(tree, req)


@RULES.rule(Decode, when=_listed)
def _decode(self: UnifiedSwaSystem, s: UnifiedSwaState, a: Decode, tree: UnifiedRadixCache,
            alloc: SWATokenToKVPoolAllocator, reqs: dict, statuses: list, fx: list) -> None:
    req = reqs[a.req]
    if not self.evict_for(tree, alloc, 1):
        fx.append(Deferred(a.req))
        return
    req.row += alloc.alloc(1)
    req.decode_batch_idx += 1
    self.maybe_evict_swa(tree, req, fx)
    self.sample_and_maybe_finish(tree, alloc, req, statuses, fx)


@RULES.rule(Retract, when=_listed)
def _retract(self: UnifiedSwaSystem, s: UnifiedSwaState, a: Retract, tree: UnifiedRadixCache,
             alloc: SWATokenToKVPoolAllocator, reqs: dict, statuses: list, fx: list) -> None:
    req = reqs[a.req]
    self.cache_finished_req(tree, alloc, req, is_insert=False)
    fx.append(Released(a.req, False))
    statuses[a.req] = WAITING  # keeps its outputs; reset_for_retract: swa_prefix_lock_released False


def _swa_locks(s: UnifiedSwaState) -> int:
    return sum(n.swa_lock_ref for n in s.tree.nodes)


def _full_locks(s: UnifiedSwaState) -> int:
    return sum(n.full_lock_ref for n in s.tree.nodes)
