"""The KV cache manager's request life cycle (vLLM 0.33.0 `vllm/v1/core/kv_cache_manager.py`, in kvsim's words),
over the coordinator (`kv_cache_coordinator`) of one or several KV cache groups (`single_type_kv_cache_manager`).

- `get_computed_blocks`: the coordinator's reconciled hit (one length every group backs), capped at
  `num_tokens - 1` tokens: a prompt that is wholly cached still computes its last token (for the logits),
  so a hit is never the whole prompt.
- `get_computed_blocks_for_connector` (0.27.0+, the #48195 fix): the local hit handed to a KV connector. For a
  hybrid model with Mamba layers it is the full-attention group's own hit when no group hit deeper (the Mamba
  state is sent by the connector), else the reconciled hit; otherwise `get_computed_blocks`.
  `connector_local_hit` is what the scheduler hands the connector, where the variant flag of #48195 is read
  (`pre_48195`, vLLM 0.26.0's scheduler: the maximum of the per-group hits).
- `allocate_slots`: free the blocks the window left behind (`remove_skipped_blocks`), then refuse (None) when the
  pool cannot give the blocks every group needs; else adopt the hit (touch it, null blocks for the skipped part),
  take the new blocks from the free queue, and `cache_blocks` the blocks the computed tokens fill. Slots are
  given to `num_tokens_need_slot` tokens: the main model's (`num_tokens_main_model`: the computed ones and the new
  ones) and `num_lookahead_tokens` more (a drafter's speculative slots: counted in the blocks needed and
  allocated, never cached, as caching stops at the request's own tokens). Mamba in mode `align` allocates for the
  main model's tokens alone (upstream: current drafters have no Mamba layers). Encoder tokens
  (`num_encoder_tokens`) are allocated only by a cross-attention group (upstream's coordinator hands them to
  `CrossAttentionManager` alone; full attention, sliding window and Mamba never read them): the model has no such
  group, so its `allocate_slots` does not take them.
- `get_num_common_prefix_blocks`: per group, 0 (from 0.32.0: cascade attention removed, the method kept for
  out-of-tree schedulers); before it (`counted`, 0.26.0-0.31.0, for the scheduler's cascade attention) a
  full-attention group counts the leading blocks of a running request that every request holding blocks holds
  (`ref_cnt` equal to their number), the other kinds 0. No action calls it (the model's scheduler has no cascade
  attention), so it is a reading, not a variant: the lockstep compares it with the real manager's after every
  step, `counted` by release (`manager_lockstep.COMMON_PREFIX_RELEASES`).
- `free`: the request's blocks back to the pool, group by group, each tail first (so its tail is evicted first).
- `remove_skipped_blocks`: what `allocate_slots` frees first, on its own (the scheduler's call before a finished
  request's blocks go to a KV connector).

Mamba's prefix-caching mode (`mamba_cache_mode`: `align`, 0.33.0's only one, or `all`) is the managers'
(`single_type_kv_cache_manager`); the table of a request holds no more than what it implies.

Not modelled: chunked prefill's partial allocations beyond one call, cross-attention groups (so encoder tokens),
`max_model_len`'s cap on the slots (every program stays below it), external (connector) tokens, the watermark, block sizes that differ between groups, EAGLE, partial hits.
`ManagerState` is the value form the transition system keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from .block_pool import BlockPool, PoolState
from .kv_cache_coordinator import GroupBlocks, KVCacheCoordinator
from .kv_cache_utils import BlockHash, KVCacheBlock, request_block_hashes
from .single_type_kv_cache_manager import ALIGN, FULL, cdiv

__all__ = ["KVCacheManager", "ManagerState", "Request", "cdiv", "connector_local_hit"]


@dataclass
class Request:
    """What the manager reads of a request: its tokens (prompt, then outputs) and how many are computed."""

    request_id: int
    all_token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    block_size: int = field(default=1, repr=False)
    # upstream's `skip_reading_prefix_cache` (a request asking for prompt logprobs): its lookup finds nothing
    skip_reading_prefix_cache: bool = field(default=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def block_hashes(self) -> tuple[BlockHash, ...]:
        return request_block_hashes(self.all_token_ids, self.block_size)


class ManagerState(NamedTuple):
    pool: PoolState
    # per group, then per request (group-major: group g's request r at g * num_requests + r): (block ids, num
    # cached blocks) or None; one group is the request tables as they were before groups
    tables: tuple[tuple[tuple[int, ...], int] | None, ...]


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, num_requests: int, groups: Sequence[str] = (FULL,),
                 sliding_window: int = 0, mamba_cache_mode: str = ALIGN, attention_chunk_size: int = 0) -> None:
        self.block_size = block_size
        self.num_requests = num_requests
        self.coordinator = KVCacheCoordinator(num_blocks, block_size, groups, sliding_window, mamba_cache_mode,
                                              attention_chunk_size)
        self.block_pool = self.coordinator.block_pool

    @property
    def groups(self) -> tuple[str, ...]:
        return self.coordinator.groups

    # -- the value form --------------------------------------------------------------------------------------
    def freeze(self) -> ManagerState:
        tables = tuple((tuple(b.block_id for b in m.req_to_blocks[r]), m.num_cached_block[r])
                       if r in m.num_cached_block else None
                       for m in self.coordinator.single_type_managers for r in range(self.num_requests))
        return ManagerState(self.block_pool.freeze(), tables)

    @classmethod
    def thaw(cls, state: ManagerState, block_size: int, groups: Sequence[str] = (FULL,),
             sliding_window: int = 0, mamba_cache_mode: str = ALIGN, attention_chunk_size: int = 0) \
            -> "KVCacheManager":
        m = cls.__new__(cls)
        m.block_size = block_size
        m.num_requests = len(state.tables) // len(groups)
        coordinator = KVCacheCoordinator.__new__(KVCacheCoordinator)
        coordinator.groups = tuple(groups)
        coordinator.block_pool = BlockPool.thaw(state.pool, hybrid=len(groups) > 1)
        coordinator.make_managers(block_size, sliding_window, mamba_cache_mode, attention_chunk_size)
        m.coordinator, m.block_pool = coordinator, coordinator.block_pool
        blocks = coordinator.block_pool.blocks
        for g, manager in enumerate(coordinator.single_type_managers):
            for r in range(m.num_requests):
                table = state.tables[g * m.num_requests + r]
                if table is not None:
                    manager.req_to_blocks[r] = [blocks[i] for i in table[0]]
                    manager.num_cached_block[r] = table[1]
        return m

    # -- the request life cycle ------------------------------------------------------------------------------
    def max_cache_hit_length(self, request: Request) -> int:
        """A hit leaves at least one token to compute: the last one gives the logits."""
        return request.num_tokens - 1

    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        """Per group, the cached blocks of the longest prefix every group backs, and the tokens they cover; none
        for a request that skips reading the prefix cache (`prefix_cache_lookup_enabled`)."""
        if request.skip_reading_prefix_cache:
            return tuple([] for _ in self.groups), 0
        return self.coordinator.find_longest_cache_hit(request.block_hashes, self.max_cache_hit_length(request))

    def get_computed_blocks_for_connector(self, request: Request) -> tuple[GroupBlocks, int]:
        """The local hit handed to a KV connector (0.27.0+): with Mamba layers, the full-attention hit unless a
        group hit deeper than it (then the reconciled hit); without, `get_computed_blocks`. A group that lags the
        full-attention hit is upstream's `hit_diverged` (not returned here): the connector supplies it (a Mamba
        state), or the scheduler reconciles with `get_computed_blocks` when the connector loads nothing."""
        coordinator = self.coordinator
        fa = coordinator.full_attention_group_id
        if not (coordinator.has_mamba_layers and coordinator.is_hybrid and fa is not None):
            return self.get_computed_blocks(request)
        computed, per_group_hits = coordinator.find_longest_cache_hit_per_group(
            request.block_hashes, self.max_cache_hit_length(request))
        if any(hit > per_group_hits[fa] for hit in per_group_hits):
            return self.get_computed_blocks(request)
        return computed, per_group_hits[fa]

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: GroupBlocks | None = None, num_lookahead_tokens: int = 0) \
            -> GroupBlocks | None:
        """Slots for `num_new_tokens` more tokens after the computed ones (the hit's included) and
        `num_lookahead_tokens` speculative ones after them; None when the free queue cannot give them (the blocks
        behind the window are freed first, as upstream does). Caches the blocks the request's own tokens fill (a
        lookahead slot is never cached). The new blocks, per group."""
        coordinator = self.coordinator
        hit = new_computed_blocks if new_computed_blocks is not None else tuple([] for _ in self.groups)
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_main_model = total_computed + num_new_tokens
        num_tokens_need_slot = num_tokens_main_model + num_lookahead_tokens
        rid = request.request_id
        coordinator.remove_skipped_blocks(rid, total_computed)
        if coordinator.get_num_blocks_to_allocate(rid, num_tokens_need_slot, hit, total_computed,
                                                  num_tokens_main_model) > self.block_pool.get_num_free_blocks():
            return None
        coordinator.allocate_new_computed_blocks(rid, hit, total_computed)
        new_blocks = coordinator.allocate_new_blocks(rid, num_tokens_need_slot, num_tokens_main_model)
        coordinator.cache_blocks(request, min(num_tokens_main_model, request.num_tokens))
        return new_blocks

    def get_num_common_prefix_blocks(self, request_id: int, counted: bool = False) -> list[int]:
        """Per group, 0 (0.32.0 on). `counted` (0.26.0-0.31.0, as the release's manager reads it): a
        full-attention group's leading blocks of running request `request_id` held by every request holding
        blocks in it; 0 for the other kinds."""
        if not counted:
            return [0] * len(self.groups)
        return [m.get_num_common_prefix_blocks(request_id) for m in self.coordinator.single_type_managers]

    def free(self, request: Request) -> None:
        """The request's blocks back to the pool, group by group, each tail first."""
        self.coordinator.free(request.request_id)

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """The blocks the window (a Mamba state: all but the last) no longer reads, freed and replaced by the null
        block; the scheduler calls it before a finished request's blocks are handed to a KV connector."""
        self.coordinator.remove_skipped_blocks(request_id, num_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def take_events(self) -> tuple[tuple, ...]:
        return self.block_pool.take_events()

    def get_block_ids(self, request_id: int) -> tuple[list[int], ...]:
        """Per group, the request's block ids (0: the null block)."""
        return tuple([b.block_id for b in blocks] for blocks in self.coordinator.get_blocks(request_id))


def connector_local_hit(manager: KVCacheManager, request: Request, from_full_attention: bool) \
        -> tuple[GroupBlocks, int]:
    """The local computed blocks and tokens the scheduler hands a KV connector (its `get_num_new_matched_tokens`
    reads the tokens). `from_full_attention` (the variant's `connector_hit_from_full_attention`, 0.27.0+):
    `get_computed_blocks_for_connector`. Without it (`pre_48195`, 0.26.0's scheduler):
    for a hybrid model with Mamba layers, every group's own blocks and the maximum of the per-group hits, which
    a group whose tail was evicted cannot back."""
    coordinator = manager.coordinator
    if from_full_attention:
        return manager.get_computed_blocks_for_connector(request)
    if coordinator.has_mamba_layers and coordinator.is_hybrid:
        computed, per_group_hits = coordinator.find_longest_cache_hit_per_group(
            request.block_hashes, manager.max_cache_hit_length(request))
        return computed, max(per_group_hits)
    return manager.get_computed_blocks(request)
