"""kv-cache-manager: vLLM's KV cache manager (vllm/v1/core/, 0.33.0), first slice: the block pool and the
request life cycle of one full-attention group.

* `kv_cache_utils`: the block, the free-block queue (eviction order), the chained block hash.
* `kv_events`: `BlockStored`, `BlockRemoved`, `AllBlocksCleared`.
* `event_stream`: a recorded stream of those events as vLLM publishes them (`KVEventBatch` JSON) and the
  transition system of what it alone allows (`EventStreamSystem`: the announced view; `kvsim events`).
* `block_pool`: `BlockPool` (ref counts, the null block, the cached-block map, eviction, `reset_prefix_cache`).
* `kv_cache_manager`: `KVCacheManager` for full attention (`get_computed_blocks`, `allocate_slots`,
  `cache_blocks`, `free`).
* `checks`, `actions`, `system`: the manager under a few requests as a transition system (`CacheManagerSystem`,
  its config `CacheManagerConfig`: the `kvsim explore --param`s) and its invariants.
* `symmetry`: block ids are names; the explorer keeps one state per renaming of the blocks.
* `variants`: `fixed` only this slice.
"""

from kvsim.engine.descriptor import ModelDescriptor

from .system import CacheManagerConfig, CacheManagerSystem
from .variants import FIXED, VARIANTS, CacheManagerVariant

DESCRIPTOR = ModelDescriptor(
    name="kv-cache-manager",
    summary="vLLM's KV cache manager, first slice: the block pool (ref counts, null block, free queue in eviction "
            "order, chained block hashes, cached-block map, KV events) under one full-attention group's request "
            "life cycle",
    source="vllm 0.33.0 (vllm/v1/core/block_pool.py, kv_cache_utils.py, kv_cache_manager.py)",
    variants=VARIANTS,
    config=CacheManagerConfig,
    system=CacheManagerSystem,
)

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "CacheManagerVariant"]
