"""The KV cache manager under a few requests, as a transition system (`kvsim explore kv-cache-manager`).

Request r's prompt is from a small alphabet: `shared` leading 1s (every prompt shares them), then its
family's token, `2 + prompts[r]`, up to `prompt_len`; requests of one family have one prompt (`prompts=0,1,0`
is A -> B -> A). The model's output token for a family is `8 + family` (greedy: equal prompts, equal outputs),
so decode blocks are shared too. A request:

- `schedule` (waiting): `get_computed_blocks`, then `allocate_slots` for its tokens after the hit; when the pool
  cannot give the blocks (`deferred`), nothing changes. Before it, the local hit the scheduler would hand a KV
  connector (`connector_local_hit`, read-only) is checked too. Prefill runs in the step and samples a token: the
  request is running, its last sampled token not yet computed.
- `decode` (running): `allocate_slots(1)` for that token, computed in the step, then the next token sampled;
  after `max_tokens` outputs the request finishes and is freed.
- `lookahead` (0 by default): every schedule and decode also asks for `num_lookahead_tokens` speculative slots
  after the step's tokens (a drafter's; the model's drafts are never accepted, so they stay slots, never cached).
- `finish` (running): it stops early (a stop token) and is freed. `preempt` (running): freed, back to waiting
  with its tokens, recomputed from token 0 when scheduled again.
- `reset`: `reset_prefix_cache` (refused while a block is held), `resets` times at most.

`groups` names the KV cache groups (`full`, or a hybrid: `full,swa`, `full,mamba`, `full,swa,mamba`, `full,local`)
over the one pool; a sliding window's width is `sliding_window` tokens, chunked local attention's chunk
`attention_chunk_size` tokens (a multiple of the block size). Mamba caches its states in the variant's prefix-caching
mode: `align` on `fixed` (0.33.0: a state is cached only where an allocation ends on a block boundary, so a request
whose prompt is as long as another's never hits the Mamba group; a preempted request's recompute does), `all` on
`mamba_all` and `pre_48195` (a state per block). A deferred `decode` has still freed the blocks the
window left behind (upstream frees them before it counts the blocks it needs).

Each step's KV events come back as its effects; the state keeps the view of the cache they describe
(`announced`). Invariants on every state: ref counts, the free queue, pool accounting, the cached map, the
eviction order, the tables matching the requests (their lookahead slots included), no lookahead slot cached, the events matching the cache, nothing held once all ended;
step checks (recorded with `flag`): a hit is a proper prefix of the request's chain, a hybrid hit (and the
connector's local hit) is one every group backs, a sliding-window, chunked-local or Mamba group holds no block
wholly before its window (the current chunk) after an allocation, `free` puts the released
blocks where upstream's eviction order says (tail first, uncached to the front, cached to the back), every `BlockRemoved`
names a hash a `BlockStored` named before. Liveness (`every_request_finishes`): from every state all requests
can finish. Block ids are names (`symmetry`): the explorer keeps one state per renaming of the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from kvsim.engine.actions import Rules
from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.system import Invariant, Sometimes, Thawed, flag, flagged

from . import checks, symmetry
from .actions import Allocated, Decode, Deferred, Events, Finish, Freed, Preempt, Reset, ResetDone, Schedule
from .kv_cache_manager import KVCacheManager, ManagerState, Request, cdiv, connector_local_hit
from .single_type_kv_cache_manager import FULL, MAMBA
from .kv_cache_utils import BlockHash
from .variants import FIXED, CacheManagerVariant

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


GROUP_CHOICES = ("full", "full,swa", "full,mamba", "full,swa,mamba", "full,local")


@dataclass(frozen=True)
class CacheManagerConfig:
    """`kvsim explore kv-cache-manager --param`: the pool, the requests' prompts and outputs, the resets."""

    num_blocks: int = param(4, "blocks in the pool, the null block (block 0) included", minimum=2, maximum=10)
    block_size: int = param(2, "tokens per block", minimum=1, maximum=4)
    prompts: tuple[int, ...] = param((0, 1, 0), "each request's prompt family (equal families: equal prompts)",
                                     minimum=0, maximum=3)
    prompt_len: int = param(3, "tokens in each prompt", minimum=1, maximum=6)
    shared: int = param(2, "leading prompt tokens every family shares", minimum=0, maximum=6)
    max_tokens: int = param(2, "output tokens a request samples before it finishes", minimum=1, maximum=3)
    resets: int = param(1, "reset_prefix_cache calls allowed", minimum=0, maximum=2)
    groups: str = param("full", "the KV cache groups, in group order (each takes its own blocks: a hybrid needs a "
                        "larger pool)", choices=GROUP_CHOICES)
    sliding_window: int = param(3, "tokens a sliding-window group attends to (groups with swa)", minimum=2,
                                maximum=8)
    attention_chunk_size: int = param(4, "tokens of a chunk of chunked local attention (groups with local; a multiple "
                                      "of block_size)", minimum=1, maximum=8)
    lookahead: int = param(0, "num_lookahead_tokens: a drafter's speculative slots every schedule and decode "
                           "allocates after the step's tokens (never cached; Mamba in mode align takes none)",
                           minimum=0, maximum=4)

    # the explorer's bound on requests; the timed simulation's workload config (`sim.WorkloadConfig`) raises it
    max_requests: ClassVar[int] = 3

    def __post_init__(self) -> None:
        if not 1 <= len(self.prompts) <= self.max_requests:
            raise ConfigError("param prompts", f"one to {self.max_requests} requests", len(self.prompts))
        if self.shared > self.prompt_len:
            raise ConfigError("param shared", f"at most prompt_len ({self.prompt_len})", self.shared)
        if "local" in self.kinds and self.attention_chunk_size % self.block_size:
            # upstream's hit puts null blocks before the chunk's first whole block: a chunk that starts inside a
            # block would leave the next token's chunk unread
            raise ConfigError("param attention_chunk_size", f"a multiple of block_size ({self.block_size})",
                              self.attention_chunk_size)

    def prompt(self, req: int) -> tuple[int, ...]:
        return (1,) * self.shared + (2 + self.prompts[req],) * (self.prompt_len - self.shared)

    def output_token(self, req: int) -> int:
        return 8 + self.prompts[req]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.groups.split(","))


