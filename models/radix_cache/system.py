"""The radix cache and the paged allocator under a few requests, as a transition system (`kvsim explore
radix-cache`).

Request r's prompt: `shared` leading 1s (every prompt shares them), then its family's token `2 + prompts[r]` up
to `prompt_len` (with `prompt_lens`, only its first `prompt_lens[r]` tokens: a prompt that is a prefix of its
family's longer one); its outputs are `8 + family` (greedy: equal prompts, equal outputs), `max_tokens` of them, so
a later request of one family hits the earlier one's prompt and outputs. The actions (`common` states what each
does upstream):

- `admit` (waiting): match, lock, evict, `alloc_extend`, the prefill step; then its result
  (`common.process_batch_result`, in a free group): the sampled token, and the request finishes (`release_kv_cache`
  with checkpoint) or is checkpointed (`checkpoint_kv_cache`). When the demand does not fit the free and evictable
  tokens it stays waiting (`deferred`).
- `decode` (running): `check_decode_mem` (a request it does not fit is `deferred`), `alloc_decode`, the step,
  its result (in a free group): a sampled token; after `max_tokens` outputs the request finishes.
- `retract` (running, only while its next decode does not fit): `release_kv_cache` without checkpoint; back to
  waiting with its outputs, matched again when admitted.
- with `num_draft_tokens` > 0 (EAGLE speculative decoding, `eagle`), `verify(req, accepted)` replaces `decode`:
  the spec `check_decode_mem`, `eagle_prepare_for_decode` (the drafts' allocation up to `nxt`), the verify
  accepting `accepted` tokens (1 .. num_draft_tokens: the correct drafts and the bonus), its result; the rejected
  drafts' slots stay allocated until the release frees them (`_release_overallocated_kv_indices`).

Invariants on every state: `pool_accounting` (free + evictable + protected + held = the pool, page by page),
`lock_refs`, `tree_shape`, `free_list`, `rows_page_aligned` (every running request's row: whole pages, its
protected part the locked path's slots), `req_slots` (the request pool's free rows and a row per running request
make the pool: `SchedulerInvariantChecker._check_req_pool`), `kv_allocated_whole_pages` (a request that drafted records
`kv_allocated_len` as whole pages, equal to the pages it holds: #31616), `all_free_when_done`; step checks (recorded
with `flag`): `match_is_longest` (every `match_prefix` a step makes, against a walk of the tree as it was),
`evict_unlocked_leaves` and `no_double_free` (what the tree's and the allocator's ops found),
`lock_ref_never_negative`. Liveness
(`every_request_finishes`): from every state all requests can finish. There is no symmetry: page ids are not
names here (the free list's order is the lockstep's to compare, and `need_sort` sorts by id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.engine.actions import Rules, tagged, type_table
from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.system import Invariant, SameAnswer, Sometimes, Thawed, flag, flagged

from . import checks, common, eagle
from .allocator import AllocatorState, PagedTokenToKVPoolAllocator
from .memory_pool import ReqToTokenPool
from .radix_cache import RadixCache, TreeState
# ACTIONS: the action records, looked up beside the system (kvsim replay)
from .request_loop import FINISHED, RUNNING, WAITING, Admit, Decode, Prompts, RequestLoop, Retract
from .variants import FIXED, RadixCacheVariant


Verify = tagged("verify", "req", "accepted")  # speculative decoding's step: the drafts' allocation, the verify
ACTIONS = type_table((Admit, Decode, Retract, Verify))
Admitted = tagged("admitted", "req", "prefix_len", "new_slots")
Deferred = tagged("deferred", "req")
Released = tagged("released", "req", "checkpointed")
EFFECTS = type_table((Admitted, Deferred, Released))


@dataclass(frozen=True)
class RadixCacheConfig(Prompts):
    """`kvsim explore radix-cache --param`: the pool, the requests' prompts and outputs."""

    num_pages: int = param(5, "pages in the pool, page 0 (reserved) not counted", minimum=1, maximum=10)
    page_size: int = param(1, "tokens per page", minimum=1, maximum=4)
    prompts: tuple[int, ...] = param((0, 1, 0), "each request's prompt family (equal families: equal prompts)",
                                     minimum=0, maximum=3)
    prompt_len: int = param(3, "tokens in each prompt", minimum=2, maximum=8)
    shared: int = param(2, "leading prompt tokens every family shares", minimum=0, maximum=8)
    prompt_lens: tuple[int, ...] = param((), "each request's prompt length: its family's prompt cut short (none "
                                         "given: prompt_len each)", minimum=2, maximum=8)
    max_tokens: int = param(2, "output tokens a request samples before it finishes", minimum=1, maximum=4)
    need_sort: bool = param(False, "the allocator stages freed pages and sorts them when an alloc runs short")
    num_draft_tokens: int = param(0, "EAGLE speculative decoding's draft tokens per step (topk 1); 0: none",
                                  minimum=0, maximum=3)

    def __post_init__(self) -> None:
        self.check_requests()
        if self.prompt_lens and (len(self.prompt_lens) != len(self.prompts) or max(self.prompt_lens) > self.prompt_len):
            raise ConfigError("param prompt_lens", f"one length per request ({len(self.prompts)}), each at most "
                              f"prompt_len ({self.prompt_len})", self.prompt_lens)
        longest = self.prompt_len + self.max_tokens - 1  # a retracted request's input before its last decode
        need = longest + self.page_size
        if self.num_draft_tokens:  # the last step's committed KV and its reserve, rounded up to whole pages
            need = max(need, eagle.ceil_align(longest - 1 + self.reserve, self.page_size))
        if self.num_pages * self.page_size < need:
            raise ConfigError("param num_pages", f"room for a request's longest input ({longest} tokens) and the "
                              f"page the scheduler's demand adds (or its drafts' reserve): "
                              f"{-(-need // self.page_size)} pages or more", self.num_pages)

    def prompt(self, req: int) -> tuple[int, ...]:
        full = super().prompt(req)
        return full[:self.prompt_lens[req]] if self.prompt_lens else full

    @property
    def reserve(self) -> int:
        return eagle.get_alloc_reserve_per_decode(self.num_draft_tokens)


