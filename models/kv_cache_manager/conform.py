"""The engine code `kv-cache-manager` is checked against (`kvsim conform vllm`): declarations only.

`KVCacheManager` (target `kv_cache_manager_lockstep`): vLLM's real manager, imported from the release in a child
process (`kvsim.conform.installed`), in lockstep with the model (`kvsim.conform.vllm.manager_lockstep`). The
declared files are not loaded in kvsim's process (no names); `checked` names the definitions of one full-attention
group's request life cycle, whose lines `--coverage` counts (traced in the child) and whose mutants `--mutants`
loads into the child.
"""

from kvsim.engine.conformance.declare import ConformTarget, Upstream

CORE = "vllm/v1/core/"
BLOCK_POOL, MANAGER, SINGLE_TYPE = CORE + "block_pool.py", CORE + "kv_cache_manager.py", \
    CORE + "single_type_kv_cache_manager.py"

CONFORM = (
    ConformTarget(
        "vllm", "kv_cache_manager_lockstep",
        upstream=(
            Upstream(BLOCK_POOL, (), checked=(
                "BlockHashToBlockMap.get_one_block", "BlockHashToBlockMap.insert", "BlockHashToBlockMap.pop",
                "BlockPool.get_cached_block", "BlockPool.cache_full_blocks", "BlockPool.get_new_blocks",
                "BlockPool._maybe_evict_cached_block", "BlockPool.touch", "BlockPool.free_blocks",
                "BlockPool.reset_prefix_cache", "BlockPool.get_num_free_blocks", "BlockPool.take_events")),
            Upstream(MANAGER, (), checked=(
                "KVCacheManager.get_computed_blocks", "KVCacheManager.allocate_slots", "KVCacheManager.free",
                "KVCacheManager.reset_prefix_cache", "KVCacheManager.take_events")),
            Upstream(SINGLE_TYPE, (), checked=(
                "SingleTypeKVCacheManager.get_num_blocks_to_allocate",
                "SingleTypeKVCacheManager.allocate_new_computed_blocks",
                "SingleTypeKVCacheManager.allocate_new_blocks", "SingleTypeKVCacheManager.cache_blocks",
                "SingleTypeKVCacheManager.free", "FullAttentionManager.find_longest_cache_hit")),
        ),
        adapter="kvsim.conform.vllm.manager_lockstep:LOCKSTEP",
        doc="the real KVCacheManager (one full-attention group) imported from the release, in lockstep with the "
            "model: the hit and new blocks, ref counts, the free queue, block tables and the KV events (hashes "
            "mapped by first appearance) after every schedule, decode, finish, preempt and reset"),
)
