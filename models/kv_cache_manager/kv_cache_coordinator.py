"""The KV cache coordinator over one or several KV cache groups (vLLM 0.33.0 `vllm/v1/core/kv_cache_coordinator.py`,
in kvsim's words): one single-type manager per group over the one shared `BlockPool`.

Each call of the manager is made on every group in group order (allocation counts summed, frees group by group,
each group's table tail first). What a hybrid coordinator adds is how the per-group hits are reconciled:

* `find_longest_cache_hit` (upstream `HybridKVCacheCoordinator`): a length every group accepts. Full attention is
  looked up first (its hit is downward closed); each other group is asked for a hit no longer than the current
  length and may shorten it; the loop repeats until no group shortens it (one pass for full attention and one
  other kind), and the full-attention blocks are cut to the final length;
* `find_longest_cache_hit_per_group`: every group looked up on its own up to the same bound. The per-group hits
  may differ: a full-attention tail evicted while a deeper Mamba state or sliding-window tail survives.

One group is upstream's `UnitaryKVCacheCoordinator`: the group's own hit.
"""

from __future__ import annotations

from typing import Sequence

from .block_pool import BlockPool
from .kv_cache_utils import BlockHash, KVCacheBlock
from .single_type_kv_cache_manager import ALIGN, FULL, MAMBA, SingleTypeKVCacheManager, cdiv, get_manager_for_kind

GroupBlocks = tuple  # one list of blocks per KV cache group


class KVCacheCoordinator:
    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[str] = (FULL,),
                 sliding_window: int = 0, mamba_cache_mode: str = ALIGN, attention_chunk_size: int = 0) -> None:
        assert groups and len(set(groups)) == len(groups), groups
        self.groups = tuple(groups)
        self.block_pool = BlockPool(num_blocks, hybrid=len(self.groups) > 1)
        self.make_managers(block_size, sliding_window, mamba_cache_mode, attention_chunk_size)

    def make_managers(self, block_size: int, sliding_window: int, mamba_cache_mode: str = ALIGN,
                      attention_chunk_size: int = 0) -> None:
        self.block_size, self.sliding_window = block_size, sliding_window
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kind(kind, self.block_pool, block_size, gid, sliding_window, mamba_cache_mode,
                                 attention_chunk_size)
            for gid, kind in enumerate(self.groups))
        # the lookup order: full attention first (its left-to-right scan bounds the others), then group order
        self.attention_groups = sorted(range(len(self.groups)), key=lambda g: self.groups[g] != FULL)
        self.full_attention_group_id = self.groups.index(FULL) if FULL in self.groups else None

    @property
    def has_mamba_layers(self) -> bool:
        return MAMBA in self.groups

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1

    # -- allocation ------------------------------------------------------------------------------------------
    def get_num_blocks_to_allocate(self, request_id: int, num_tokens: int, new_computed_blocks: GroupBlocks,
                                   total_computed_tokens: int, num_tokens_main_model: int) -> int:
        """`num_tokens` slots (the lookahead's included), `num_tokens_main_model` the main model's part."""
        return sum(m.get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks[g], total_computed_tokens,
                                                num_tokens_main_model)
                   for g, m in enumerate(self.single_type_managers))

    def allocate_new_computed_blocks(self, request_id: int, new_computed_blocks: GroupBlocks,
                                     total_computed_tokens: int) -> None:
        """A request's first allocation adopts its hit in every group (a running request has none: no-op)."""
        if any(request_id in m.num_cached_block for m in self.single_type_managers):
            assert all(not blocks for blocks in new_computed_blocks)
            return
        for g, m in enumerate(self.single_type_managers):
            m.add_local_computed_blocks(request_id, new_computed_blocks[g], total_computed_tokens)

    def allocate_new_blocks(self, request_id: int, num_tokens: int, num_tokens_main_model: int) -> GroupBlocks:
        return tuple(m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
                     for m in self.single_type_managers)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:  # type: ignore[no-untyped-def]
        for m in self.single_type_managers:
            m.cache_blocks(request, num_computed_tokens)

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)

    def free(self, request_id: int) -> None:
        """Group by group, each group's blocks tail first."""
        for m in self.single_type_managers:
            m.free(request_id)

    def get_blocks(self, request_id: int) -> GroupBlocks:
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.single_type_managers)

    # -- the hit ---------------------------------------------------------------------------------------------
    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int) \
            -> tuple[GroupBlocks, int]:
        """The per-group hit blocks and the one length every group accepts."""
        if not self.is_hybrid:
            blocks, hit = self.single_type_managers[0].find_longest_cache_hit(block_hashes, max_cache_hit_length)
            return (blocks,), hit
        hit_length = max_cache_hit_length
        blocks_by_group: list[list[KVCacheBlock] | None] = [None] * len(self.groups)
        length_by_group = [0] * len(self.groups)
        simple = len(self.groups) == 2 and self.groups[self.attention_groups[0]] == FULL
        while True:
            curr = hit_length
            for g in self.attention_groups:
                m = self.single_type_managers[g]
                if m.kind == FULL and blocks_by_group[g] is not None:
                    curr = min(curr, length_by_group[g])  # downward closed: cut, never looked up again
                    continue
                blocks_by_group[g], curr = m.find_longest_cache_hit(block_hashes, curr)
                length_by_group[g] = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for g, kind in enumerate(self.groups):
            blocks = blocks_by_group[g]
            if kind == FULL and blocks is not None:
                del blocks[cdiv(hit_length, self.block_size):]
        return tuple(b if b is not None else [] for b in blocks_by_group), hit_length

    def find_longest_cache_hit_per_group(self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int) \
            -> tuple[GroupBlocks, tuple[int, ...]]:
        """Every group's own hit up to the same bound, unreconciled."""
        found = [self.single_type_managers[g].find_longest_cache_hit(block_hashes, max_cache_hit_length)
                 for g in range(len(self.groups))]
        return tuple(blocks for blocks, _ in found), tuple(hit for _, hit in found)
