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

# What the lockstep's slice has no counterpart of: the cache enabled, full attention (no sliding-window key limit, no
# Mamba state, no DSV4 C128 pool, no classed page sharding), no debug mode, the CPU's torch path of the allocator, no
# streaming session, frees outside a free group, and allocations that fit (the scheduler's tests before them).
DISABLED = "the cache disabled (--disable-radix-cache): the lockstep's cache is enabled"
DEBUG = "the allocator's debug assertions (SGLANG_DEBUG_MEMORY_POOL): off, as in a server"
FITS = ("an allocation that runs short after the eviction for it: the admission test (extend + a page of free and "
        "evictable tokens) and check_decode_mem come first, as in the scheduler")
DSV4 = "DeepSeek-V4's C128 allocator (an allocator with c128_attn_allocator): the lockstep's is the paged one"
SHARDED = "classed page sharding (a page-interleave allocator): the lockstep's allocator has one class"
UNREACHED = (
    *(Unreached(f"RadixCache.{method}", "if self.disable:", DISABLED)
      for method in ("insert", "checkpoint", "evict", "inc_lock_ref", "dec_lock_ref")),
    Unreached("RadixCache.insert", "value = torch.tensor(key.token_ids",
              "an insert without values (the debug / test fallback): every insert carries the row's slots"),
    Unreached("RadixCache._insert_cache", "if key_limit is not None:",
              "a sliding-window evict floor (swa_evict_floor): full attention has none"),
    Unreached("RadixCache.dec_lock_ref", "if node.parent is None:",
              "a node of another tree: every request unlocks the node its own tree locked"),
    Unreached("RadixCache._insert_helper", "if priority is None:",
              "an insert without a priority: _insert_cache passes req.priority or 0 (the prompt's split: + 1)"),
    *(Unreached(f"PagedTokenToKVPoolAllocator.{method}", "if self.debug_mode:", DEBUG)
      for method in ("alloc_extend", "alloc_decode", "free_segment", "free_page_ids")),
    *(Unreached(f"PagedTokenToKVPoolAllocator.{method}", "if num_new_pages > len(self.free_pages):", FITS)
      for method in ("alloc_extend", "alloc_decode")),
    *(Unreached(f"PagedTokenToKVPoolAllocator.{method}", "if self.use_triton_kernels:",
                "the Triton kernels: on a CPU the platform reports no Triton and the allocator takes its torch path")
      for method in ("alloc_extend", "alloc_decode")),
    Unreached("PagedTokenToKVPoolAllocator.free_page_ids", "if page_ids.numel() == 0:",
              "no page: its one caller here, free_segment, returns on an empty segment first"),
    Unreached("PagedTokenToKVPoolAllocator.free_page_ids", "self.free_page_ids_group.append(",
              "a free inside a free group: the lockstep's (and the model's) checkpoints and releases run outside "
              "one (the scheduler's batch-result processing wraps them in one: see radix_lockstep's docstring)"),
    Unreached("alloc_paged_token_slots_extend", "if page_interleave_shard_size(allocator) > 1:", SHARDED),
    Unreached("alloc_paged_token_slots_extend", "if kv_shard_rotation_bases is not None:", SHARDED),
    *(Unreached(f"alloc_paged_token_slots_{kind}", "if is_dsv4:", DSV4) for kind in ("extend", "decode")),
    *(Unreached(f"alloc_paged_token_slots_{kind}", "if out_cache_loc is None:", FITS)
      for kind in ("extend", "decode")),
    Unreached("release_kv_cache", "if not req.kv.holds_kv:",
              "a request released before it holds a row (a Mamba cache's early state): every release here follows "
              "a prefill"),
    Unreached("release_kv_cache", "if tree_cache.claim_kv_row(req):",
              "a streaming session keeping the row: no session in the lockstep"),
)
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
