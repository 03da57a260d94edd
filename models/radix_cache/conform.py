"""The engine code `radix-cache` is checked against (`kvsim conform sglang`): declarations only.

`eagle_prepare_for_decode` (target of the same name): EAGLE's decode allocation length, loaded from the release and
run on a stand-in batch (`kvsim.conform.sglang.eagle_alloc`) against `eagle.page_aligned_decode_alloc_lens`, with the
property `kv_allocated_whole_pages` on upstream's answer; `releases` maps 0.5.15 and before to `pre_31616`.

`RadixCache`, `PagedTokenToKVPoolAllocator` and `ReqToTokenPool` (target `radix_cache_lockstep`): SGLang's real
tree, allocator and request pool, imported from the release in a child process (`kvsim.conform.installed`), in
lockstep with the model (`kvsim.conform.sglang.radix_lockstep`) under 0.5.23's request life cycle. The declared
files are not loaded in kvsim's process (no names); `checked` names the definitions the lockstep's programs run,
whose lines `--coverage` counts (traced in the child) and whose mutants `--mutants` loads into the child.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Unreached, Upstream

MEM = "sglang/srt/mem_cache/"
RADIX, PAGED, ALLOCATION, COMMON = MEM + "radix_cache.py", MEM + "allocator/paged.py", MEM + "allocation.py", \
    MEM + "common.py"
MEMORY_POOL = MEM + "memory_pool.py"

# What the lockstep's slice has no counterpart of: the cache enabled, full attention (no sliding-window key limit, no
# Mamba state, no DSV4 C128 pool, no classed page sharding), no debug mode, the CPU's torch path of the allocator, no
# streaming session, and allocations that fit (the scheduler's tests before them).
DISABLED = "the cache disabled (--disable-radix-cache): the lockstep's cache is enabled"
POOL_FITS = "the request pool short of a row: it has one per request of the configuration"
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
      for method in ("alloc_extend", "alloc_decode", "free_segment", "free_page_ids", "free_group_end")),
    *(Unreached(f"PagedTokenToKVPoolAllocator.{method}", "if num_new_pages > len(self.free_pages):", FITS)
      for method in ("alloc_extend", "alloc_decode")),
    *(Unreached(f"PagedTokenToKVPoolAllocator.{method}", "if self.use_triton_kernels:",
                "the Triton kernels: on a CPU the platform reports no Triton and the allocator takes its torch path")
      for method in ("alloc_extend", "alloc_decode")),
    Unreached("PagedTokenToKVPoolAllocator.free_page_ids", "if page_ids.numel() == 0:",
              "no page: its one caller here, free_segment, returns on an empty segment first"),
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
    *(Unreached(definition, text, POOL_FITS) for definition, text in (
        ("alloc_req_slots", "if req_pool_indices is None:"), ("ReqToTokenPool.alloc", "if select_index is None:"))),
    Unreached("ReqToTokenPool.alloc_rows", "if need_size == 0:",
              "no new row asked for: every prefill here is a batch of one request without a row"),
    Unreached("ReqToTokenPool.alloc_rows", "if self._on_alloc_rows is not None:",
              "a row-allocation hook (registered by a decode-side pool): none here"),
    Unreached("ReqToTokenPool.free_rows", "if self._aux_cache is not None:",
              "an auxiliary per-row cache (attach_aux_cache): none here"),
)
# Mutants the lockstep cannot kill because they change nothing in its slice (equivalent there), each with the reason;
# matched by definition, operator, original and replacement (0.5.23's).
PRIORITY = ("a node's priority and hit count: read only by the priority and LFU eviction strategies (the lockstep's "
            "is LRU)")
DELTA = "the delta a lock answers: the request path ignores it (the sizes it moves are compared)"
SYMMETRIC = "max's two arguments swapped"
ALIGNED = "a page-aligned key (page size 2 or 4) is empty or two tokens or more: never one token"
VALUE_CUT = "the values are already as long as the key (insert cuts them to the key)"
NOT_DSV4 = "the DSV4 test: the paged allocator has no c128_attn_allocator, and no request pool indices are passed"
CPU = "on a CPU the device tensors and their CPU copies hold the same values"
HASH = "the node's KV-event hashes: never computed here (None before and after a split)"
PAGE_START = "the segment's every page_size-th slot is a page's first: floor and ceiling agree"
NO_OVERALLOCATION = "no speculative overallocation: owned_kv_len equals kv_allocated_len"
NO_MAMBA = "the assertion holds either way: the cache has no Mamba state and every checkpointed release is finished"
SUPPORTS = "skip_radix_cache_insert is never set (no input embeddings, no sessions)"
SWA = "the sliding-window evict floor: 0 for full attention, so no key limit either way"
DEMAND = "the paged allocator's extend demand is the conservative count alone (classed allocators read the lengths)"
METRICS = "the eviction metrics' arguments: not observed"
NO_HOST = "no node is evicted to a host tier (its value None): the lockstep has no hierarchical cache"
EMPTY_KEY = "an empty key matches nothing either way (the helper walks no child; the root is never evicted)"
PROMPT_SPLIT = ("the prompt's re-insert when its key is empty or the whole key: an empty key inserts nothing, the whole "
                "key was just inserted (both only read the clock, and the checkpoint's match right after touches the "
                "same path again: the LRU order is the same)")
PROMPT_VALUES = ("the prompt's re-insert only splits: its key is a prefix of the key just inserted, so the insert "
                 "creates no node and never reads the values")
EXACT_COUNT = ("the exact page count taken (the second bound test) when the bound equals the free pages: the extend "
               "fits (the admission test came first), so the same pages are taken")
NOT_HYBRID = ("ensure_mamba_capacity's arguments swapped: it returns at once when its first is no "
              "HybridReqToTokenPool, which neither the pool nor the request list is")
NOT_REUSED = "the reused rows' assertion: no request holds a row at its prefill here (no chunked prefill), none is read"
ONE_REQUEST = "the offset past a batch's last request: every batch here is one request, the offset is not read again"
GENERATION = ("a row's generation (bumped at every allocation): read only by readers that detect a row's reuse, "
              "none here")
TREE, PAGED_ALLOCATOR = "RadixCache.", "PagedTokenToKVPoolAllocator."
SURVIVORS = (
    Survivor(TREE + "match_prefix", "boolean", "self.disable or len(key) == 0", DISABLED,
             replacement="((len(key) == 0))"),
    Survivor(TREE + "match_prefix", "boolean", "self.disable or len(key) == 0", EMPTY_KEY,
             replacement="((self.disable))"),
    Survivor(TREE + "match_prefix", "constant", "0", ALIGNED + "; a shorter one matches nothing either way",
             line="if self.disable or len(key) == 0:"),
    Survivor(TREE + "insert", "bound", "len(key)", VALUE_CUT, replacement="(len(key)) + 1"),
    Survivor(TREE + "insert", "arguments", "priority, inserted_len", PRIORITY),
    Survivor(TREE + "_insert_cache", "bound", "key_len", VALUE_CUT, replacement="(key_len) + 1"),
    Survivor(TREE + "_insert_cache", "boolean", "req.priority or 0", PRIORITY),
    Survivor(TREE + "_insert_cache", "constant", "0", PRIORITY, line="priority = req.priority or 0"),
    Survivor(TREE + "_insert_cache", "arguments", "req.kv.cache_inserted_len, key_len", SYMMETRIC),
    Survivor(TREE + "_insert_cache", "arguments", "priority + 1, torch.iinfo(torch.int64).max", PRIORITY),
    Survivor(TREE + "_insert_cache", "constant", "0", ALIGNED + "; an empty one inserts nothing either way",
             replacement="1", line="if 0 < len(prompt_key) < key_len:"),
    Survivor(TREE + "_insert_cache", "comparison", "<", PROMPT_SPLIT, replacement="<=",
             line="if 0 < len(prompt_key) < key_len:"),
    *(Survivor(TREE + "_insert_cache", "bound", "len(prompt_key)", PROMPT_VALUES, replacement=f"(len(prompt_key)) {d}",
               line="value=values[: len(prompt_key)],") for d in ("+ 1", "- 1")),
    Survivor(TREE + "_insert_cache", "constant", "1", PRIORITY, line="priority=min(priority + 1,"),
    Survivor(TREE + "checkpoint", "arguments", "swa_evict_floor, self.page_size", SWA),
    Survivor(TREE + "checkpoint", "constant", "0", SWA, line="if swa_evict_floor > 0 else None"),
    Survivor(TREE + "evict", "arguments", "num_evicted, start_time", METRICS),
    Survivor(TREE + "inc_lock_ref", "constant", "0", DELTA, line="delta = 0"),
    Survivor(TREE + "inc_lock_ref", "assignment", "-=", DELTA, line="delta -= len(node.key)"),
    Survivor(TREE + "dec_lock_ref", "constant", "0", DELTA, line="delta = 0"),
    Survivor(TREE + "dec_lock_ref", "assignment", "+=", DELTA, line="delta += len(node.key)"),
    Survivor(TREE + "_match_prefix_helper", "constant", "0", ALIGNED,
             line="while len(key) > 0 and child_key in node.children.keys():"),
    Survivor(TREE + "_split_node", "arguments", "split_len, self.page_size", HASH),
    Survivor(TREE + "_insert_helper", "arguments", "node.priority, priority", PRIORITY),
    Survivor(TREE + "_insert_helper", "arguments", "new_node.priority, priority", PRIORITY),
    Survivor(TREE + "_insert_helper", "constant", "0", ALIGNED,
             line="while len(key) > 0 and child_key in node.children.keys():"),
    Survivor(TREE + "_insert_helper", "comparison", ">", PRIORITY, line="if total_prefix_length > inserted_len:"),
    Survivor(TREE + "_insert_helper", "comparison", ">", PRIORITY,
             line="if total_prefix_length + len(key) > inserted_len:"),
    Survivor(TREE + "_update_leaf_status", "boolean", "node.evicted or node.lock_ref > 0", NO_HOST,
             replacement="((node.lock_ref > 0))"),
    Survivor(PAGED_ALLOCATOR + "free_segment", "division", "reps // ps", PAGE_START),
    # the line's text is also the merge test's, above it, whose ">=" the directed program
    # staged_pages_wait_while_the_bound_is_met kills
    Survivor(PAGED_ALLOCATOR + "alloc_extend", "comparison", ">", EXACT_COUNT, replacement=">=",
             line="if max_new_pages > len(self.free_pages):"),
    Survivor("alloc_paged_token_slots_extend", "arguments", "prefix_lens_cpu,\n        seq_lens_cpu", DEMAND),
    *(Survivor(f"alloc_paged_token_slots_{kind}", op, original, NOT_DSV4, replacement=replacement)
      for kind in ("extend", "decode") for op, original, replacement in (
          ("boolean", 'req_pool_indices is not None and hasattr(allocator, "c128_attn_allocator")',
           '((hasattr(allocator, "c128_attn_allocator")))'),
          ("boolean", 'req_pool_indices is not None and hasattr(allocator, "c128_attn_allocator")',
           "((req_pool_indices is not None))"),
          ("comparison", "is not", "is"),
          ("arguments", 'allocator, "c128_attn_allocator"', '"c128_attn_allocator", allocator'))),
    Survivor("alloc_paged_token_slots_extend", "arguments", "prefix_lens,\n        prefix_lens_cpu", CPU),
    Survivor("alloc_paged_token_slots_extend", "arguments", "seq_lens,\n        seq_lens_cpu", CPU),
    Survivor("alloc_paged_token_slots_decode", "arguments", "seq_lens, seq_lens_cpu", CPU),
    Survivor("release_kv_cache", "boolean", "checkpoint and not req.skip_radix_cache_insert", SUPPORTS,
             replacement="((checkpoint))"),
    Survivor("release_kv_cache", "boolean", "req.finished() or not tree_cache.supports_mamba()", NO_MAMBA),
    Survivor("release_kv_cache", "arguments", "owned_kv_len, req.kv.kv_allocated_len", NO_OVERALLOCATION),
    *(Survivor("alloc_req_slots", "arguments", original, NOT_HYBRID)
      for original in ("req_to_token_pool, reqs", "reqs, tree_cache")),
    *(Survivor("ReqToTokenPool.alloc", op, original, NOT_REUSED, line="assert all(reqs[i].kv.kv_allocated_len > 0")
      for op, original in (("comparison", ">"), ("constant", "0"))),
    *(Survivor("ReqToTokenPool.alloc", op, original, ONE_REQUEST, line="offset += 1")
      for op, original in (("assignment", "+="), ("constant", "1"))),
    *(Survivor("ReqToTokenPool.alloc_rows", op, original, GENERATION, line="self.req_generation[select_index] += 1")
      for op, original in (("assignment", "+="), ("constant", "1"))),
)

# EAGLE's decode allocation length: #31616 rounds nxt up to the page boundary from 0.5.16
PAGE_ALIGNED_NXT = ((None, "pre_31616"), ("0.5.16", "fixed"))
EAGLE_UTILS = "sglang/srt/speculative/eagle_utils.py"
EAGLE = "eagle_prepare_for_decode"
EAGLE_SURVIVORS = (
    Survivor(EAGLE, "constant", "0", "the per-request length lists' initial values: every entry is written in the loop",
             replacement="1", line="_kv_lens = [0] * bs"),
    Survivor(EAGLE, "arguments", "cur,\n            (r.kv_committed_len + double_alloc + page_size - 1)\n"
             "            // page_size\n            * page_size", "max's two arguments swapped: the same maximum"),
    Survivor(EAGLE, "constant", "1", "an unset topk read as 0 instead of 1 (`or 0`): neither is above 1, so the "
                                     "row-width assertion is skipped either way (the line's other two 1s are killed)",
             replacement="0", line="speculative_eagle_topk or 1) > 1"),
)

CONFORM = (
    ConformTarget(
        "sglang", EAGLE,
        upstream=(Upstream(EAGLE_UTILS, (EAGLE,)),),
        adapter="kvsim.conform.sglang.eagle_alloc:ALLOC_LENS", releases=PAGE_ALIGNED_NXT, survivors=EAGLE_SURVIVORS,
        doc="EAGLE's decode allocation per request (cur, nxt, the tokens needed and asked for, kv_allocated_len "
            "after), and kv_allocated_whole_pages on upstream's answer (#31616: fails before 0.5.16)"),
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
                "PagedTokenToKVPoolAllocator._release_page_ids", "PagedTokenToKVPoolAllocator.free_group_begin",
                "PagedTokenToKVPoolAllocator.free_group_end")),
            Upstream(ALLOCATION, (), checked=("alloc_paged_token_slots_extend", "alloc_paged_token_slots_decode",
                                              "alloc_req_slots")),
            Upstream(MEMORY_POOL, (), checked=("ReqToTokenPool.alloc", "ReqToTokenPool.alloc_rows",
                                               "ReqToTokenPool.free_rows", "ReqToTokenPool.free")),
            Upstream(COMMON, (), checked=("checkpoint_kv_cache", "release_kv_cache")),
        ),
        adapter="kvsim.conform.sglang.radix_lockstep:LOCKSTEP", unreached=UNREACHED, survivors=SURVIVORS,
        doc="the real RadixCache and paged allocator imported from the release, in lockstep with the model under "
            "0.5.23's request life cycle: the admitted prefix and new slots, the tree (keys, slots, lock counts), "
            "the sizes, the free pages in order and each request's row after every admit, decode and retract"),
)

# radix-cache-swa: the unified cache (Full + SWA) of the releases across #28161, in lockstep with the model. The
# checked definitions are 0.5.23's (the TreeCore package unified_cache/, absent before 0.5.20: optional files):
# the locks and their early release, the split, the tombstone recovery, the match validator and the SWA allocator.
UNIFIED, CORE, COMPONENTS = MEM + "unified_radix_cache.py", MEM + "unified_cache/unified_tree_core.py", \
    MEM + "unified_cache/components/"
# What the lockstep's slice (Full + SWA at page size 1, no HiCache, LRU eviction, the scheduler's own calls) never runs
HICACHE = "HiCache (host values, host locks, write-through and buffer backups): the lockstep's cache has no host tier"
HOST_LOCK = "a host lock (lock_host=True): only HiCache's load-back and backups take one"
NO_SKIP = "a receipt that skipped a component: the scheduler's lock takes every component (no skip_lock_components)"
SWA_UPSTREAM = (
    Upstream(UNIFIED, (), checked=("UnifiedRadixCache.inc_lock_ref", "UnifiedRadixCache.dec_lock_ref",
                                   "UnifiedRadixCache.release_swa")),
    Upstream(CORE, (), checked=("UnifiedTreeCore.inc_lock_ref", "UnifiedTreeCore.dec_lock_ref",
                                "UnifiedTreeCore._release_components", "UnifiedTreeCore.dec_swa_lock_only",
                                "UnifiedTreeCore._split_node"), optional=True),
    Upstream(COMPONENTS + "swa.py", (), checked=(
        "SWAComponent.acquire_component_lock", "SWAComponent.release_component_lock",
        "SWAComponent.release_window_lock", "SWAComponent.redistribute_on_node_split",
        "SWAComponent._recover_from_incoming", "SWAComponent.update_component_on_insert_overlap",
        "SWAComponent.create_match_validator"), optional=True),
    Upstream(COMPONENTS + "full.py", (), checked=("FullComponent.acquire_component_lock",
                                                  "FullComponent.release_component_lock"), optional=True),
    Upstream(MEM + "allocator/swa.py", (), checked=(
        "SWATokenToKVPoolAllocator.alloc", "SWATokenToKVPoolAllocator.set_full_to_swa_mapping")),
    # the Mamba component, run by the lockstep's Mamba configurations
    Upstream(COMPONENTS + "mamba.py", (), checked=(
        "MambaComponent.create_match_validator", "MambaComponent.commit_insert_component_data",
        "MambaComponent.redistribute_on_node_split", "MambaComponent.evict_component",
        "MambaComponent._evict_device_next_node", "MambaComponent.acquire_component_lock",
        "MambaComponent.release_component_lock"), optional=True),
    Upstream(MEM + "allocator/mamba.py", (), checked=("MambaSlotAllocator._do_alloc", "MambaSlotAllocator.free")),
)
SWA_UNREACHED = (
    *(Unreached(f"UnifiedRadixCache.{m}", "if self.disable", DISABLED)
      for m in ("inc_lock_ref", "dec_lock_ref", "release_swa")),
    Unreached("UnifiedTreeCore.inc_lock_ref", "if component.component_type in skipped:", NO_SKIP),
    Unreached("UnifiedTreeCore._release_components", "if ct in params.skipped_lock_components:", NO_SKIP),
    Unreached("UnifiedTreeCore.dec_swa_lock_only", "if node is self.root_node:",
              "an early release at the root: release_swa_prefix_lock releases only a lock with an SWA boundary uuid, "
              "which a lock reaching the root does not have"),
    Unreached("UnifiedTreeCore.dec_swa_lock_only", "if swa_component is None:",
              "a cache without an SWA component: the lockstep's has one"),
    Unreached("UnifiedTreeCore.dec_swa_lock_only", "if comp.component_type in params.skipped_lock_components:",
              NO_SKIP),
    Unreached("UnifiedTreeCore._split_node", "if self.tlru_bookkeeping:",
              "the T-LRU eviction policy's bookkeeping: the lockstep's policy is LRU"),
    *(Unreached(definition, text, HICACHE) for definition, text in (
        ("UnifiedTreeCore._split_node", "if ack_id is not None:"),
        ("UnifiedTreeCore._split_node", "if ack_id is not None or self.is_host_memory_buffer_only:"),
        ("SWAComponent.create_match_validator", "if not gates_prefix_match and"),
        ("SWAComponent.redistribute_on_node_split", "if child_swa_host_value is not None:"))),
    Unreached("SWAComponent.update_component_on_insert_overlap", "if self._independent:",
              "an independent SWA window (a draft model's own window): the lockstep's cache has none"),
    Unreached("SWAComponent._recover_from_incoming", "if full_cd.lock_ref > 0:",
              "a tombstone recovered while another running request locks its Full value: exploring radix-cache-swa "
              "exhaustively in each of the lockstep's four configurations reaches no such insert (the model's "
              "counterpart, flag recovers_under_full_lock, is never read true)"),
    *(Unreached(f"SWAComponent.{m}", "if lock_host:", HOST_LOCK)
      for m in ("acquire_component_lock", "release_component_lock")),
    Unreached("SWAComponent.release_window_lock", "if self.tree_core._is_device_leaf(cur):",
              "a device leaf after the early release: the releasing request still holds its Full lock on every node "
              "of the window, so none is a device leaf"),
    *(Unreached(f"FullComponent.{m}", "if lock_host:", HOST_LOCK)
      for m in ("acquire_component_lock", "release_component_lock")),
    Unreached("FullComponent.acquire_component_lock",
              "while cur is not root and cur.component_data[ct].value is None:",
              "a lock on a device-evicted segment (a host-only node): without HiCache every node holds a device value"),
    *(Unreached("SWATokenToKVPoolAllocator.alloc", f"if need_size > self.{pool}_attn_allocator.available_size():",
                "an allocation that does not fit: the scheduler evicts each pool's shortfall first and defers a "
                "request that does not fit") for pool in ("full", "swa")),
    Unreached("SWATokenToKVPoolAllocator.set_full_to_swa_mapping", "if full_indices.numel() == 0:",
              "an empty allocation: the scheduler allocates at least one slot (an extend past the match, a decode)"),
    Unreached("MambaComponent.create_match_validator", "return lambda node: (", HICACHE + "; the match is device-only"),
    *(Unreached("MambaComponent.evict_component", text, HICACHE) for text in (
        "if EvictLayer.HOST in target and cd.host_value is not None:", "if not host_lru.in_list(node):")),
    Unreached("MambaComponent._evict_device_next_node", "return InternalStateBackup(", HICACHE),
    Unreached("MambaComponent._evict_device_next_node", "if enabled:",
              "a session radix cache (enable_session_radix_cache): the lockstep has no sessions"),
    *(Unreached(f"MambaComponent.{m}", "if lock_host:", HOST_LOCK)
      for m in ("acquire_component_lock", "release_component_lock")),
    Unreached("MambaSlotAllocator.free", "if free_index.numel() == 0:",
              "an empty free: every Mamba free here is one state slot"),
)
# Mutants of 0.5.23's checked definitions the lockstep does not kill, each with the reason (`--mutants 0` on 0.5.23)
CORE_, SWA_, FULL_ = "UnifiedTreeCore.", "SWAComponent.", "FullComponent."
TOMBSTONE_LEN = ("a tombstone's reclaimable length is 0 (value_len of no value), so the ledger moves nothing for it "
                 "either way")
ASSERTED = "an assertion weakened: it holds on every path the lockstep runs (no lock count goes below 0)"
LEAF_SETS = ("the evictable-leaf refresh at an SWA count's 0: the node keeps its Full lock there (the early "
             "release) or the Full walk that follows refreshes every node it unlocks (a release)")
UUID_SET = ("every SWA lock the lockstep releases has a boundary uuid: its path holds a window (the matched prefix "
            "is one key short of a prompt at least a window long) or it is the root's, released before the walk")
FULL_LEAF = ("the evictable-leaf refresh at a Full count's 0, not reached: dec_lock_ref refreshes the anchor itself "
             "after the walks, and no program left another node of a released path childless")
NO_ADOPTED = "the adopted ranges: recorded only for an insert that tracks them (track_adopted_ranges), never here"
SWA_SURVIVORS = (
    Survivor(CORE_ + "_release_components", "comparison", "<",
             "SWA's own priority: SWA is skipped by name already, Full's priority is above and Mamba's below either "
             "way", replacement="<="),
    Survivor(CORE_ + "dec_swa_lock_only", "arguments", "result.device_frees,\n            result.host_frees",
             "the early release frees nothing here: it never reaches a device leaf (its unreached declaration)"),
    *(Survivor(CORE_ + "_split_node", "arguments", "split_len, self.page_size", HASH, line=text)
      for text in ("new_node.hash_value, child.hash_value", "new_node.event_hash_value, child.event_hash_value")),
    *(Survivor(SWA_ + "create_match_validator", op, original, NO_HOST + "; the match is device-only",
               replacement=replacement) for op, original, replacement in (
        ("boolean", "cd.value is None and (match_device_only or cd.host_value is None)", "((cd.value is None))"),
        ("boolean", "match_device_only or cd.host_value is None", "((cd.host_value is None))"),
        ("boolean", "match_device_only or cd.host_value is None", "((match_device_only))"))),
    *(Survivor(SWA_ + m, "arguments", original, NO_ADOPTED) for m, original in (
        ("_recover_from_incoming", "BASE_COMPONENT_TYPE, start"), ("_recover_from_incoming", "start, end"),
        ("update_component_on_insert_overlap", "self.component_type, live_start"),
        ("update_component_on_insert_overlap", "live_start, end"))),
    Survivor(SWA_ + "update_component_on_insert_overlap", "arguments", "consumed_from, live_start - total_prefix_len",
             SYMMETRIC),
    Survivor(SWA_ + "update_component_on_insert_overlap", "comparison", ">=",
             "a node ending exactly at the request's matched prefix: it holds the request's SWA-locked window, never "
             "a tombstone, so there is nothing to recover either way", line="if params.prev_prefix_len >="),
    Survivor(SWA_ + "update_component_on_insert_overlap", "bound", "end - total_prefix_len",
             "the incoming slice ends at the value slice's end: one past it is the same slice",
             replacement="(end - total_prefix_len) + 1"),
    Survivor(SWA_ + "redistribute_on_node_split", "arguments", '"host_uuid", None', NO_HOST),
    *(Survivor(SWA_ + m, "boolean", original, TOMBSTONE_LEN, replacement=f"(({original.split(' and ')[0]}))")
      for m, original in (("acquire_component_lock", "ref == 0 and value is not None"),
                          ("release_component_lock", "ref == 1 and value is not None"),
                          ("release_window_lock", "cd.lock_ref == 0 and cd.value is not None"))),
    *(Survivor(d, "comparison", ">", ASSERTED, replacement=">=", line=line) for d, line in (
        (SWA_ + "release_component_lock", "assert ref > 0"), (SWA_ + "release_window_lock", "assert cd.lock_ref > 0"),
        (FULL_ + "release_component_lock", "assert cd.lock_ref > 0"))),
    Survivor(SWA_ + "release_component_lock", "boolean", "cur != root and dec_swa", UUID_SET,
             replacement="((dec_swa))"),
    *(Survivor(SWA_ + m, "boolean", original, UUID_SET, replacement=f"(({original.split(' and ')[1]}))")
      for m, original in (
          ("release_component_lock", "swa_uuid_for_lock and comp.metadata.get(uuid_key) == swa_uuid_for_lock"),
          ("release_window_lock", 'swa_uuid_for_lock and cd.metadata.get("uuid") == swa_uuid_for_lock'))),
    *(Survivor(SWA_ + "release_component_lock", op, original, LEAF_SETS, replacement=r, line="if ref == 1:")
      for op, original, r in (("comparison", "==", "!="), ("constant", "1", "0"), ("constant", "1", "2"))),
    *(Survivor(SWA_ + "release_window_lock", op, original, LEAF_SETS, replacement=r,
               line="if cd.lock_ref == 0:")
      for op, original, r in (("comparison", "==", "!="), ("constant", "0", "1"))),
    Survivor(FULL_ + "acquire_component_lock", "constant", "0", DELTA, line="delta = 0"),
    Survivor(FULL_ + "acquire_component_lock", "assignment", "+=", DELTA, line="delta += key_len"),
    Survivor(FULL_ + "release_component_lock", "boolean", "cd.lock_ref == 1 and cd.value is not None",
             "every node holds a Full device value without HiCache", replacement="((cd.lock_ref == 1))"),
    *(Survivor(FULL_ + "release_component_lock", op, original, FULL_LEAF, replacement=r,
               line="if cd.lock_ref == 0:")
      for op, original, r in (("comparison", "==", "!="), ("constant", "0", "1"))),
)
MAMBA_ = "MambaComponent."
NO_SESSION = "no session radix cache: the lockstep has no streaming sessions (enable_session_radix_cache off)"
STATE_LOCKED = ("every Mamba lock is taken on a node with a state: a match, and so a request's lock, ends only at "
                "a node whose Mamba validator accepts it (or the root, which no component locks)")
PATH_CAP = ("the per-path state cap is off (mamba_max_states_per_path -1, the server's default): "
            "_emit_excess_path_states_eviction returns before it reads its arguments")
SWA_SURVIVORS += (
    *(Survivor(MAMBA_ + "commit_insert_component_data", "arguments", "node, cache_actions", PATH_CAP, line=line)
      for line in ("self._emit_excess_path_states_eviction(node, cache_actions)",)),
    Survivor(MAMBA_ + "redistribute_on_node_split", "constant", "0", NO_SESSION, line="session_ref = 0"),
    Survivor(MAMBA_ + "redistribute_on_node_split", "constant", "0", NO_HOST, line="host_lock_ref = 0"),
    Survivor(MAMBA_ + "evict_component", "constant", "0", NO_HOST, line="host_freed = 0"),
    Survivor(MAMBA_ + "evict_component", "boolean", "EvictLayer.DEVICE in target and cd.value is not None",
             "every eviction here targets the device layer", replacement="((cd.value is not None))"),
    *(Survivor(MAMBA_ + "evict_component", op, original, NO_HOST + "; no node has a Mamba host value",
               line="target is EvictLayer.DEVICE") for op, original in (
        ("boolean",
         "target is EvictLayer.DEVICE\n            and cd.value is None\n            and cd.host_value is not None"),
        ("comparison", "is"), ("comparison", "is not"))),
    *(Survivor(MAMBA_ + "evict_component", "comparison", original, NO_HOST + "; no node has a Mamba host value",
               line=line) for original, line in (("is", "and cd.value is None"),
                                                 ("is not", "and cd.host_value is not None"))),
    *(Survivor(MAMBA_ + "_evict_device_next_node", "boolean", original, HICACHE, line="self.tree_core.enable_hicache")
      for original in ("self.tree_core.enable_hicache\n            and self.tree_core.is_write_back\n            and "
                       "cd.host_value is None\n            and not x.backuped\n            and "
                       "x.component_data[BASE_COMPONENT_TYPE].value is not None",)),
    *(Survivor(MAMBA_ + "_evict_device_next_node", "comparison", original, HICACHE, line=line)
      for original, line in (("is", "cd.host_value is None"), ("is not", "x.component_data[BASE_COMPONENT_TYPE]"))),
    Survivor(MAMBA_ + "_evict_device_next_node", "boolean", "not enabled or self._can_evict_leaf_atomically(x)",
             NO_SESSION),
    Survivor(MAMBA_ + "_evict_device_next_node", "boolean",
             "x in self.tree_core.evictable_device_leaves and (\n            not enabled or "
             "self._can_evict_leaf_atomically(x)\n        )", NO_SESSION,
             replacement="((x in self.tree_core.evictable_device_leaves)\n\n)"),
    *(Survivor(MAMBA_ + "release_component_lock", op, original,
               "the evictable-leaf refresh at a Mamba count's 0: dec_lock_ref refreshes the anchor after every "
               "component's release, and the early release leaves the node Full-locked (no leaf either way)",
               replacement=r, line="if cd.lock_ref == 0:") for op, original, r in (("comparison", "==", "!="),
                                                                            ("constant", "0", "1"))),
    Survivor(MAMBA_ + "acquire_component_lock", "boolean", "cd.lock_ref == 0 and value is not None", STATE_LOCKED,
             replacement="((cd.lock_ref == 0))"),
    Survivor(MAMBA_ + "release_component_lock", "boolean", "cd.lock_ref == 1 and value is not None", STATE_LOCKED,
             replacement="((cd.lock_ref == 1))"),
    Survivor(MAMBA_ + "release_component_lock", "comparison", ">", ASSERTED, replacement=">=",
             line="assert cd.lock_ref > 0"),
)
# One survivor stays undeclared: `cd.host_value is None` -> `is not` on the validator's tombstone test is equivalent
# (no host values, device-only matches), but a declaration cannot tell it from `cd.value is None` -> `is not` on the
# same line, which is killed.
SWA_CONFORM = (
    ConformTarget(
        "sglang", "unified_swa_lockstep", upstream=SWA_UPSTREAM, unreached=SWA_UNREACHED, survivors=SWA_SURVIVORS,
        adapter="kvsim.conform.sglang.unified_swa_lockstep:LOCKSTEP",
        releases=((None, "pre_28161"), ("0.5.14", "pre_locked_full_recovery"), ("0.5.15", "fixed"),
                  ("0.5.20", "tree_core")),
        doc="the real UnifiedRadixCache (Full and SWA components) and SWA allocator imported from the release, in "
            "lockstep with radix-cache-swa (pre_28161 on 0.5.13, fixed from 0.5.14): each call a step makes and its "
            "answer, then the tree (slots, Full and SWA lock counts, tombstones) and the sizes after every admit, "
            "decode, retract and finish"),
)
