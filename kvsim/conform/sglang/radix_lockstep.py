"""SGLang's real `RadixCache` and paged allocator (imported from the release, `real_radix.RadixDriver` in the child)
in lockstep with the `radix-cache` model, one Hypothesis state machine driving both (`LOCKSTEP`).

A program starts from a configuration Hypothesis draws within the model's bounds (`RadixCacheConfig`: pages, page
size 2 or 4 (see page size 1 below), up to three requests' prompt families, prompt length, the prefix every prompt
shares, output tokens, `need_sort`) and then makes the model's own actions, one a step among those the model enables
(`step(admit(req=0))`): `admit(r)` (match, lock, the admission test, evict, `alloc_extend`, the prefill step and its
sampled token, then `checkpoint_kv_cache`, or `release_kv_cache` when the request has sampled `max_tokens`),
`decode(r)` (`check_decode_mem`, `alloc_paged_token_slots_decode` for the last sampled token, a new token, the
release at `max_tokens`), `retract(r)` (`release_kv_cache` without checkpoint; the request keeps its outputs and
is matched again, prompt and outputs, when admitted). After every step the two sides are compared:

* the step's answer: the admitted request's prefix length and the slots allocated past it, a deferral (the pool
  cannot give the demand), the release (with or without checkpoint);
* the tree: every node below the root by its full token path, its own key length, its slots (`value`) and its
  `lock_ref`;
* the allocator's free pages in the order `alloc` hands them out, and the pages `need_sort` holds back (as a set:
  they are sorted when merged);
* the sizes: available (free and staged pages, in tokens), evictable, protected;
* each running request's row (`req_to_token`, a slot a position) and its `cache_protected_len`;
* the request pool's free rows (`ReqToTokenPool`, a row per request of the configuration: taken by the prefill's
  `alloc_req_slots`, given back by `release_kv_cache` at a finish or a retraction).

Conventions (the harness's, on the real side; each the scheduler's part, not the cache's):

* The admission test is `PrefillAdder`'s, played by the harness as the model states it: the real side matches
  the request's tokens (prompt and outputs, cut one short: `_compute_max_prefix_len`), locks the matched node,
  reads the sizes, and admits when `extend + page_size` tokens fit the available and evictable ones; otherwise it
  unlocks (deferred). Admitted, it unlocks and the driver's `prefill` matches again and locks (the second match
  finds the same path: it only reads the clock again, and the eviction order depends only on the order of the
  times, which two matches in a row leave as one does).
* `check_decode_mem` is the harness's too: the real side evicts the shortfall of the next page (the driver's
  `evict`, as `evict_from_tree_cache` does) and defers the decode when the page still does not fit.
* The sampled token is the model's (`RadixCacheConfig.output_token`). The step's result is processed as the
  scheduler's `process_batch_result_prefill` / `_decode` does it (the model's `common.process_batch_result`),
  inside a free group (`free_group_begin` .. `free_group_end`): the driver's `sample` appends the token to the
  request's output, then `release(checkpoint=True)` when it is the `max_tokens`-th (the release's checkpoint reads
  that token, which has no slot, and keys only the KV the request owns, `owned_kv_len`), else, after a prefill,
  `checkpoint`. The next `decode` gives that token its slot and the step samples a new one. In the group a release's
  page frees (the duplicates its insert found, then the row's tail) reach the free list as one block in call order,
  where outside one each call's pages would go in front of the previous call's; the free pages are compared in
  order. A retract runs outside a group (`retract_decode`), as the eviction for an allocation does.
* The clock: the driver's `radix_cache.time` ticks once per reading, the model's clock once per match/insert
  and new node; only the order of the times is read (LRU eviction), and it is the same.
* Page size 1 is not drawn: a server builds `TokenToKVPoolAllocator` there (`kv_cache_configurator`: page size 1
  without DCP), which frees to the back of its list, not the model's paged allocator; and the paged allocator at
  page size 1 is inconsistent: `alloc_decode` hands out `last_loc + 1` and takes no page (`get_num_new_pages`'
  decode test `seq_lens % page_size == 1` is never true at page size 1), so a decoded slot stays in the free list.
  The probe `paged_decode_at_page_size_1_takes_no_page` pins that behaviour (it fails when a release changes it).
* The tree's `last_access_time` and hit counts are not compared (the first has no common unit, the second is the
  LFU strategy's); a node's id is not either (the model has none), its token path is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import (Context, Lockstep, Operation, Probe, SystemSide,
                                              directed_probe)
from kvsim.engine.conformance.declare import release_tuple
from kvsim.engine.errors import ConfigError
from kvsim.models.radix_cache.system import (RUNNING, Admit, Admitted, Decode, Deferred, RadixCacheConfig,
                                             RadixCacheSystem, Released, Retract)

DRIVER = "kvsim.conform.sglang.real_radix:RadixDriver"
REQUEST_OPS_SINCE = "0.5.23"  # the driver's request ops (checkpoint_kv_cache, release_kv_cache) are 0.5.23's
STEPS = 24  # three requests, each admitted, decoded up to three times, retracted and admitted again
# the request pool's rows: at most a row per request (the lockstep's pool has one per request of the configuration);
# a row is longer than every request
ROWS, CONTEXT = 4, 64
MAX_PAGES = 10  # RadixCacheConfig's bound on num_pages
# the page sizes a server builds the paged allocator for (at page size 1 it builds TokenToKVPoolAllocator, which
# frees to the back of its list: not the model's allocator; and the paged one's decode takes no page there)
PAGE_SIZES = (2, 4)
READS = (("dump", {}), ("sizes", {}))  # the real side's state: the tree, free pages and rows; the sizes


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    """A configuration within the model's bounds, as the program's first line shows it: the pool holds a request's
    longest input and the page the scheduler's demand adds (`RadixCacheConfig`'s own bound), up to 10 pages."""
    page_size, max_tokens = draw(st.sampled_from(PAGE_SIZES)), draw(st.integers(1, 4))
    # the longest input (prompt_len + max_tokens - 1) and a page fit MAX_PAGES pages
    prompt_len = draw(st.integers(2, min(8, MAX_PAGES * page_size - page_size - max_tokens + 1)))
    need = -(-(prompt_len + max_tokens - 1 + page_size) // page_size)
    return {"num_pages": draw(st.integers(need, MAX_PAGES)), "page_size": page_size,
            "prompts": draw(st.lists(st.integers(0, 2), min_size=1, max_size=3)), "prompt_len": prompt_len,
            "shared": draw(st.integers(0, prompt_len)), "max_tokens": max_tokens, "need_sort": draw(st.booleans())}


@dataclass(frozen=True)
class LockstepConfig(RadixCacheConfig):
    """The model's config in the lockstep: up to a request per row of the real request pool (the explorer keeps
    three; the random programs draw up to three, a directed program may run four)."""

    max_requests: ClassVar[int] = ROWS


def config_of(start: dict[str, Any]) -> RadixCacheConfig:
    return LockstepConfig(**{**start, "prompts": tuple(start["prompts"]),
                             "prompt_lens": tuple(start.get("prompt_lens", ()))})


def tree_rows(nodes: Any) -> list[list[Any]]:
    """Nodes as [path, key_len, value, lock_ref], sorted by path."""
    return sorted([list(path), key_len, list(value), lock_ref] for path, key_len, value, lock_ref in nodes)


class ModelSide(SystemSide):
    """The model's transition system, called with one of its actions; the view the operations draw from."""

    def __init__(self, config: RadixCacheConfig) -> None:
        self.system = RadixCacheSystem(config=config)
        (self.state,) = self.system.initial_states()
        self.idle = False

    def call(self, op: str, action: Any) -> Any:
        effects = self.transition(op, action)
        if self.state.flags:  # the model's own step checks failed: a bug of the model, not an answer to compare
            raise ConfigError(op, "a step whose checks hold", self.state.flags)
        answer: dict[str, Any] = {}
        for fx in effects:
            if isinstance(fx, Admitted):
                answer.update(prefix_len=fx.prefix_len, new=list(fx.new_slots))
            elif isinstance(fx, Deferred):
                answer["deferred"] = True
            elif isinstance(fx, Released):
                answer["released"] = "checkpoint" if fx.checkpointed else "no checkpoint"
        return answer

    def observe(self) -> dict[str, Any]:
        s, ps = self.state, self.system.cfg.page_size
        return {"tree": tree_rows((n.path, n.key_len, n.value, n.lock_ref) for n in s.tree.nodes),
                "free_pages": list(s.allocator.free_pages), "staged_pages": sorted(s.allocator.staged_pages),
                "sizes": {"available": (len(s.allocator.free_pages) + len(s.allocator.staged_pages)) * ps,
                          "evictable": s.tree.evictable_size, "protected": s.tree.protected_size},
                "requests": {str(r): {"row": list(q.row), "protected_len": q.cache_protected_len}
                             for r, q in enumerate(s.requests) if q.status == RUNNING},
                "req_slots": s.req_slots}


