"""kv-cache-manager: vLLM's KV cache manager (vllm/v1/core/, 0.33.0): the block pool and the request life cycle
over one or several KV cache groups (full attention, sliding window, Mamba), and the local hit handed to a KV
connector (#48195).

* `kv_cache_utils`: the block, the free-block queue (eviction order), the chained block hash.
* `kv_events`: `BlockStored`, `BlockRemoved`, `AllBlocksCleared`.
* `event_stream`: a recorded stream of those events as vLLM publishes them (`KVEventBatch` JSON) and the
  transition system of what it alone allows (`EventStreamSystem`: the announced view; `kvsim events`).
* `block_pool`: `BlockPool` (ref counts, the null block, the cached-block map, eviction, `reset_prefix_cache`).
* `single_type_kv_cache_manager`: one group's tables per request: `FullAttentionManager`, `SlidingWindowManager`
  (blocks before the window freed, the null block in their place), `MambaManager` (the state block, in prefix-
  caching mode `align`, 0.33.0's only one: one state block per allocation after null padding; or `all`).
* `kv_cache_coordinator`: `KVCacheCoordinator` over the groups: the reconciled hit every group backs
  (`find_longest_cache_hit`) and the per-group hits (`find_longest_cache_hit_per_group`).
* `kv_cache_manager`: `KVCacheManager` (`get_computed_blocks`, `get_computed_blocks_for_connector`,
  `allocate_slots` with lookahead slots, `free`, `get_num_common_prefix_blocks`) and `connector_local_hit`, what
  the scheduler hands a KV connector.
* `checks`, `actions`, `system`: the manager under a few requests as a transition system (`CacheManagerSystem`,
  its config `CacheManagerConfig`: the `kvsim explore --param`s) and its invariants.
* `model_runner`: what the model runner writes where the manager's tables point (`step_writes`), the ledger
  `checks.hit_state_identity` reads: the block a hit reuses holds the state of exactly that prefix (the A→B→A
  family, #50630, run on the real coordinator by `kvsim.conform.vllm.aba`).
* `symmetry`: block ids are names; the explorer keeps one state per renaming of the blocks.
* `chart`: the actors of its sequence charts (`kvsim show`): the scheduler, the manager, a KV connector.
* `variants`: `fixed` (0.33.0), `pre_48195` (0.26.0's scheduler: the connector's local hit is the maximum of
  the per-group hits; Mamba in 0.26.0's default mode `all`), `mamba_all` (Mamba prefix caching in mode `all`, 0.26.0
  and 0.27.0's default, removed in 0.33.0), `pre_50297`, `pre_55055` and `truncates_skip_reading` (0.31.0's P side,
  which truncates a producer asking for prompt logprobs) (read by `scheduler`).
* `scheduler`: the P/D life cycle of the scheduler around the manager on a KV-producing instance (vLLM #50297,
  #55055), its own transition system (`ProducerSchedulerSystem`, config `ProducerSchedulerConfig`): the second
  model of this package, `kv-cache-manager-pd`. A package with two systems declares a descriptor for each and
  lists them in `DESCRIPTORS` (the catalog registers every one); `DESCRIPTOR` stays its first.
* `sim`: the timed request workload (`kvsim simulate kv-cache-manager`), a timing policy over `CacheManagerSystem`.
* `scheduler_sim`: the timed P/D workload (`kvsim simulate kv-cache-manager-pd`: producer and local arrivals,
  preemption under pressure, the decode side's read after a drawn delay), a timing policy over
  `ProducerSchedulerSystem`. `workload`: what the two share (the driver, the queues, arrivals, the step clock).
* `conform`: the real released `KVCacheManager` in lockstep with the model (`kvsim conform vllm --target
  kv_cache_manager_lockstep`).
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import scheduler_sim, sim
from .conform import CONFORM
from .scheduler import ProducerSchedulerConfig, ProducerSchedulerSystem
from .system import CacheManagerConfig, CacheManagerSystem
from .variants import FIXED, PD_VARIANTS, VARIANTS, CacheManagerVariant

DESCRIPTOR = ModelDescriptor(
    name="kv-cache-manager",
    summary="vLLM's KV cache manager: the block pool (ref counts, null block, free queue in eviction order, chained "
            "block hashes, cached-block map, KV events) under the request life cycle of one or several KV cache "
            "groups (full attention, sliding window, Mamba), and the local hit handed to a KV connector (#48195)",
    source="vllm 0.33.0 (vllm/v1/core/block_pool.py, kv_cache_utils.py, kv_cache_manager.py, "
           "kv_cache_coordinator.py, single_type_kv_cache_manager.py); 0.26.0's scheduler for pre_48195; "
           "Mamba prefix-caching mode all (0.26.0 and 0.27.0's default) for mamba_all and pre_48195",
    variants=VARIANTS,
    config=CacheManagerConfig,
    system=CacheManagerSystem,
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    conform=CONFORM,
)

PD_DESCRIPTOR = ModelDescriptor(
    name="kv-cache-manager-pd",
    summary="vLLM's scheduler around the KV cache manager on a KV-producing (prefill) instance: async steps, "
            "preemption racing a request's final step, request_finished handing the connector its blocks, "
            "delivery then free (#50297), and the prefill backoff over an MTP drafter's lookahead (#55055)",
    source="vllm 0.27.0 (vllm/v1/core/sched/scheduler.py, kv_connector/v1/base.py requires_kv_delivery); "
           "0.31.0 for #55055's prefill backoff",
    variants=PD_VARIANTS,
    config=ProducerSchedulerConfig,
    system=ProducerSchedulerSystem,
    sim_config=scheduler_sim.SimConfig,
    simulate=scheduler_sim.simulate,
)
DESCRIPTORS = (DESCRIPTOR, PD_DESCRIPTOR)

__all__ = ["DESCRIPTOR", "DESCRIPTORS", "PD_DESCRIPTOR", "FIXED", "PD_VARIANTS", "VARIANTS", "CacheManagerVariant"]
