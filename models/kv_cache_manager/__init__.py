"""kv-cache-manager: vLLM's KV cache manager (vllm/v1/core/, 0.33.0): the block pool and the request life cycle
over one or several KV cache groups (full attention, sliding window, Mamba), and the local hit handed to a KV
connector (#48195).

* `kv_cache_utils`: the block, the free-block queue (eviction order), the chained block hash.
* `kv_events`: `BlockStored`, `BlockRemoved`, `AllBlocksCleared`.
* `event_stream`: a recorded stream of those events as vLLM publishes them (`KVEventBatch` JSON) and the
  transition system of what it alone allows (`EventStreamSystem`: the announced view; `kvsim events`).
* `block_pool`: `BlockPool` (ref counts, the null block, the cached-block map, eviction, `reset_prefix_cache`).
* `single_type_kv_cache_manager`: one group's tables per request: `FullAttentionManager`, `SlidingWindowManager`
  (blocks before the window freed, the null block in their place), `MambaManager` (the state block).
* `kv_cache_coordinator`: `KVCacheCoordinator` over the groups: the reconciled hit every group backs
  (`find_longest_cache_hit`) and the per-group hits (`find_longest_cache_hit_per_group`).
* `kv_cache_manager`: `KVCacheManager` (`get_computed_blocks`, `get_computed_blocks_for_connector`,
  `allocate_slots`, `free`) and `connector_local_hit`, what the scheduler hands a KV connector.
* `checks`, `actions`, `system`: the manager under a few requests as a transition system (`CacheManagerSystem`,
  its config `CacheManagerConfig`: the `kvsim explore --param`s) and its invariants.
* `symmetry`: block ids are names; the explorer keeps one state per renaming of the blocks.
* `chart`: the actors of its sequence charts (`kvsim show`): the scheduler, the manager, a KV connector.
* `variants`: `fixed` (0.33.0) and `pre_48195` (0.26.0's scheduler: the connector's local hit is the maximum of
  the per-group hits).
"""

from kvsim.engine.descriptor import ModelDescriptor

from .system import CacheManagerConfig, CacheManagerSystem
from .variants import FIXED, VARIANTS, CacheManagerVariant

DESCRIPTOR = ModelDescriptor(
    name="kv-cache-manager",
    summary="vLLM's KV cache manager: the block pool (ref counts, null block, free queue in eviction order, chained "
            "block hashes, cached-block map, KV events) under the request life cycle of one or several KV cache "
            "groups (full attention, sliding window, Mamba), and the local hit handed to a KV connector (#48195)",
    source="vllm 0.33.0 (vllm/v1/core/block_pool.py, kv_cache_utils.py, kv_cache_manager.py, "
           "kv_cache_coordinator.py, single_type_kv_cache_manager.py); 0.26.0's scheduler for pre_48195",
    variants=VARIANTS,
    config=CacheManagerConfig,
    system=CacheManagerSystem,
)

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "CacheManagerVariant"]