class RequestState(NamedTuple):
    status: str
    output_ids: tuple[int, ...]
    row: tuple[int, ...]  # req_to_token: the slots of its positions (empty unless running)
    cache_protected_len: int
    lock: tuple[int, ...] | None  # the locked node's full token path (() the root), None unless running


class RadixState(NamedTuple):
    tree: TreeState
    allocator: AllocatorState
    requests: tuple[RequestState, ...]
    req_slots: int  # the request pool's free rows (`ReqToTokenPool`: a row per request, len(prompts) rows)
    flags: tuple[tuple[str, str], ...] = ()


class RadixCacheSystem(RequestLoop):
    def __init__(self, variant: RadixCacheVariant = FIXED, config: RadixCacheConfig = RadixCacheConfig()) -> None:
        self.name, self.variant, self.cfg = "radix-cache", variant, config
        ps = config.page_size
        # the allocator and tree the last transition left, for a transition from the very state it froze them to
        self.thawed: Thawed[tuple[PagedTokenToKVPoolAllocator, RadixCache]] = Thawed()
        self.aligned = checks.AlignedRows(ps)  # the rows and node slots found page-aligned (one check each)
        # the checks of a part of the state, answered again for an equal part (a decode changes a row, mostly)
        accounting, refs = SameAnswer(checks.pool_accounting), SameAnswer(checks.lock_refs)
        shape, free = SameAnswer(lambda tree: checks.tree_shape(tree, ps, self.aligned)), SameAnswer(checks.free_list)
        self.paths = SameAnswer(lambda tree: ({n.path: n for n in tree.nodes}, {}))  # `_rows`'s, by tree
        self.invariants = (
            Invariant("pool_accounting", lambda s: accounting(
                s.tree, s.allocator, self.held_pages(s), config.num_pages, ps),
                "free + evictable + protected + held by running requests = the pool, each page once"),
            Invariant("lock_refs", lambda s: refs(s.tree, [r.lock for r in s.requests if r.lock is not None]),
                      "a node's lock count is the requests locking it or below; protected exactly when it is > 0, "
                      "and the sizes agree with the tree"),
            Invariant("tree_shape", lambda s: shape(s.tree),
                      "nodes hold whole pages, a slot a token; children start with distinct pages"),
            Invariant("free_list", lambda s: free(s.allocator),
                      "no page twice in the free list, never page 0"),
            Invariant("rows_page_aligned", self._rows,
                      "a running request's row is page-aligned and its protected part is its locked path's slots"),
            Invariant("kv_allocated_whole_pages", self._kv_allocated,
                      "a request that drafted records kv_allocated_len as whole pages, equal to its protected part "
                      "and the pages it holds (nothing allocated and unrecorded), and committed <= allocated"),
            Invariant("req_slots", self._req_slots,
                      "free request-pool rows + a row per running request = the pool (SchedulerInvariantChecker's "
                      "_check_req_pool, no sessions), and no admission finds the pool empty"),
            Invariant("all_free_when_done", self._all_free_when_done,
                      "once every request has ended every page is free or evictable"),
            Invariant("match_is_longest", flagged("match_is_longest"),
                      "match_prefix returns the longest cached page-aligned prefix of the key, and its slots"),
            Invariant("evict_unlocked_leaves", flagged("evict_unlocked_leaves"),
                      "evict takes only unlocked leaves"),
            Invariant("no_double_free", flagged("no_double_free"),
                      "no page freed while free, page 0 never, segments start on a page boundary, no alloc fails "
                      "after the eviction that made room for it"),
            Invariant("lock_ref_never_negative", flagged("lock_ref_never_negative"),
                      "dec_lock_ref never takes a count below 0"),
        )
        self.sometimes = (
            Sometimes("a_prefix_hit", self._hits, "admit matches a cached prefix of the request's prompt", step=True),
            Sometimes("a_cached_prefix_is_evicted", lambda s, a, t: cached_tokens(t.tree) < cached_tokens(s.tree),
                      "evict frees cached pages (the tree holds fewer tokens after the step)", step=True),
            Sometimes("a_request_finishes_and_is_cached",
                      lambda s: any(r.status == FINISHED for r in s.requests) and bool(s.tree.nodes),
                      "a finished request's KV is left in the tree (release_kv_cache with checkpoint)"),
        ) + ((Sometimes("a_draft_is_rejected",
                        lambda s, a, t: type(a) is Verify and a.accepted < config.num_draft_tokens,
                        "a verify rejects drafts (their slots stay allocated until the release)", step=True),)
             if config.num_draft_tokens else ())

    # -- the contract ------------------------------------------------------------------------------------------
    def initial_states(self) -> tuple[RadixState, ...]:
        cfg = self.cfg
        alloc = PagedTokenToKVPoolAllocator(cfg.num_pages, cfg.page_size, cfg.need_sort)
        tree = RadixCache(alloc, cfg.page_size)
        requests = tuple(RequestState(WAITING, (), (), 0, None) for _ in cfg.prompts)
        return (RadixState(tree.freeze(), alloc.freeze(), requests, len(cfg.prompts)),)

    def allows(self, s: RadixState, a: tuple) -> bool:
        return RULES.allows(self, s, a)

    def thaw(self, s: RadixState) -> tuple[PagedTokenToKVPoolAllocator, RadixCache]:
        cfg = self.cfg
        alloc = PagedTokenToKVPoolAllocator.thaw(s.allocator, cfg.num_pages, cfg.page_size, cfg.need_sort)
        return alloc, RadixCache.thaw(s.tree, alloc, cfg.page_size)

    def transition(self, s: RadixState, action: tuple) -> tuple[RadixState, tuple[tuple, ...]]:
        cfg = self.cfg
        alloc, tree = self.thawed.take(s, lambda: self.thaw(s))
        tree.req_to_token_pool = pool = ReqToTokenPool(len(cfg.prompts), s.req_slots)
        effect, action = RULES.effect(action)
        requests = list(s.requests)
        fx: list[tuple] = []
        found: list[tuple[str, str]] = []
        self._watch_matches(tree, found)
        effect(self, s, action, tree, alloc, requests, fx, found)
        del tree.match_prefix  # the step's watch
        after = RadixState(tree.freeze(), alloc.freeze(), tuple(requests), pool.free_slots, s.flags)
        for problem in tree.problems:
            found.append(("lock_ref_never_negative" if "lock_ref" in problem and "went to" in problem
                          else "evict_unlocked_leaves", problem))
        found += [("no_double_free", p) for p in alloc.problems]
        found += [("req_slots", p) for p in pool.problems]
        tree.problems.clear()  # read: the next step's start empty, as a thaw's do
        alloc.problems.clear()
        for name, message in found:
            after = flag(after, name, message)
        self.thawed.keep(after, (alloc, tree))
        return after, tuple(fx)

    def _hits(self, s: RadixState, a: tuple, t: RadixState) -> bool:
        """`a` admits a request whose match found cached pages (its `Admitted` effect's prefix)."""
        return type(a) is Admit and any(type(e) is Admitted and e.prefix_len for e in self.transition(s, a)[1])

    # -- the model's side of a request --------------------------------------------------------------------------
    def req(self, s: RadixState, r: int, tree: RadixCache) -> common.Req:
        rs = s.requests[r]
        return common.Req(r, self.cfg.prompt(r), list(rs.output_ids), list(rs.row), rs.cache_protected_len,
                          rs.cache_protected_len, None if rs.lock is None else tree.node_at(rs.lock))

    @staticmethod
    def running(req: common.Req) -> RequestState:
        return RequestState(RUNNING, tuple(req.output_ids), tuple(req.row), req.cache_protected_len,
                            common.path_of(req.lock))

    def after_step(self, tree: RadixCache, alloc: PagedTokenToKVPoolAllocator, req: common.Req, fx: list,
                   prefill: bool) -> RequestState:
        """The step computed the request's row; the scheduler processes its result (`process_batch_result`): a
        token sampled, the release after `max_tokens`, else after a prefill the checkpoint."""
        finished = len(req.output_ids) + 1 >= self.cfg.max_tokens
        common.process_batch_result(tree, alloc, req, self.cfg.output_token(req.rid), finished, prefill)
        if finished:
            fx.append(Released(req.rid, True))
            return RequestState(FINISHED, tuple(req.output_ids), (), 0, None)
        return self.running(req)

    def held_pages(self, s: RadixState) -> list[list[int]]:
        return [common.rows_pages(r.row, r.cache_protected_len, self.cfg.page_size) for r in s.requests
                if r.status == RUNNING]

    def enabled(self, s: RadixState) -> list[tuple]:
        """The request loop's actions; with speculative decoding each decode is a verify accepting 1 .. num_draft_tokens
        tokens (no more than the request has left to sample)."""
        actions = super().enabled(s)
        if not self.cfg.num_draft_tokens:
            return actions
        left = lambda r: self.cfg.max_tokens - len(s.requests[r].output_ids)  # noqa: E731
        return [v for a in actions for v in ([Verify(a.req, k) for k in range(1, min(self.cfg.num_draft_tokens,
                                                                                  left(a.req)) + 1)]
                                            if type(a) is Decode else [a])]

    def _decode_short(self, s: RadixState, r: int) -> bool:
        """`check_decode_mem` would fail for r: its next page does not fit the free and evictable tokens."""
        req = s.requests[r]
        model_req = common.Req(r, self.cfg.prompt(r), list(req.output_ids), list(req.row))
        need = eagle.decode_demand(model_req, self.cfg.reserve, self.cfg.page_size) if self.cfg.num_draft_tokens \
            else common.decode_demand(model_req, self.cfg.page_size)
        free = (len(s.allocator.free_pages) + len(s.allocator.staged_pages)) * self.cfg.page_size
        return free + s.tree.evictable_size < need

    def _watch_matches(self, tree: RadixCache, found: list) -> None:
        """Check every `match_prefix` of the step against `checks.longest_prefix` on the tree as it was."""
        match = tree.match_prefix
        ps = self.cfg.page_size

        def checked(tokens):
            before = tree.freeze()
            prefix_len, indices, node = match(tokens)
            problem = checks.match_is_longest(before, tokens, ps, prefix_len, indices)
            if problem is not None:
                found.append(("match_is_longest", problem))
            return prefix_len, indices, node

        tree.match_prefix = checked

    def _rows(self, s: RadixState) -> str | None:
        ps = self.cfg.page_size
        nodes: dict | None = None
        slots: dict[tuple[int, ...], tuple[int, ...] | None] = {}
        for r, req in enumerate(s.requests):
            if req.status != RUNNING:
                if req.row or req.lock is not None:
                    return f"request {r} ({req.status}): expected no row and no lock, got {list(req.row)}, " \
                           f"lock {req.lock}"
                continue
            problem = self.aligned(req.row)
            if problem is None and req.cache_protected_len % ps:
                problem = f"cache_protected_len {req.cache_protected_len} is not page-aligned"
            if problem is not None:
                return f"request {r}: {problem}"
            if req.lock is None:
                return f"request {r} (running): expected a locked node, got none"
            if nodes is None:  # the tree's nodes by path, and the slots of each lock met in an equal tree
                nodes, slots = self.paths(s.tree)
            locked = slots.get(req.lock, False)
            if locked is False:
                locked = slots[req.lock] = checks.path_slots(nodes, req.lock)
            if locked is None:
                return f"request {r}: its lock {list(req.lock)} is not a node's path, or a node on it is missing"
            if tuple(req.row[:req.cache_protected_len]) != locked:
                return f"request {r}: its protected part {list(req.row[:req.cache_protected_len])} is not its " \
                       f"locked path's slots {list(locked)}"
        return None

    def _kv_allocated(self, s: RadixState) -> str | None:
        ps = self.cfg.page_size
        for r, rs in enumerate(s.requests):
            if rs.status != RUNNING:
                continue
            req = common.Req(r, self.cfg.prompt(r), list(rs.output_ids), list(rs.row))
            allocated, committed = req.kv_allocated_len, req.kv_committed_len
            if committed > allocated:
                return f"request {r}: kv_committed_len {committed} > kv_allocated_len {allocated}"
            if allocated == committed:  # no drafts: the row ends where the KV does (a prefill's partial page)
                continue
            footprint = rs.cache_protected_len + len(set(common.rows_pages(rs.row, rs.cache_protected_len, ps))) * ps
            if allocated % ps or allocated != footprint:
                return f"request {r}: kv_allocated_len {allocated} (committed {committed}): expected whole pages " \
                       f"equal to the allocator's footprint {footprint} (cache_protected_len {rs.cache_protected_len}" \
                       f" + its pages x {ps}): {footprint - allocated} slots allocated and recorded by nobody"
        return None

    def _req_slots(self, s: RadixState) -> str | None:
        problem = flagged("req_slots")(s)
        if problem is not None:
            return problem
        running = sum(1 for r in s.requests if r.status == RUNNING)
        if s.req_slots + running != len(self.cfg.prompts):
            return f"request pool: {s.req_slots} free rows + {running} running requests, expected the pool's " \
                   f"{len(self.cfg.prompts)} rows"
        return None

    def _all_free_when_done(self, s: RadixState) -> str | None:
        if any(r.status != FINISHED for r in s.requests):
            return None
        free = (len(s.allocator.free_pages) + len(s.allocator.staged_pages)) * self.cfg.page_size
        if s.tree.protected_size or free + s.tree.evictable_size != self.cfg.num_pages * self.cfg.page_size:
            return f"all requests ended: free {free} + evictable {s.tree.evictable_size} tokens, protected " \
                   f"{s.tree.protected_size}: expected the pool ({self.cfg.num_pages * self.cfg.page_size}) " \
                   f"free or evictable"
        return None


