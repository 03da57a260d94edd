"""The engine code `radix-cache` is checked against (`kvsim conform sglang`): declarations only.

`RadixCache` and `PagedTokenToKVPoolAllocator` (target `radix_cache_lockstep`): SGLang's real tree and allocator,
imported from the release in a child process (`kvsim.conform.installed`), in lockstep with the model
(`kvsim.conform.sglang.radix_lockstep`) under 0.5.23's request life cycle. The declared files are not loaded in
kvsim's process (no names); `checked` names the definitions the lockstep's programs run, whose lines `--coverage`
counts (traced in the child) and whose mutants `--mutants` loads into the child.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Unreached, Upstream

MEM = "sglang/srt/mem_cache/"
RADIX, PAGED, ALLOCATION, COMMON = MEM + "radix_cache.py", MEM + "allocator/paged.py", MEM + "allocation.py", \
    MEM + "common.py"

UNREACHED: tuple[Unreached, ...] = ()
SURVIVORS: tuple[Survivor, ...] = ()

CONFORM = (
    ConformTarget(
        "sglang", "radix_cache_lockstep",
        upstream=(
            Upstream(RADIX, (), checked=(
                "RadixCache.match_prefix", "RadixCache.insert", "RadixCache._insert_cache", "RadixCache.checkpoint",
                "RadixCache.evict", "RadixCache.inc_lock_ref", "RadixCache.dec_lock_ref",
                "RadixCache.path_device_indices", "RadixCache._match_prefix_helper", "RadixCache._split_node",
                "RadixCache._insert_helper", "RadixCache._delete_leaf", "RadixCache._update_leaf_status")),
            Upstream(PAGED, (), checked=(
                "PagedTokenToKVPoolAllocator.available_size", "PagedTokenToKVPoolAllocator.merge_and_sort_free",
                "PagedTokenToKVPoolAllocator.alloc_extend", "PagedTokenToKVPoolAllocator.alloc_decode",
                "PagedTokenToKVPoolAllocator.free_segment", "PagedTokenToKVPoolAllocator.free_page_ids",
                "PagedTokenToKVPoolAllocator._release_page_ids")),
            Upstream(ALLOCATION, (), checked=("alloc_paged_token_slots_extend", "alloc_paged_token_slots_decode")),
            Upstream(COMMON, (), checked=("checkpoint_kv_cache", "release_kv_cache")),
        ),
        adapter="kvsim.conform.sglang.radix_lockstep:LOCKSTEP", unreached=UNREACHED, survivors=SURVIVORS,
        doc="the real RadixCache and paged allocator imported from the release, in lockstep with the model under "
            "0.5.23's request life cycle: the admitted prefix and new slots, the tree (keys, slots, lock counts), "
            "the sizes, the free pages in order and each request's row after every admit, decode and retract"),
)
