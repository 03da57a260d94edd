"""The single-type managers: one KV cache group's blocks per request (vLLM 0.33.0
`vllm/v1/core/single_type_kv_cache_manager.py`, in kvsim's words).

Every group shares the one `BlockPool`; a group keeps, per request, its block table (`req_to_blocks`) and how
many of its blocks are cached (`num_cached_block`). The kinds differ in two things only:

* which computed tokens attention no longer reads (`get_num_skipped_tokens`): none for full attention; those
  before the window for a sliding window (`max(0, n - sliding_window + 1)`); those before the current chunk for
  chunked local attention (`n // attention_chunk_size * attention_chunk_size`); all but the last for Mamba (its
  state is one block). Blocks wholly skipped are freed and replaced by the null block (`remove_skipped_blocks`,
  tail of the skipped run first, stopping at a null block), and a prefix-cache hit adopts null blocks in their
  place (`add_local_computed_blocks`);
* how a hit is found (`find_longest_cache_hit`): full attention takes the longest run of cached blocks from the
  start; a sliding window searches from the right for `cdiv(sliding_window - 1, block_size)` contiguous cached
  blocks (nulls before them), or takes the run that reaches block 0; chunked local attention puts null blocks
  before the chunk `max_length` falls in and takes the run of cached blocks from the chunk's first block; Mamba
  takes the rightmost cached block (nulls before it).

Mamba's prefix caching has two modes (`MambaManager.mamba_cache_mode`, the variant flag
`mamba_cache_mode_align`): `align`, the only one 0.33.0 keeps, and `all` (0.26.0-0.31.0 offer both; `all` is
the default of 0.26.0 and 0.27.0 for the models that support it, `align` from 0.28.0, vLLM #50991). They differ in allocation only; the hit lookup, the adoption of a hit and the
caching of full blocks are the same:

* `all`: allocation as attention, a block per `block_size` tokens, all but the last freed as the request
  computes (the skipped run is freed tail first and stops at a null block);
* `align`: one running-state block per allocation. `get_num_blocks_to_allocate` asks for at most one new block
  (plus the hit's free blocks); `allocate_new_blocks` pads the table with null blocks up to the last required
  block and takes one block for it, answering the padding and the block; `remove_skipped_blocks` frees every
  held block before the last computed token, past the null gaps between states (upstream's
  `_remove_blocks_in_range` override). So only a state at a block boundary that ends an allocation is cached.

The model pins one block size for every group (the hash block size, the scheduler's block size), no EAGLE
drop, no partial (fine-grained) hits and dense retention (every full block cached). Under these pins align's
other state is implied by the table: no speculative blocks (`num_speculative_blocks` 0) makes the cap on new
blocks one whether or not the request allocated before (`_allocated_block_reqs`), and the block upstream frees
through `last_state_block_idx` is one the skipped range frees too (`_num_retired_blocks` only skips blocks that
are already null); no prefill checkpoint blocks and a hash block the size of a block make
`_cache_partial_tail_block` a no-op (its boundary is either not the prompt's or a block `cache_full_blocks`
just keyed).
"""

from __future__ import annotations

from typing import Sequence

from .block_pool import BlockPool
from .kv_cache_utils import BlockHash, KVCacheBlock