# -- the rules ---------------------------------------------------------------------------------------------------
RULES = Rules()


def _listed(self: RadixCacheSystem, s: RadixState, a: tuple) -> bool:
    return a in self.enabled(s)


@RULES.rule(Admit, when=_listed)
def _admit(self: RadixCacheSystem, s: RadixState, a: Admit, tree: RadixCache, alloc: PagedTokenToKVPoolAllocator,
           requests: list, fx: list, found: list) -> None:
    req = self.req(s, a.req, tree)
    admitted = common.admit(tree, alloc, req)
    if admitted is None:
        fx.append(Deferred(a.req))
        return
    fx.append(Admitted(a.req, *admitted))
    requests[a.req] = self.after_step(tree, alloc, req, fx, prefill=True)


@RULES.rule(Decode, when=_listed)
def _decode(self: RadixCacheSystem, s: RadixState, a: Decode, tree: RadixCache, alloc: PagedTokenToKVPoolAllocator,
            requests: list, fx: list, found: list) -> None:
    req = self.req(s, a.req, tree)
    if not common.check_decode_mem(tree, alloc, req):
        fx.append(Deferred(a.req))
        requests[a.req] = self.running(req)
        return
    common.alloc_decode(tree, alloc, req)
    requests[a.req] = self.after_step(tree, alloc, req, fx, prefill=False)