class RealSide:
    """The real tree and allocator in the child, driven as the model's actions are: the harness keeps each
    request's outputs and makes the scheduler's decisions (admission, decode memory), the child the cache. Calls
    whose arguments no answer before them decides go to the child together (`calls`: one round trip, the same
    calls in the same order)."""

    def __init__(self, child: Any, config: RadixCacheConfig) -> None:
        self.child, self.cfg = child, config
        child.call("build", size=config.num_pages * config.page_size, page_size=config.page_size,
                   need_sort=config.need_sort, rows=len(config.prompts), context=CONTEXT)
        self.outputs: list[list[int]] = [[] for _ in config.prompts]
        self.read: tuple[Any, Any] | None = None  # the dump and sizes read with a step's last calls (`observe`)

    def call(self, op: str, action: Any) -> Any:
        r, name = action.req, str(action.req)
        self.read = None
        if isinstance(action, Retract):
            self._last([("release", {"request": name, "checkpoint": False})])
            return {"released": "no checkpoint"}
        if isinstance(action, Admit):
            prompt = list(self.cfg.prompt(r))
            tokens = prompt + self.outputs[r]
            if not self._admits(tokens):
                return {"deferred": True}
            got, answer = self._sampled(r, ("prefill", {"request": name, "tokens": prompt,
                                                        "outputs": list(self.outputs[r])}), checkpoint=True)
            return {"prefix_len": got["prefix_len"], "new": got["indices"][got["prefix_len"]:], **answer}
        if isinstance(action, Decode):
            if not self._decode_fits(name):
                return {"deferred": True}
            # the slot of the token the last step sampled, then the step's result
            return self._sampled(r, ("decode", {"request": name}), checkpoint=False)[1]
        raise ConfigError(op, "admit, decode or retract", action)

    def _admits(self, tokens: list[int]) -> bool:
        """`PrefillAdder`'s test: the match (cut one token short) locked, the extend and a page fit."""
        hit = self.child.call("match", tokens=tokens[:-1])
        node = {"node": hit["node"]}
        _, sizes, _ = self.child.calls([("lock", node), ("sizes", {}), ("unlock", node)])
        return sizes["available"] + sizes["evictable"] >= len(tokens) - hit["prefix_len"] + self.cfg.page_size

    def _decode_fits(self, name: str) -> bool:
        """`check_decode_mem`: evict the shortfall of the next page, then test it (the sizes read again only
        after an eviction: a read changes nothing)."""
        ps = self.cfg.page_size
        seen, sizes = self.child.calls(READS)
        need = ps if len(seen["requests"][name]["row"]) % ps == 0 else 0  # the next position starts a page
        shortfall = need - sizes["available"]
        if shortfall > 0:
            sizes = self.child.calls([("evict", {"num_tokens": shortfall}), ("sizes", {})])[1]
        return sizes["available"] >= need

    def _sampled(self, r: int, first: tuple[str, dict[str, Any]], checkpoint: bool) -> tuple[Any, dict[str, Any]]:
        """`first` (the prefill or the decode), then the step's result as the batch-result processing handles it,
        inside a free group: the sampled token appended to the request's output, then the release at
        `max_tokens`, else (after a prefill) the checkpoint. `first`'s answer and the step's."""
        name, token = str(r), self.cfg.output_token(r)
        self.outputs[r].append(token)
        calls = [first, ("free_group_begin", {}), ("sample", {"request": name, "token": token})]
        answer: dict[str, Any] = {}
        if len(self.outputs[r]) >= self.cfg.max_tokens:
            calls.append(("release", {"request": name, "checkpoint": True}))
            answer = {"released": "checkpoint"}
        elif checkpoint:
            calls.append(("checkpoint", {"request": name}))
        calls.append(("free_group_end", {}))
        return self._last(calls)[0], answer

    def _last(self, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """A step's last calls, with the reads `observe` makes after the step (nothing comes between: the same
        reads, one round trip fewer)."""
        *answers, dump, sizes = self.child.calls([*calls, *READS])
        self.read = (dump, sizes)
        return answers

    def observe(self) -> dict[str, Any]:
        seen, sizes = self.read or self.child.calls(READS)
        self.read = None
        nodes: list[tuple[Any, ...]] = []

        def walk(node: dict[str, Any], path: tuple[int, ...]) -> None:
            for c in node["children"]:
                nodes.append((path + tuple(c["key"]), len(c["key"]), c["value"], c["lock_ref"]))
                walk(c, path + tuple(c["key"]))

        walk(seen["tree"], ())
        return {"tree": tree_rows(nodes), "free_pages": seen["free_pages"],
                "staged_pages": sorted(seen["staged_pages"]), "sizes": sizes,
                "requests": {r: {"row": q["row"], "protected_len": q["protected_len"]}
                             for r, q in sorted(seen["requests"].items())},
                "req_slots": seen["req_slots"]}


def sides(ctx: Context, start: dict[str, Any]) -> tuple[ModelSide, RealSide]:
    config = config_of(start)
    return ModelSide(config), RealSide(ctx.child, config)


def skip(ctx: Context) -> tuple[str, str] | None:
    version = release_tuple(ctx.source.version)
    if version is not None and version < release_tuple(REQUEST_OPS_SINCE):  # type: ignore[operator]
        return ("skipped", f"{ctx.source.label} predates the request life cycle the model states (0.5.23's "
                           f"RadixCache.checkpoint and common.release_kv_cache): the tree and allocator ops of this "
                           f"release are the real_radix driver's tests'")
    return None


def paged_decode_at_page_size_1(ctx: Context) -> str | None:
    """A request of 2 tokens prefilled and decoded once on the paged allocator at page size 1: the decode's slot is
    `last_loc + 1` (slot 3) and the free list keeps page 3."""
    ctx.child.call("build", size=4, page_size=1, rows=ROWS, context=CONTEXT)
    ctx.child.call("prefill", request="0", tokens=[2, 2])
    slot = ctx.child.call("decode", request="0", token=8)
    free = ctx.child.call("dump")["free_pages"]
    if slot == 3 and free == [3, 4]:
        return None
    return f"decoded slot {slot}, free pages {free}: expected slot 3 and free pages [3, 4] (the page not taken)"


def directed(name: str, what: str, start: dict[str, Any], program: tuple) -> Probe:
    return directed_probe(sides, name, what, start, program)


# Three prompts of one page each, a pool of three: the first two end as cached leaves (a page each, one page free);
# the third's demand (its page and the scheduler's extra page) evicts one leaf, the least recently used: the
# first's. Random programs rarely leave two unlocked leaves of which an eviction takes one.
LRU = {"num_pages": 3, "page_size": 2, "prompts": [0, 1, 2], "prompt_len": 2, "shared": 0, "max_tokens": 1,
       "need_sort": False}


# Three one-page-and-a-half prompts, four outputs each, a pool of five pages: request 1 runs short of a page for its
# second decode while its row holds a whole page (its prompt's last token and its first output) past its
# checkpoint, and is retracted; request 2 then evicts its cached prompt; admitted again, request 1's prefill keys its
# prompt and outputs as one new leaf, which the prompt's own insert splits at the prompt's end (`split_prompt`).
# Random programs seldom retract at a page boundary (four outputs, three requests, a tight pool).
READMIT = {"num_pages": 5, "page_size": 2, "prompts": [0, 1, 2], "prompt_len": 3, "shared": 0, "max_tokens": 4,
           "need_sort": False}

# need_sort with a prompt of a page and a half: the first request's release stages its tail page; the second's
# extend of 3 tokens bounds its new pages at 3 // 2 + 1 + 1 = 3, which the three free pages meet: no merge, so its
# pages come from the free list and the staged page stays staged (random programs seldom meet the bound exactly
# with a staged page and an extend that is not page-aligned).
STAGED = {"num_pages": 5, "page_size": 2, "prompts": [0, 1], "prompt_len": 3, "shared": 0, "max_tokens": 1,
          "need_sort": True}


# Two requests of one family, the second's prompt the first page of the first's (prompt_lens): the second's
# checkpoint inserts a key ending inside the first's node, split there, where the node's rest starts with the node's
# own first page. The insert's walk stops there (its key is empty); it must not walk on into the child whose first
# page repeats the key it entered the node by. The random programs' prompts (one length) never end an insert where
# the tree goes on with the same page.
REPEATED_PAGE = {"num_pages": 4, "page_size": 2, "prompts": [0, 0], "prompt_len": 4, "prompt_lens": [4, 2],
                 "shared": 0, "max_tokens": 1, "need_sort": False}

# Four requests (a row each), three outputs, a pool of seven pages: request 0 finishes, caching its prompt and two
# outputs; request 1, of its family, is admitted and stays running, locking the prompt's node (its child, request
# 0's outputs, unlocked); request 2, of another family, finishes after it (a leaf newer than that lock); request 3's
# demand evicts request 0's outputs and more. The locked node left childless must not join the eviction heap: it
# would be evicted (it is older than request 2's leaf) while request 1 holds it.
LOCKED_PARENT = {"num_pages": 7, "page_size": 2, "prompts": [0, 0, 1, 2], "prompt_len": 4, "shared": 0,
                 "max_tokens": 3, "need_sort": False}

# Four requests, a pool of six pages: request 0's prompt of a page, request 1's of a page and a half in its family
# (prompt_lens), so the first page's node has two children (0's outputs, 1's last prompt token and output), unlocked
# once both finish; request 2, of another family, leaves a leaf newer than them; request 3's eight-token prompt (no
# match: nothing locked on that path) evicts both children, their parent, and request 2's output page. A parent
# pushed on the eviction heap while it still has children is pushed twice (after each child): evicted, then popped
# and freed again.
UNLOCKED_PARENT = {"num_pages": 6, "page_size": 2, "prompts": [0, 0, 1, 2], "prompt_len": 8,
                   "prompt_lens": [2, 3, 2, 8], "shared": 0, "max_tokens": 3, "need_sort": False}


def finish(r: int) -> tuple[Any, ...]:
    """Request r's three outputs: admitted, then decoded twice (the release follows the third)."""
    return Admit(r), Decode(r), Decode(r)


PROBES = (
    directed("evicts_the_least_recently_used_leaf",
             "an eviction that needs one of two cached leaves takes the least recently used", LRU,
             (Admit(0), Admit(1), Admit(2))),
    directed("readmitted_after_eviction_splits_at_the_prompt",
             "a request retracted with a whole page past its checkpoint, its prompt evicted, admitted again: its "
             "prefill's checkpoint splits the new leaf at the prompt's end", READMIT,
             (Admit(0), Decode(0), Admit(1), Decode(0), Decode(1), Retract(1), Decode(0), Admit(2), Decode(2),
              Decode(2), Decode(2), Admit(1))),
    directed("staged_pages_wait_while_the_bound_is_met",
             "need_sort: an extend whose page bound the free pages meet takes them without merging the staged page",
             STAGED, (Admit(0), Admit(1))),
    directed("insert_ends_where_the_child_repeats_the_page",
             "an insert ending inside a node whose rest starts with the node's first page: the walk stops there",
             REPEATED_PAGE, (Admit(0), Admit(1))),
    directed("locked_parent_left_childless_stays_cached",
             "an eviction that empties a locked node of its child goes on to the next leaf, not to the locked node",
             LOCKED_PARENT, (*finish(0), Admit(1), *finish(2), Admit(3))),
    directed("parent_evicted_once_after_its_last_child",
             "an eviction takes a parent only once its last child is gone, and once",
             UNLOCKED_PARENT, (*finish(0), *finish(1), *finish(2), Admit(3))),
    Probe("paged_decode_at_page_size_1_takes_no_page",
          "the paged allocator at page size 1 (not what a server builds there) hands a decode last_loc + 1 and "
          "takes no page: the reason the lockstep draws page sizes 2 and 4", paged_decode_at_page_size_1),
)


LOCKSTEP = Lockstep(
    installed=DRIVER,
    skip=skip,
    start=lambda ctx: configs(),
    sides=sides,
    operations=(Operation("step", lambda view: view.enabled()),),  # one of the actions the model enables
    steps=STEPS,
    probes=PROBES,
)
