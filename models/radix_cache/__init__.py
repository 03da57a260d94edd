"""radix-cache: SGLang's radix cache and paged KV allocator (sglang/srt/mem_cache/, 0.5.23) under the life cycle the
scheduler drives for a plain request (no chunked prefill), optionally with EAGLE speculative decoding's page
accounting (`num_draft_tokens`).

* `allocator`: `PagedTokenToKVPoolAllocator` (page 0 reserved, freed pages to the front of the free list or staged
  and sorted with `need_sort`, free groups).
* `radix_cache`: `TreeNode`, `RadixCache` (page-aligned keys, match with node split, insert, lock counts, LRU
  eviction on a logical clock).
* `memory_pool`: `ReqToTokenPool`, the request pool's free rows (a row per running request).
* `common`: the scheduler's calls for one request (`match_kv_cache`, `admit`, `check_decode_mem`, `alloc_decode`,
  `checkpoint`, `release_kv_cache`).
* `eagle`: EAGLE's draft allocation per decode step (`page_aligned_decode_alloc_lens`, `eagle_prepare_for_decode`,
  the spec `check_decode_mem`), #31616; the release of the rejected drafts' slots is `common`'s
  `_release_overallocated_kv_indices`.
* `checks`, `system`: the transition system (`RadixCacheSystem`, config `RadixCacheConfig`) and its invariants.
* `request_loop`: what the two systems share (statuses, the admit / decode / retract actions, the requests' prompts).
* `variants`: radix-cache's `fixed` and `pre_31616` (EAGLE's unaligned decode allocation length, 0.5.15);
  radix-cache-swa's `fixed` and `pre_28161`.
* `unified_swa`, `mamba`, `swa_system`: the package's second model, `radix-cache-swa`: the unified radix cache's Full
  and SWA components and optionally Mamba (per-node lock counts in order full >= swa >= mamba, the sliding-window
  lock and its early release `dec_swa_lock_only`, tombstones, the Mamba state pool, LRU eviction of each pool and
  the cascade between components) under the scheduler's life cycle (`UnifiedSwaSystem`, config
  `UnifiedSwaConfig`), SGLang #28161.
* `sim`: `kvsim simulate radix-cache`, a shared-prefix request workload with retractions under pressure, a timing
  policy (prefill or decode batches, `retract_decode`'s victim order) over `RadixCacheSystem`.
* `conform`: the real released `RadixCache` and paged allocator in lockstep with the model (`kvsim conform sglang
  --target radix_cache_lockstep`, `kvsim.conform.sglang.radix_lockstep`), and EAGLE's `eagle_prepare_for_decode`
  against `eagle` (`--target eagle_prepare_for_decode`, `kvsim.conform.sglang.eagle_alloc`).

The op vocabulary, for a lockstep to mirror (slots are ints, sequences tuples):

tree (`radix_cache.RadixCache(allocator, page_size)`)
  `match_prefix(tokens) -> (prefix_len, indices, last_node)`   longest cached page-aligned prefix (may split a node)
  `insert(tokens, indices) -> (prefix_len, last_node)`         prefix_len: tokens of the aligned key already there
  `inc_lock_ref(node) -> delta`, `dec_lock_ref(node) -> delta` delta: the change of evictable_size
  `evict(num_tokens) -> evicted`                               tokens freed (whole unlocked leaves, LRU first)
  `evictable_size()`, `protected_size()`, `path_device_indices(node)`, `node_at(path)`, `freeze()`
allocator (`allocator.PagedTokenToKVPoolAllocator(num_pages, page_size, need_sort)`)
  `alloc(n) -> indices | None`                                 n // page_size whole pages, front of the free list
  `alloc_extend(prefix_len, seq_len, last_loc) -> indices | None`, `alloc_decode(seq_len, last_loc) -> indices | None`
  `free(indices)`, `free_segment(indices, start_pos)`, `free_page_ids(pages)`, `free_group_begin()`,
  `free_group_end()`, `available_size()`, `freeze() -> AllocatorState(free_pages, staged_pages)`
request (`common`, on a `Req`: its row, cache_protected_len, lock)
  `admit(tree, allocator, req) -> (prefix_len, new_slots) | None`   match (key capped at len - 1), lock, evict, extend
  `checkpoint(tree, allocator, req, up_to) -> prefix_len`            insert, free duplicates, repoint, move the lock
  `check_decode_mem(tree, allocator, req) -> bool`, `alloc_decode(tree, allocator, req) -> slots`
  `release_kv_cache(tree, allocator, req, checkpointed)`            checkpoint?, free the row past the tree, unlock
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import sim
from .conform import CONFORM, SWA_CONFORM
from .swa_system import UnifiedSwaConfig, UnifiedSwaSystem
from .system import RadixCacheConfig, RadixCacheSystem
from .variants import FIXED, SWA_VARIANTS, VARIANTS, RadixCacheVariant

DESCRIPTOR = ModelDescriptor(
    name="radix-cache",
    summary="SGLang's radix cache (page-aligned match with node split, insert, lock counts, LRU eviction) over the "
            "paged KV allocator (page 0 reserved, free-list order, free groups), under the scheduler's life cycle "
            "of a plain request (match and lock, extend, checkpoint, decode, retract, release), and EAGLE speculative "
            "decoding's draft allocation and its release (#31616)",
    source="sglang 0.5.23 (sglang/srt/mem_cache/radix_cache.py, allocator/paged.py, common.py, allocation.py, "
           "allocation_sizing.py; speculative/eagle_utils.py); 0.5.15 for pre_31616",
    variants=VARIANTS,
    config=RadixCacheConfig,
    system=RadixCacheSystem,
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    conform=CONFORM,
)
SWA_DESCRIPTOR = ModelDescriptor(
    name="radix-cache-swa",
    summary="SGLang's unified radix cache with a sliding-window component and optionally a Mamba component: per-node "
            "Full, SWA and Mamba lock counts, the SWA window lock and its early release past the window "
            "(dec_swa_lock_only, #28161), tombstones, the Mamba state pool, LRU eviction of each pool, under the "
            "scheduler's life cycle (admit, decode, retract, finish)",
    source="sglang 0.5.15 (sglang/srt/mem_cache/unified_radix_cache.py, unified_cache_components/swa_component.py, "
           "full_component.py, mamba_component.py, allocator/swa.py, memory_pool.py MambaSlotAllocator; "
           "managers/schedule_batch.py maybe_evict_swa); 0.5.13 for pre_28161, "
           "0.5.14 for pre_locked_full_recovery, 0.5.20's unified_cache/ TreeCore for tree_core",
    variants=SWA_VARIANTS,
    config=UnifiedSwaConfig,
    system=UnifiedSwaSystem,
    conform=SWA_CONFORM,
)
DESCRIPTORS = (DESCRIPTOR, SWA_DESCRIPTOR)

__all__ = ["DESCRIPTOR", "DESCRIPTORS", "SWA_DESCRIPTOR", "FIXED", "SWA_VARIANTS", "VARIANTS", "RadixCacheVariant"]
