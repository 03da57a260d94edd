"""How SGLang's scheduler drives the radix cache and the paged allocator for one plain request (0.5.23: no chunked
prefill, no speculative decoding, no session, no host tier): `sglang/srt/mem_cache/common.py` (`match_kv_cache`,
`checkpoint_kv_cache`, `release_kv_cache`), `allocation.py` (`alloc_paged_token_slots_extend`,
`alloc_paged_token_slots_decode`), `RadixCache.checkpoint` and `ScheduleBatch.check_decode_mem`.

0.5.23 has no `cache_finished_req` / `cache_unfinished_req` any more: what they did is `RadixCache.checkpoint`
(insert what the request computed, free the slots the tree already had, repoint the row at the tree's, move the
lock to the new last node), called after a prefill (`checkpoint_kv_cache`) and once more at the finish
(`release_kv_cache(checkpoint=True)`, which then frees the row past the tree's part, the unaligned tail page
whole, and unlocks).

Conventions of the model:
* A request's row (`req_to_token`) holds the slot of every position whose KV is computed or being computed; its
  first `cache_protected_len` positions are the tree's (the locked path's slots), the rest the request's own.
* `admit` is the prefill adder's choice and the prefill step together: match (the key capped at one token less
  than the input: `_compute_max_prefix_len`), lock the last node, and admit only when the conservative extend
  demand (`extend + page_size`, upstream's per-request over-estimate) fits the free and evictable tokens
  (otherwise unlock and stay waiting); a row of the request pool (`alloc_req_slots`, when the tree has one: its
  `req_to_token_pool`, as upstream's cache holds it), evict the shortfall, `alloc_extend`, run the step, sample a
  token.
* `decode`: `check_decode_mem` (the next step's new pages, evicting for them; a request it does not fit stays as
  it is: the caller retracts), then `alloc_paged_token_slots_decode` (evicting for a whole page, upstream's
  over-estimate per request), `alloc_decode` for the last sampled token, sample the next.
* `process_batch_result`: the step's result, inside a free group: the sampled token appended, then the release
  (the request finished) or, after a prefill, the checkpoint.
* `retract`: `release_kv_cache(checkpoint=False)` (outside a free group, as `retract_decode` runs it); the request
  keeps its output tokens and is matched again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .allocator import PagedTokenToKVPoolAllocator
from .radix_cache import RadixCache, TreeNode


@dataclass
class Req:
    rid: int
    origin_input_ids: tuple[int, ...]
    output_ids: list[int] = field(default_factory=list)
    row: list[int] = field(default_factory=list)  # req_to_token: the slot of each position
    cache_protected_len: int = 0
    prefix_len: int = 0
    lock: TreeNode | None = None

    @property
    def fill_ids(self) -> tuple[int, ...]:
        return self.origin_input_ids + tuple(self.output_ids)

    @property
    def kv_committed_len(self) -> int:
        """Positions whose KV is final (a running request's): all but the last sampled token's."""
        return len(self.fill_ids) - 1

    @property
    def kv_allocated_len(self) -> int:
        """Positions the row holds slots for: past `kv_committed_len` only with speculative decoding's drafts."""
        return len(self.row)


def ceil_align(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


def match_kv_cache(tree: RadixCache, req: Req) -> tuple[int, tuple[int, ...], TreeNode]:
    """Match the request's tokens, capped at one less than their length; adopt the hit as its prefix."""
    tokens = req.fill_ids
    prefix_len, indices, last_node = tree.match_prefix(tokens[:len(tokens) - 1])
    req.prefix_len = req.cache_protected_len = prefix_len
    return prefix_len, indices, last_node


def extend_demand(prefix_len: int, seq_len: int, page_size: int) -> int:
    """`alloc_paged_token_slots_extend`'s eviction target: the extend tokens plus a page per request."""
    return seq_len - prefix_len + page_size


def evict_from_tree_cache(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, num_tokens: int) -> None:
    """`evict_to_free_tokens`: evict the shortfall, if any."""
    shortfall = num_tokens - allocator.available_size()
    if shortfall > 0:
        tree.evict(shortfall)


def admit(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req) -> tuple[int, tuple[int, ...]] | None:
    """Match, lock, evict, `alloc_extend` for the tokens past the hit. Returns (prefix_len, new slots), or None
    when the demand does not fit (the request stays waiting, unlocked)."""
    prefix_len, indices, last_node = match_kv_cache(tree, req)
    req.lock = last_node
    tree.inc_lock_ref(last_node)
    seq_len = len(req.fill_ids)
    demand = extend_demand(prefix_len, seq_len, tree.page_size)
    if allocator.available_size() + tree.evictable_size() < demand:
        tree.dec_lock_ref(last_node)
        req.lock, req.prefix_len, req.cache_protected_len = None, 0, 0
        return None
    if tree.req_to_token_pool is not None:
        tree.req_to_token_pool.alloc()  # alloc_req_slots: the request's row, before its extend
    evict_from_tree_cache(tree, allocator, demand)
    out = allocator.alloc_extend(prefix_len, seq_len, indices[-1] if indices else -1)
    if out is None:
        allocator.problems.append(f"alloc_extend({prefix_len}, {seq_len}) failed after evicting for {demand}")
        out = ()
    req.row = list(indices) + list(out)
    return prefix_len, out


def decode_demand(req: Req, page_size: int) -> int:
    """`new_tokens_required_next_decode` for one request: the tokens of the new page its next slot needs."""
    cur = len(req.row)
    return PagedTokenToKVPoolAllocator.num_new_pages(cur, cur + 1, page_size) * page_size


def check_decode_mem(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req) -> bool:
    num_tokens = decode_demand(req, tree.page_size)
    evict_from_tree_cache(tree, allocator, num_tokens)
    return allocator.available_size() >= num_tokens


def alloc_decode(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req) -> tuple[int, ...]:
    """`alloc_paged_token_slots_decode` for one request (evict for a whole page, then `alloc_decode`)."""
    evict_from_tree_cache(tree, allocator, tree.page_size)
    out = allocator.alloc_decode(len(req.row) + 1, req.row[-1] if req.row else -1)
    if out is None:
        allocator.problems.append(f"alloc_decode({len(req.row) + 1}) failed after check_decode_mem")
        return ()
    req.row += out
    return out


def checkpoint(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req, up_to: int) -> int:
    """`RadixCache.checkpoint`: insert the page-aligned part of the first `up_to` tokens (then the prompt's part
    again, which splits the leaf at the prompt's end: `split_prompt`), free the request's slots the tree already
    had (`[cache_protected_len, prefix_len)`), repoint the row at the tree's slots and move the lock to the new
    last node. Returns the insert's prefix_len."""
    token_ids = req.fill_ids[:up_to]
    key_len = len(token_ids) // tree.page_size * tree.page_size
    key, values = token_ids[:key_len], tuple(req.row[:key_len])
    prefix_len, _ = tree.insert(key, values)
    prompt_len = len(req.origin_input_ids) // tree.page_size * tree.page_size
    if 0 < prompt_len < key_len:
        tree.insert(key[:prompt_len], values[:prompt_len])
    cpl = req.cache_protected_len
    allocator.free_segment(req.row[cpl:prefix_len], cpl)
    _, new_indices, new_last_node = tree.match_prefix(key)
    if len(new_indices) != key_len:
        tree.problems.append(f"checkpoint: the match after insert found {len(new_indices)} tokens, expected {key_len}")
    req.row[cpl:len(new_indices)] = new_indices[cpl:]
    req.cache_protected_len = len(new_indices)
    tree.dec_lock_ref(req.lock)
    req.lock = new_last_node
    tree.inc_lock_ref(new_last_node)
    return prefix_len


def release_kv_cache(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req, checkpointed: bool) -> None:
    """Give the row back; with `checkpointed` the tree first keeps what it can key (`checkpoint` up to the KV the
    request owns, `owned_kv_len`). The row past the tree's part is freed from `cache_protected_len` (a page
    boundary) to `owned_kv_len`, the unaligned tail's page whole; then the lock is dropped and the rejected drafts'
    slots past the owned KV's page are freed (`_release_overallocated_kv_indices`), and the request's row of the request
    pool is given back."""
    owned_kv_len, kv_allocated_len = req.kv_committed_len, req.kv_allocated_len
    if checkpointed:
        checkpoint(tree, allocator, req, owned_kv_len)
    allocator.free_segment(req.row[req.cache_protected_len:owned_kv_len], req.cache_protected_len)
    tree.dec_lock_ref(req.lock)
    _release_overallocated_kv_indices(allocator, req, owned_kv_len, kv_allocated_len)
    if tree.req_to_token_pool is not None:
        tree.req_to_token_pool.free()  # req_to_token_pool.free(req): the row back
    req.lock, req.row, req.cache_protected_len, req.prefix_len = None, [], 0, 0


def _release_overallocated_kv_indices(allocator: PagedTokenToKVPoolAllocator, req: Req, start_p: int,
                                      end_p: int) -> None:
    """Speculative decoding's over-allocation (the rejected drafts' slots), from the page after the owned KV's
    last (`ceil_align`: that page was freed whole with the row) to `kv_allocated_len`."""
    start_p = ceil_align(start_p, allocator.page_size)
    if start_p < end_p:
        allocator.free_segment(req.row[start_p:end_p], start_p)


def sample(req: Req, token: int) -> None:
    req.output_ids.append(token)


def process_batch_result(tree: RadixCache, allocator: PagedTokenToKVPoolAllocator, req: Req, token: int,
                         finished: bool, prefill: bool) -> None:
    """The scheduler's processing of one request's step result (`process_batch_result_prefill` / `_decode`): the
    sampled token appended to the output, then, when it finished the request, `release_kv_cache` with checkpoint
    (which reads that token but keys only the KV the request owns), else after a prefill `checkpoint_kv_cache` (up
    to the extend's end). All of it inside one free group (`free_group_begin` .. `free_group_end`, as the batch's
    processing wraps it): the pages the checkpoint's insert found duplicated and then the row's tail reach the free
    list as one block in call order, not each call's pages in front of the previous call's."""
    allocator.free_group_begin()
    sample(req, token)
    if finished:
        release_kv_cache(tree, allocator, req, checkpointed=True)
    elif prefill:
        checkpoint(tree, allocator, req, len(req.row))  # checkpoint_kv_cache: up to the extend's end
    allocator.free_group_end()


def path_of(node: TreeNode | None) -> tuple[int, ...] | None:
    return None if node is None else node.path()


def rows_pages(row: Sequence[int], start: int, page_size: int) -> list[int]:
    """The pages of `row[start:]` (start on a page boundary), one per page."""
    return [i // page_size for i in row[start::page_size]]