@RULES.rule(Retract, when=_listed)
def _retract(self: RadixCacheSystem, s: RadixState, a: Retract, tree: RadixCache,
             alloc: PagedTokenToKVPoolAllocator, requests: list, fx: list, found: list) -> None:
    req = self.req(s, a.req, tree)
    common.release_kv_cache(tree, alloc, req, checkpointed=False)
    fx.append(Released(a.req, False))
    requests[a.req] = RequestState(WAITING, tuple(req.output_ids), (), 0, None)


@RULES.rule(Verify, when=_listed)
def _verify(self: RadixCacheSystem, s: RadixState, a: Verify, tree: RadixCache, alloc: PagedTokenToKVPoolAllocator,
            requests: list, fx: list, found: list) -> None:
    req = self.req(s, a.req, tree)
    if not eagle.check_decode_mem(tree, alloc, req, self.cfg.reserve):
        fx.append(Deferred(a.req))
        requests[a.req] = self.running(req)
        return
    eagle.eagle_prepare_for_decode(tree, alloc, req, self.cfg.reserve, self.variant.page_aligned_nxt)
    for _ in range(a.accepted - 1):  # the accepted drafts; the bonus token is the step's sampled one
        common.sample(req, self.cfg.output_token(a.req))
    requests[a.req] = self.after_step(tree, alloc, req, fx, prefill=False)


def cached_tokens(tree: TreeState) -> int:
    """Tokens the tree holds (a split keeps them; only an eviction takes some away)."""
    return sum(node.key_len for node in tree.nodes)
