"""EAGLE speculative decoding's page accounting (SGLang spec v2, page_size > 1): what one decode step allocates for a
request's drafts, and what its release gives back.

Upstream: `speculative/eagle_utils.py` (`eagle_prepare_for_decode`), `mem_cache/allocation_sizing.py`
(`get_alloc_len_per_decode`, `get_alloc_reserve_per_decode`, and from 0.5.19 `page_aligned_decode_alloc_lens`),
`mem_cache/allocation.py` (`alloc_for_spec_decode`, `alloc_paged_token_slots_extend`), `mem_cache/common.py`
(`release_kv_cache`, `_release_overallocated_kv_indices`), `managers/schedule_batch.py`
(`_new_tokens_required_next_decode_spec_v2`) and the batch-result processing that commits the accepted run.

A request records `kv_allocated_len` (its row's slots, positions `0 .. kv_allocated_len - 1`) and
`kv_committed_len` (the positions whose KV is final: one less than its prompt and outputs). Each decode step:

* `page_aligned_decode_alloc_lens`: `cur = kv_allocated_len`, `nxt = max(cur, kv_committed_len + reserve)`, where
  `reserve = get_alloc_reserve_per_decode()` (twice `get_alloc_len_per_decode`: the double buffer for overlap's
  committed-length lag). #31616 (first in 0.5.16) rounds `nxt` up to the page boundary; before it (`pre_31616`,
  flag `page_aligned_nxt` off) `nxt` is recorded unaligned while the paged allocator hands out whole pages, so the
  slots of the last page past `nxt` are allocated but recorded by nobody.
* `alloc_for_spec_decode`: `alloc_paged_token_slots_extend(cur, nxt)` (evict the demand, `alloc_extend` from the
  row's last slot), the new slots appended to the row, `kv_allocated_len = max(kv_allocated_len, nxt)`.
* The verify step accepts a run of `1 .. num_draft_tokens` tokens (correct drafts and the bonus):
  `kv_committed_len` grows by it. The rejected drafts' slots stay allocated in `[kv_committed_len,
  kv_allocated_len)`, rewritten by the next step's drafts (spec v2 frees nothing per step).
* `release_kv_cache`: the row `[cache_protected_len, owned_kv_len)` freed (`owned_kv_len = kv_committed_len`), then
  `_release_overallocated_kv_indices` (in `common`): the rejected drafts' `[ceil_align(owned_kv_len),
  kv_allocated_len)`.

Left out: topk > 1 (the holey per-branch draft footprint and `duplicate_prefix_tail_to_draft_branches`, #26972's
row-width clamp), several draft steps with their own draft-model KV, overlap scheduling (the committed length
lagging a verify), adaptive step counts, grammar-truncated runs, the SWA pool (#27789's own setting), sessions, the
Triton / NPU allocation paths and page_size 1's `alloc_token_slots`. `num_draft_tokens` stands for
`get_alloc_len_per_decode`'s `max(steps * topk, num_draft_tokens)` at topk 1.
"""

from __future__ import annotations

from typing import Sequence

from .allocator import PagedTokenToKVPoolAllocator
from .common import Req, ceil_align, evict_from_tree_cache, extend_demand
from .radix_cache import RadixCache


def get_alloc_reserve_per_decode(num_draft_tokens: int) -> int:
    """KV positions reserved per request and decode step: twice `get_alloc_len_per_decode` (topk 1)."""
    return 2 * num_draft_tokens


def page_aligned_decode_alloc_lens(reqs: Sequence[Req], reserve: int, page_size: int, page_aligned_nxt: bool) \
        -> tuple[list[int], list[int], int]:
    """(cur lengths, next lengths, tokens needed) of one decode step; `page_aligned_nxt`: #31616's rounding."""
    cur_kv_lens, nxt_kv_lens, num_needed_tokens = [], [], 0
    for r in reqs:
        cur = r.kv_allocated_len
        want = r.kv_committed_len + reserve
        nxt = max(cur, ceil_align(want, page_size) if page_aligned_nxt else want)
        cur_kv_lens.append(cur)
        nxt_kv_lens.append(nxt)
        num_needed_tokens += nxt - cur
    return cur_kv_lens, nxt_kv_lens, num_needed_tokens


def row_fits(nxt_kv_lens: Sequence[int], page_size: int, topk: int | None, row_width: int) -> bool:
    """The fail-fast before the row write (#26972): at page_size > 1 and topk > 1 the step's longest allocation must
    fit the `req_to_token` row (upstream asserts; False here)."""
    return not (page_size > 1 and (topk or 1) > 1 and max(nxt_kv_lens) > row_width)


def decode_demand(req: Req, reserve: int, page_size: int) -> int:
    """`_new_tokens_required_next_decode_spec_v2` for one request: the new pages' tokens its next step needs."""
    cur = req.kv_allocated_len
    nxt = cur + max(0, req.kv_committed_len + reserve - cur)
    return ceil_align(nxt, page_size) - ceil_align(cur, page_size)


def check_decode_mem(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req, reserve: int) -> bool:
    num_tokens = decode_demand(req, reserve, tree.page_size)
    evict_from_tree_cache(tree, allocator, num_tokens)
    return allocator.available_size() >= num_tokens


def eagle_prepare_for_decode(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req, reserve: int,
                             page_aligned_nxt: bool) -> tuple[int, ...]:
    """One request's draft allocation (`alloc_for_spec_decode`): the slots of positions `cur .. nxt - 1`."""
    (cur,), (nxt,), needed = page_aligned_decode_alloc_lens([req], reserve, tree.page_size, page_aligned_nxt)
    out: tuple[int, ...] = ()
    if needed > 0:
        evict_from_tree_cache(tree, allocator, extend_demand(cur, nxt, tree.page_size))
        got = allocator.alloc_extend(cur, nxt, req.row[cur - 1] if cur else -1)
        if got is None:
            allocator.problems.append(f"alloc_extend({cur}, {nxt}) failed after check_decode_mem")
        else:
            out = got
    req.row += out
    return out