class RequestState(NamedTuple):
    status: str  # WAITING, RUNNING or FINISHED
    token_ids: tuple[int, ...]  # prompt, then the sampled outputs (empty once finished)
    num_computed_tokens: int


class CacheState(NamedTuple):
    manager: ManagerState
    requests: tuple[RequestState, ...]
    announced: tuple[tuple[BlockHash, int], ...]  # the events' view: hash -> blocks stored, not removed
    resets_left: int
    flags: tuple[tuple[str, str], ...] = ()  # (invariant, message) a step broke


class CacheManagerSystem:
    liveness = "every_request_finishes"

    def __init__(self, variant: CacheManagerVariant = FIXED, config: CacheManagerConfig = CacheManagerConfig()) \
            -> None:
        self.name, self.variant, self.cfg = "kv-cache-manager", variant, config
        self.thawed: Thawed[KVCacheManager] = Thawed()  # the manager the last transition left
        self.invariants = (
            Invariant("ref_count_is_holders", lambda s: checks.ref_count_is_holders(s.manager.pool, s.manager.tables),
                      "a block's ref_cnt is the number of requests holding it"),
            Invariant("free_queue_iff_unreferenced", lambda s: checks.free_queue_iff_unreferenced(s.manager.pool),
                      "a block is in the free queue exactly when its ref_cnt is 0 (the null block never)"),
            Invariant("pool_accounting", lambda s: checks.pool_accounting(s.manager.pool),
                      "free + held + the null block = the pool size"),
            Invariant("cached_map_hashes", lambda s: checks.cached_map_hashes(s.manager.pool),
                      "the cached map's entries point at blocks whose hash matches, and back"),
            Invariant("free_queue_order", lambda s: checks.free_queue_order(s.manager.pool),
                      "eviction order: uncached free blocks before cached ones"),
            Invariant("tables_match_requests", self._tables,
                      "a running request holds the blocks of its computed tokens and its lookahead slots; no other "
                      "request holds any"),
            Invariant("lookahead_never_cached", self._lookahead_never_cached,
                      "no block past a running request's computed full blocks (its lookahead slots) is cached"),
            Invariant("events_mirror_cache", lambda s: checks.events_mirror_cache(s.manager.pool, s.announced),
                      "the KV events so far describe the cached map"),
            all_free_when_done(FINISHED),
            Invariant("hit_is_proper_prefix", flagged("hit_is_proper_prefix"),
                      "a cache hit is a prefix of the request's hash chain, never the whole prompt"),
            Invariant("freed_in_eviction_order", flagged("freed_in_eviction_order"),
                      "free puts a request's released blocks tail first: uncached at the front, cached at the back"),
            Invariant("removed_was_stored", flagged("removed_was_stored"),
                      "every BlockRemoved names a hash a BlockStored named before"),
            Invariant("hybrid_hit_backed", flagged("hybrid_hit_backed"),
                      "a hit is one every KV cache group backs; the local hit handed to a KV connector, the "
                      "full-attention group (a lagging group is the connector's: upstream's hit_diverged)"),
            Invariant("no_block_outside_window", flagged("no_block_outside_window"),
                      "after an allocation a sliding-window, chunked-local or Mamba group holds no block wholly before "
                      "its window (the current chunk)"),
        )
        self.sometimes = (
            Sometimes("a_cached_block_is_evicted", lambda s, a, t: type(a) is not Reset and _uncached(s, t),
                      "an allocation takes a cached block from the free queue: its hash leaves the cache", step=True),
            Sometimes("a_preempted_request_resumes", self._resumes,
                      "a preempted request is scheduled again (recomputed from token 0)", step=True),
            Sometimes("two_requests_share_a_block", lambda s: any(n >= 2 for n in s.manager.pool.refs),
                      "a prefix hit: two running requests hold one cached block"),
        )

    # -- the contract ----------------------------------------------------------------------------------------
    def initial_states(self) -> tuple[CacheState, ...]:
        cfg = self.cfg
        m = KVCacheManager(cfg.num_blocks, cfg.block_size, len(cfg.prompts), cfg.kinds, cfg.sliding_window,
                           self.variant.mamba_cache_mode, cfg.attention_chunk_size)
        requests = tuple(RequestState(WAITING, cfg.prompt(r), 0) for r in range(len(cfg.prompts)))
        return (CacheState(m.freeze(), requests, (), cfg.resets),)

    def done(self, s: CacheState) -> bool:
        return not s.flags and all(r.status == FINISHED for r in s.requests)

    def enabled(self, s: CacheState) -> list[tuple]:
        if s.flags:
            return []
        actions: list[tuple] = []
        for r, req in enumerate(s.requests):
            if req.status == WAITING:
                actions.append(Schedule(r))
            elif req.status == RUNNING:
                actions.extend((Decode(r), Finish(r), Preempt(r)))
        if s.resets_left:
            actions.append(Reset())
        return actions

    def canonical(self, s: CacheState) -> CacheState:
        """One representative per renaming of the blocks (`symmetry`): the explorer's reduction."""
        return symmetry.canonical(s)

    def allows(self, s: CacheState, a: tuple) -> bool:
        return RULES.allows(self, s, a)

    def step(self, s: CacheState, action: tuple) -> CacheState:
        return self.transition(s, action)[0]

    def transition(self, s: CacheState, action: tuple) -> tuple[CacheState, tuple[tuple, ...]]:
        m = self.thawed.take(s.manager, lambda: KVCacheManager.thaw(
            s.manager, self.cfg.block_size, self.cfg.kinds, self.cfg.sliding_window, self.variant.mamba_cache_mode,
            self.cfg.attention_chunk_size))
        effect, action = RULES.effect(action)
        requests = list(s.requests)
        fx: list[tuple] = []
        ch: dict[str, object] = {}  # what the rule changes besides the manager and the requests
        effect(self, s, action, m, requests, fx, ch)
        events = m.take_events()
        announced, problem = checks.announce(s.announced, events)
        if events:
            fx.append(Events(events))
        after = CacheState(m.freeze(), tuple(requests), announced, ch.get("resets_left", s.resets_left), s.flags)
        self.thawed.keep(after.manager, m)
        for name, message in ch.get("flags", ()):
            after = flag(after, name, message)
        if problem is not None:
            after = flag(after, "removed_was_stored", problem)
        return after, tuple(fx)

    # -- the model's side of a request -----------------------------------------------------------------------
    def request(self, s: CacheState, r: int) -> Request:
        req = s.requests[r]
        return Request(r, list(req.token_ids), self.cfg.prompt_len, req.num_computed_tokens, self.cfg.block_size)

    def sample(self, m: KVCacheManager, req: Request, fx: list, ch: dict) -> RequestState:
        """The step computed every token of `req`; it samples the next one, and finishes after `max_tokens`."""
        tokens = tuple(req.all_token_ids) + (self.cfg.output_token(req.request_id),)
        if len(tokens) - req.num_prompt_tokens >= self.cfg.max_tokens:
            return self.free(m, req, fx, ch)
        return RequestState(RUNNING, tokens, req.num_tokens)

    @staticmethod
    def free(m: KVCacheManager, req: Request, fx: list, ch: dict) -> RequestState:
        """`free`, checked against upstream's eviction order (`checks.freed_in_eviction_order`, group by group)."""
        tables = tuple(tuple(ids) for ids in m.get_block_ids(req.request_id))
        queue = tuple(b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks())
        fx.append(Freed(req.request_id, tables[0] if len(tables) == 1 else tables))
        m.free(req)
        problem = checks.freed_groups_in_eviction_order(queue, tables, m.block_pool.freeze())
        if problem is not None:
            ch["flags"] = ch.get("flags", ()) + (("freed_in_eviction_order", problem),)
        return RequestState(FINISHED, (), 0)

    def check_hit(self, m: KVCacheManager, req: Request, hit: tuple, num_hit: int, connector: bool, ch: dict) \
            -> None:
        """`checks.hit_backed` on a hit's blocks, each group's against the request's chain keyed for that group
        (`checks.connector_hit_backed` on the local hit handed to the connector)."""
        keys = [[m.block_pool.key(h, g) for h in req.block_hashes] for g in range(len(self.cfg.kinds))]
        hashes = [[None if b.is_null else b.block_hash for b in blocks] for blocks in hit]
        cfg = self.cfg
        problem = checks.connector_hit_backed(cfg.kinds, hashes, keys, num_hit, cfg.block_size, cfg.sliding_window,
                                              cfg.attention_chunk_size) \
            if connector else checks.hit_backed(cfg.kinds, hashes, keys, num_hit, cfg.block_size, cfg.sliding_window,
                                                "the hit", cfg.attention_chunk_size)
        if problem is not None:
            ch["flags"] = ch.get("flags", ()) + (("hybrid_hit_backed", problem),)

    def check_window(self, m: KVCacheManager, req: Request, num_computed_tokens: int, ch: dict) -> None:
        problem = checks.no_block_outside_window(self.cfg.kinds, m.get_block_ids(req.request_id), num_computed_tokens,
                                                 self.cfg.block_size, self.cfg.sliding_window,
                                                 self.cfg.attention_chunk_size)
        if problem is not None:
            ch["flags"] = ch.get("flags", ()) + (("no_block_outside_window", problem),)

    @staticmethod
    def ids(m: KVCacheManager, blocks: tuple) -> tuple:
        """A step's blocks as ids: group 0's alone for one group, else one tuple per group."""
        ids = tuple(tuple(b.block_id for b in group) for group in blocks)
        return ids[0] if len(m.groups) == 1 else ids

    # -- reachability ----------------------------------------------------------------------------------------
    def _resumes(self, s: CacheState, a: tuple, t: CacheState) -> bool:
        """`a` schedules a preempted request (waiting with outputs) and it runs (or finishes) again."""
        if type(a) is not Schedule:
            return False
        req = s.requests[a.req]
        return req.status == WAITING and len(req.token_ids) > self.cfg.prompt_len and t.requests[a.req].status != WAITING

    # -- invariants ------------------------------------------------------------------------------------------
    def _tables(self, s: CacheState) -> str | None:
        num_requests = len(s.requests)
        for i, table in enumerate(s.manager.tables):
            g, r = divmod(i, num_requests)
            req, kind = s.requests[r], self.cfg.kinds[g]
            where = f"request {r}" if len(self.cfg.kinds) == 1 else f"request {r}, group {g} ({kind})"
            if req.status != RUNNING:
                if table is not None:
                    return f"{where} ({req.status}): expected no blocks, got {list(table[0])}"
                continue
            if table is None:
                return f"{where} (running): expected a block table, got none"
            ids, _ = table
            real = [b for b in ids if b]
            lookahead = 0 if kind == MAMBA and self.variant.mamba_cache_mode_align else self.cfg.lookahead
            want = cdiv(req.num_computed_tokens + lookahead, self.cfg.block_size)
            if len(ids) != want or len(set(real)) != len(real) or (kind == FULL and 0 in ids):
                nulls = "" if kind == FULL else " (null blocks before the window)"
                return f"{where} (running, {req.num_computed_tokens} tokens computed): expected {want} " \
                       f"distinct non-null blocks{nulls}, got {list(ids)}"
        return None

    def _lookahead_never_cached(self, s: CacheState) -> str | None:
        num_requests = len(s.requests)
        for i, table in enumerate(s.manager.tables):
            g, r = divmod(i, num_requests)
            req = s.requests[r]
            if table is None or req.status != RUNNING:
                continue
            problem = checks.lookahead_never_cached(table[0], table[1], req.num_computed_tokens, self.cfg.block_size,
                                                    s.manager.pool.hashes)
            if problem is not None:
                return f"request {r}, group {g} ({self.cfg.kinds[g]}): {problem}"
        return None


