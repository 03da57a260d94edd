"""kv-cache-manager: vLLM's KV cache manager (vllm/v1/core/, 0.33.0), first slice: the block pool and the
request life cycle of one full-attention group.

* `kv_cache_utils`: the block, the free-block queue (eviction order), the chained block hash.
* `kv_events`: `BlockStored`, `BlockRemoved`, `AllBlocksCleared`.
* `block_pool`: `BlockPool` (ref counts, the null block, the cached-block map, eviction, `reset_prefix_cache`).
* `kv_cache_manager`: `KVCacheManager` for full attention (`get_computed_blocks`, `allocate_slots`,
  `cache_blocks`, `free`).
* `checks`, `actions`, `system`: the manager under a few requests as a transition system (`CacheManagerSystem`,
  its config `CacheManagerConfig`: the `kvsim explore --param`s) and its invariants.
* `symmetry`: block ids are names; the explorer keeps one state per renaming of the blocks.
* `variants`: `fixed`, and `pre_50297` (read by `scheduler`).
* `scheduler`: the P/D life cycle of the scheduler around the manager on a KV-producing instance (vLLM #50297),
  its own transition system (`ProducerSchedulerSystem`, config `ProducerSchedulerConfig`): the second model of
  this package, `kv-cache-manager-pd`. A package with two systems declares a descriptor for each and lists them
  in `DESCRIPTORS` (the catalog registers every one); `DESCRIPTOR` stays its first.
"""

from kvsim.engine.descriptor import ModelDescriptor

from .scheduler import ProducerSchedulerConfig, ProducerSchedulerSystem
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

PD_DESCRIPTOR = ModelDescriptor(
    name="kv-cache-manager-pd",
    summary="vLLM's scheduler around the KV cache manager on a KV-producing (prefill) instance: async steps, "
            "preemption racing a request's final step, request_finished handing the connector its blocks, "
            "delivery then free (#50297)",
    source="vllm 0.27.0 (vllm/v1/core/sched/scheduler.py, kv_connector/v1/base.py requires_kv_delivery)",
    variants=VARIANTS,
    config=ProducerSchedulerConfig,
    system=ProducerSchedulerSystem,
)
DESCRIPTORS = (DESCRIPTOR, PD_DESCRIPTOR)

__all__ = ["DESCRIPTOR", "DESCRIPTORS", "PD_DESCRIPTOR", "FIXED", "VARIANTS", "CacheManagerVariant"]