FULL, SWA, LOCAL, MAMBA = "full", "swa", "local", "mamba"
KINDS = (FULL, SWA, LOCAL, MAMBA)
# Mamba's prefix-caching modes (upstream's `MambaCacheMode` with prefix caching on)
ALIGN, ALL = "align", "all"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager:
    kind = ""

    def __init__(self, block_pool: BlockPool, block_size: int, kv_cache_group_id: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.kv_cache_group_id = kv_cache_group_id
        self.req_to_blocks: dict[int, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[int, int] = {}
        self._null_block = block_pool.null_block

    # -- what differs per kind -------------------------------------------------------------------------------
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The computed tokens attention no longer reads (their blocks can be freed)."""
        return 0

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) \
            -> tuple[list[KVCacheBlock], int]:
        raise NotImplementedError

    # -- allocation ------------------------------------------------------------------------------------------
    def get_num_blocks_to_allocate(self, request_id: int, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock], total_computed_tokens: int,
                                   num_tokens_main_model: int) -> int:
        """Free-queue blocks the allocation takes: the new ones past the skipped and computed blocks, and the hit
        blocks that are free now and inside the window (touching them takes them out of the queue). Attention
        gives every one of `num_tokens` (the lookahead's included) a slot; `num_tokens_main_model` is Mamba's."""
        num_required = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # a running request has no new hit
            assert not new_computed_blocks
            return max(num_required - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local = len(new_computed_blocks) + num_req_blocks
        num_new = max(num_required - max(num_skipped_blocks, num_local), 0)
        skip_new = max(0, num_skipped_blocks - num_req_blocks)
        return num_new + sum(b.ref_cnt == 0 and not b.is_null for b in new_computed_blocks[skip_new:])

    def add_local_computed_blocks(self, request_id: int, new_computed_blocks: Sequence[KVCacheBlock],
                                  total_computed_tokens: int) -> None:
        """The request's first allocation adopts its hit: the blocks inside the window are touched, the skipped
        ones are null. Upstream calls it only for a non-empty hit; with an empty one it changes nothing but
        marking the request allocated, which upstream's `cache_blocks` does with the same count."""
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = list(new_computed_blocks[num_skipped_blocks:]) if num_skipped_blocks > 0 else list(new_computed_blocks)
        self.block_pool.touch(kept)
        blocks = [self._null_block] * max(num_skipped_blocks, 0) + kept
        self.req_to_blocks[request_id] = blocks
        self.num_cached_block[request_id] = len(blocks)

    def allocate_new_blocks(self, request_id: int, num_tokens: int, num_tokens_main_model: int) \
            -> list[KVCacheBlock]:
        blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request, num_tokens: int) -> None:  # type: ignore[no-untyped-def]
        """Cache the request's blocks that `num_tokens` fill and that are not cached yet (null blocks skipped)."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request.block_hashes, self.req_to_blocks[rid], num_cached, num_full,
                                          self.block_size, self.kv_cache_group_id)
        self.num_cached_block[rid] = num_full

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """Free the blocks wholly before the window and put the null block in their place."""
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens)
        blocks = self.req_to_blocks.get(request_id)
        if num_skipped <= 0 or not blocks:
            return
        freed = []
        for i in range(min(num_skipped // self.block_size, len(blocks)) - 1, -1, -1):
            if blocks[i] is self._null_block:
                break
            freed.append(blocks[i])
            blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def get_num_common_prefix_blocks(self, request_id: int) -> int:
        """Before 0.33.0, cascade attention's shared prefix: 0 for a sparse kind (its prefix blocks are null)."""
        return 0

    def pop_blocks_for_free(self, request_id: int) -> list[KVCacheBlock]:
        self.num_cached_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    def free(self, request_id: int) -> None:
        """The request's blocks back to the pool, tail first."""
        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    def cached(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.block_pool.get_cached_block(self.block_pool.key(block_hash, self.kv_cache_group_id))


class FullAttentionManager(SingleTypeKVCacheManager):
    kind = FULL

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) \
            -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks from the start (a miss ends it: the hashes are chained)."""
        hit: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_length // self.block_size]:
            block = self.cached(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit, len(hit) * self.block_size

    def get_num_common_prefix_blocks(self, request_id: int) -> int:
        """The leading blocks of `request_id` that every request holding blocks holds (ref_cnt = their number)."""
        num_common = 0
        for block in self.req_to_blocks[request_id]:
            if block.ref_cnt != len(self.req_to_blocks):
                break
            num_common += 1
        return num_common


class SlidingWindowManager(SingleTypeKVCacheManager):
    kind = SWA

    def __init__(self, block_pool: BlockPool, block_size: int, kv_cache_group_id: int, sliding_window: int) -> None:
        super().__init__(block_pool, block_size, kv_cache_group_id)
        self.sliding_window = sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) \
            -> tuple[list[KVCacheBlock], int]:
        """From the right: the first `cdiv(sliding_window - 1, block_size)` contiguous cached blocks end the hit
        (null blocks before them); else the run of cached blocks that reaches block 0."""
        need = cdiv(self.sliding_window - 1, self.block_size)
        max_num_blocks = max_length // self.block_size
        computed: list[KVCacheBlock] = [self._null_block] * max_num_blocks
        contiguous = 0
        for i in range(max_num_blocks - 1, -1, -1):
            block = self.cached(block_hashes[i])
            if block is None:
                contiguous = 0
                continue
            computed[i] = block
            contiguous += 1
            if contiguous >= need:
                del computed[i + contiguous:]
                return computed, len(computed) * self.block_size
        del computed[contiguous:]
        return computed, len(computed) * self.block_size


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention (`ChunkedLocalAttentionSpec`): a token attends to the tokens of its own chunk of
    `attention_chunk_size` tokens only."""

    kind = LOCAL

    def __init__(self, block_pool: BlockPool, block_size: int, kv_cache_group_id: int,
                 attention_chunk_size: int) -> None:
        super().__init__(block_pool, block_size, kv_cache_group_id)
        self.attention_chunk_size = attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The tokens before the chunk the next token is in."""
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) \
            -> tuple[list[KVCacheBlock], int]:
        """Null blocks before the chunk `max_length` falls in (the next token reads none of them), then the run of
        cached blocks from the chunk's first block (a miss ends it)."""
        max_num_blocks = max_length // self.block_size
        local_attention_start_idx = max_length // self.attention_chunk_size * self.attention_chunk_size
        computed = [self._null_block] * (local_attention_start_idx // self.block_size)
        for block_hash in block_hashes[len(computed):max_num_blocks]:
            block = self.cached(block_hash)
            if block is None:
                break
            computed.append(block)
        return computed, len(computed) * self.block_size


class MambaManager(SingleTypeKVCacheManager):
    kind = MAMBA

    def __init__(self, block_pool: BlockPool, block_size: int, kv_cache_group_id: int,
                 mamba_cache_mode: str = ALIGN) -> None:
        super().__init__(block_pool, block_size, kv_cache_group_id)
        assert mamba_cache_mode in (ALIGN, ALL), mamba_cache_mode
        self.mamba_cache_mode = mamba_cache_mode

    def get_num_blocks_to_allocate(self, request_id: int, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock], total_computed_tokens: int,
                                   num_tokens_main_model: int) -> int:
        """`align`: at most one new block, the running state's (the rest of the table is null padding), and the
        hit's blocks that are free now; for the main model's tokens alone (no lookahead slot: it would break the
        alignment, and upstream's drafters have no Mamba layers). `all`: as attention, the lookahead included."""
        if self.mamba_cache_mode != ALIGN:
            return super().get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks,
                                                      total_computed_tokens, num_tokens_main_model)
        num_new = cdiv(num_tokens_main_model, self.block_size) - len(new_computed_blocks) \
            - len(self.req_to_blocks.get(request_id, ()))
        if num_new > 0:
            num_new = 1
        return num_new + sum(b.ref_cnt == 0 and not b.is_null for b in new_computed_blocks)

    def allocate_new_blocks(self, request_id: int, num_tokens: int, num_tokens_main_model: int) \
            -> list[KVCacheBlock]:
        """`align`: null blocks up to the main model's last required block, one new block there; the padding and
        the block."""
        if self.mamba_cache_mode != ALIGN:
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        blocks = self.req_to_blocks[request_id]
        num_required = cdiv(num_tokens_main_model, self.block_size)
        if num_required <= len(blocks):
            return []
        prev = len(blocks)
        blocks.extend([self._null_block] * (num_required - 1 - prev))
        new_blocks = self.block_pool.get_new_blocks(num_required - len(blocks))
        blocks.extend(new_blocks)
        return blocks[prev:]

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """`align`: every held block before the last computed token, tail first, past the null gaps."""
        if self.mamba_cache_mode != ALIGN:
            return super().remove_skipped_blocks(request_id, num_computed_tokens)
        blocks = self.req_to_blocks.get(request_id)
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens)
        if num_skipped <= 0 or not blocks:
            return
        freed = []
        for i in range(min(num_skipped // self.block_size, len(blocks)) - 1, -1, -1):
            if not blocks[i].is_null:
                freed.append(blocks[i])
                blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_length: int) \
            -> tuple[list[KVCacheBlock], int]:
        """The rightmost cached block: the state after its last token (null blocks before it)."""
        for i in range(max_length // self.block_size - 1, -1, -1):
            block = self.cached(block_hashes[i])
            if block is not None:
                return [self._null_block] * i + [block], (i + 1) * self.block_size
        return [], 0


def get_manager_for_kind(kind: str, block_pool: BlockPool, block_size: int, kv_cache_group_id: int,
                         sliding_window: int, mamba_cache_mode: str = ALIGN, attention_chunk_size: int = 0) \
        -> SingleTypeKVCacheManager:
    if kind == SWA:
        return SlidingWindowManager(block_pool, block_size, kv_cache_group_id, sliding_window)
    if kind == LOCAL:
        return ChunkedLocalAttentionManager(block_pool, block_size, kv_cache_group_id, attention_chunk_size)
    if kind == MAMBA:
        return MambaManager(block_pool, block_size, kv_cache_group_id, mamba_cache_mode)
    return FullAttentionManager(block_pool, block_size, kv_cache_group_id)