def all_free_when_done(ended: str) -> Invariant:
    """The invariant `all_free_when_done` of a system whose states hold the manager and the requests, a request
    ending in status `ended`: this system's (`finished`) and the P/D scheduler's around it (`done`)."""

    def check(s) -> str | None:
        if any(r.status != ended for r in s.requests):
            return None
        return checks.all_free_when_done(s.manager.pool, s.manager.tables)

    return Invariant("all_free_when_done", check, "every block is free once every request has ended")


# -- the rules: each action's precondition beside its effect, by record type ----------------------------------
# An effect is `effect(system, state, action, manager, requests, effects, ch)`: it acts on the live manager and
# the requests list, appends what it did to `effects`, and writes into `ch` the flags it found and the budget
# it spent. A request's action is enabled when `enabled` lists it (its status), a reset while resets are left.
RULES = Rules()


def _listed(self: CacheManagerSystem, s: CacheState, a: tuple) -> bool:
    return a in self.enabled(s)


@RULES.rule(Schedule, when=_listed)
def _schedule(self: CacheManagerSystem, s: CacheState, a: Schedule, m: KVCacheManager, requests: list, fx: list,
              ch: dict) -> None:
    req = self.request(s, a.req)
    kinds = self.cfg.kinds
    if len(kinds) > 1:  # one group: the connector's hit is `get_computed_blocks`'s
        connector_hit, num_connector = connector_local_hit(m, req, self.variant.connector_hit_from_full_attention)
        self.check_hit(m, req, connector_hit, num_connector, True, ch)
    hit, num_hit = m.get_computed_blocks(req)
    first = hit[kinds.index(FULL)]
    hashes = [b.block_hash if len(kinds) == 1 else b.block_hash[1] for b in first]
    problem = checks.hit_is_proper_prefix(req.block_hashes, hashes, num_hit, req.num_tokens, self.cfg.block_size)
    if problem is not None:
        ch["flags"] = ch.get("flags", ()) + (("hit_is_proper_prefix", problem),)
    if len(kinds) > 1:
        self.check_hit(m, req, hit, num_hit, False, ch)
    hit_ids = self.ids(m, hit)
    new = m.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit, self.cfg.lookahead)
    if new is None:
        fx.append(Deferred(a.req))
        return
    self.check_window(m, req, num_hit, ch)
    fx.append(Allocated(a.req, hit_ids, num_hit, self.ids(m, new)))
    req.num_computed_tokens = req.num_tokens
    requests[a.req] = self.sample(m, req, fx, ch)


