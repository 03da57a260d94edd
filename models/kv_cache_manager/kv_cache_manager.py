"""The KV cache manager's request life cycle for one full-attention group (vLLM 0.33.0
`vllm/v1/core/kv_cache_manager.py` with its coordinator and `FullAttentionManager` from
`single_type_kv_cache_manager.py`, in kvsim's words).

- `get_computed_blocks`: the longest run of the request's hash chain the cache holds, capped at
  `num_tokens - 1` tokens: a prompt that is wholly cached still computes its last token (for the logits),
  so a hit is never the whole prompt.
- `allocate_slots`: touch the hit blocks (a free one leaves the queue), then take the blocks the new tokens
  need from the free queue, or refuse (None) before changing anything when the pool cannot give them; then
  `cache_blocks` the blocks the computed tokens fill.
- `free`: the request's blocks back to the pool, tail first (so its tail is evicted first).

Not modelled this slice: chunked prefill's partial allocations beyond one call, lookahead and encoder tokens,
external (connector) tokens, the watermark, sliding-window / Mamba groups and the coordinator over several.
`ManagerState` is the value form the transition system keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .block_pool import BlockPool, PoolState
from .kv_cache_utils import BlockHash, KVCacheBlock, request_block_hashes


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Request:
    """What the manager reads of a request: its tokens (prompt, then outputs) and how many are computed."""

    request_id: int
    all_token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    block_size: int = field(default=1, repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def block_hashes(self) -> tuple[BlockHash, ...]:
        return request_block_hashes(self.all_token_ids, self.block_size)


class ManagerState(NamedTuple):
    pool: PoolState
    tables: tuple[tuple[tuple[int, ...], int] | None, ...]  # per request: (block ids, num cached blocks) or None


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, num_requests: int) -> None:
        self.block_size = block_size
        self.num_requests = num_requests
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[int, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[int, int] = {}

    # -- the value form --------------------------------------------------------------------------------------
    def freeze(self) -> ManagerState:
        tables = tuple((tuple(b.block_id for b in self.req_to_blocks[r]), self.num_cached_block[r])
                       if r in self.req_to_blocks else None for r in range(self.num_requests))
        return ManagerState(self.block_pool.freeze(), tables)

    @classmethod
    def thaw(cls, state: ManagerState, block_size: int) -> "KVCacheManager":
        m = cls.__new__(cls)
        m.block_size, m.num_requests = block_size, len(state.tables)
        m.block_pool = BlockPool.thaw(state.pool)
        m.req_to_blocks, m.num_cached_block = {}, {}
        for r, table in enumerate(state.tables):
            if table is not None:
                m.req_to_blocks[r] = [m.block_pool.blocks[i] for i in table[0]]
                m.num_cached_block[r] = table[1]
        return m

    # -- the request life cycle ------------------------------------------------------------------------------
    def max_cache_hit_length(self, request: Request) -> int:
        """A hit leaves at least one token to compute: the last one gives the logits."""
        return request.num_tokens - 1

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The cached blocks of the longest prefix of the request's hash chain, and the tokens they cover."""
        limit = self.max_cache_hit_length(request) // self.block_size
        hit: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:limit]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit, len(hit) * self.block_size

    def get_num_blocks_to_allocate(self, request_id: int, num_tokens: int,
                                   new_computed_blocks: list[KVCacheBlock]) -> int:
        """Free-queue blocks the allocation takes: new ones, and hit blocks that are free now (touching them
        takes them out of the queue)."""
        num_required = cdiv(num_tokens, self.block_size)
        held = self.req_to_blocks.get(request_id, [])
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return max(num_required - len(held), 0)
        num_new = max(num_required - len(new_computed_blocks) - len(held), 0)
        return num_new + sum(b.ref_cnt == 0 and not b.is_null for b in new_computed_blocks)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Slots for `num_new_tokens` more tokens after the computed ones (the hit's included); None, with
        nothing changed, when the free queue cannot give them. Caches the blocks the tokens fill."""
        hit = list(new_computed_blocks or ())
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = total_computed + num_new_tokens
        rid = request.request_id
        if self.get_num_blocks_to_allocate(rid, num_tokens_need_slot, hit) > self.block_pool.get_num_free_blocks():
            return None
        if rid not in self.num_cached_block:  # the request's first allocation: adopt the hit
            self.block_pool.touch(hit)
            self.req_to_blocks[rid] = list(hit)
            self.num_cached_block[rid] = len(hit)
        blocks = self.req_to_blocks[rid]
        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        blocks.extend(new_blocks)
        self.cache_blocks(request, min(num_tokens_need_slot, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that `num_tokens` fill and that are not cached yet."""
        rid = request.request_id
        hashes = request.block_hashes
        num_cached = self.num_cached_block[rid]
        num_full = min(num_tokens, len(hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(hashes, self.req_to_blocks[rid], num_cached, num_full, self.block_size)
        self.num_cached_block[rid] = num_full

    def pop_blocks_for_free(self, request_id: int) -> list[KVCacheBlock]:
        self.num_cached_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def free(self, request: Request) -> None:
        """The request's blocks back to the pool, tail first."""
        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request.request_id)))

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def take_events(self) -> tuple[tuple, ...]:
        return self.block_pool.take_events()

    def get_block_ids(self, request_id: int) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]