@RULES.rule(Decode, when=_listed)
def _decode(self: CacheManagerSystem, s: CacheState, a: Decode, m: KVCacheManager, requests: list, fx: list,
            ch: dict) -> None:
    req = self.request(s, a.req)
    new = m.allocate_slots(req, req.num_tokens - req.num_computed_tokens, num_lookahead_tokens=self.cfg.lookahead)
    if new is None:
        fx.append(Deferred(a.req))
        return
    self.check_window(m, req, req.num_computed_tokens, ch)
    fx.append(Allocated(a.req, self.ids(m, ((),) * len(m.groups)), 0, self.ids(m, new)))
    req.num_computed_tokens = req.num_tokens
    requests[a.req] = self.sample(m, req, fx, ch)


@RULES.rule(Finish, when=_listed)
def _finish(self: CacheManagerSystem, s: CacheState, a: Finish, m: KVCacheManager, requests: list, fx: list,
            ch: dict) -> None:
    requests[a.req] = self.free(m, self.request(s, a.req), fx, ch)


@RULES.rule(Preempt, when=_listed)
def _preempt(self: CacheManagerSystem, s: CacheState, a: Preempt, m: KVCacheManager, requests: list, fx: list,
             ch: dict) -> None:
    req = self.request(s, a.req)
    self.free(m, req, fx, ch)
    requests[a.req] = RequestState(WAITING, s.requests[a.req].token_ids, 0)


@RULES.rule(Reset, when=_listed)
def _reset(self: CacheManagerSystem, s: CacheState, a: Reset, m: KVCacheManager, requests: list, fx: list,
           ch: dict) -> None:
    fx.append(ResetDone(m.reset_prefix_cache()))
    ch["resets_left"] = s.resets_left - 1


def _uncached(s: CacheState, t: CacheState) -> bool:
    """Some hash cached in `s` is not in `t`."""
    after = {h for h, _ in t.manager.pool.cached}
    return any(h not in after for h, _ in s.manager.pool.cached)
