"""The engines' code `kv-offload` is checked against (`kvsim conform vllm`): declarations only.

Each target names the upstream files and definitions it loads and the adapter that drives them (in
`kvsim.conform.vllm`, imported only when the target runs). Every release follows the model's `fixed` variant
here: the worker mapping did not change across the releases checked, and the manager targets skip the releases
of another shape (said in their notes).
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Unreached, Upstream

GPU_WORKER = "vllm/v1/kv_offload/cpu/gpu_worker.py"
OFFLOAD_BASE = "vllm/v1/kv_offload/base.py"
SWAP_TRITON = "vllm/v1/kv_offload/cpu/swap_blocks_triton.py"
MANAGER = "vllm/v1/kv_offload/cpu/manager.py"
LRU = "vllm/v1/kv_offload/cpu/policies/lru.py"
ARC = "vllm/v1/kv_offload/cpu/policies/arc.py"
HANDLER = "SingleDirectionOffloadingHandler"
WORKER = (Upstream(OFFLOAD_BASE, ("GPULoadStoreSpec",), checked=()),)
MANAGER_FILES = (Upstream(LRU, ("LRUCachePolicy",)), Upstream(ARC, ("ARCCachePolicy",)),
                 Upstream(OFFLOAD_BASE, ("ReqContext", "make_offload_key"), checked=()),
                 Upstream(MANAGER, ("CPUOffloadingManager",)))
MANAGER_UNREACHED = (
    Unreached("LRUCachePolicy._update_heap", "if len(updated_evictable) >= max(64,",
              "a heap rebuilt for 64 or more updated keys: the lockstep has 6 keys"),
    Unreached("LRUCachePolicy.insert", "if chunk.ref_cnt == 0:",
              "a chunk inserted already evictable: the manager inserts chunks write-pending (ref_cnt -1)"),
    Unreached("CPUOffloadingManager.config_info", "return [self._config_info]",
              "config_info: connector metadata the model has no counterpart of"),
)

CANONICAL = ("the canonical CPU layout only (canonical_layout=True): the target compares the direct layout (the "
             "model has no certified mappings for the canonical one)")
TRANSFER_UNREACHED = (
    Unreached(f"{HANDLER}.__init__", "assert (", "the canonical layout's CPU page check: " + CANONICAL),
    Unreached(f"{HANDLER}._estimate_max_copy_ops", "num_copy_ops += group_size * sum(",
              "the canonical layout's descriptor count: " + CANONICAL),
)
TRANSFER_SURVIVORS = (
    Survivor("compute_sub_block_ptrs", "comparison", "<", "assert skip_count < blocks_per_chunk made <=: every "
                                                          "caller passes block_idx % blocks_per_chunk"),
    Survivor("compute_sub_block_ptrs", "constant", "1", "the 1:1 fast path's test made == 0: the general path "
                                                        "computes the same pointers at one sub-block per block "
                                                        "(sub-offset 0, skip 0)"),
    Survivor("compute_sub_block_ptrs", "bound", "num_sub_blocks",
             "the 1:1 path's slice one longer: there the caller's block ids are num_sub_blocks long "
             "(cdiv(group_size + 0, 1))"),
    Survivor("compute_sub_block_ptrs", "division", "tensor.shape[1] // blocks_per_chunk",
             "ceiling division of a page the assertion before it makes a multiple of blocks_per_chunk"),
    Survivor(f"{HANDLER}.__init__", "arguments", "layer_refs_per_group, len(gpu_tensors)", CANONICAL),
    Survivor(f"{HANDLER}.__init__", "arguments", "ref, gpu_to_cpu", CANONICAL),
    Survivor(f"{HANDLER}.__init__", "constant", "0", "the canonical fill's scratch size: " + CANONICAL),
    Survivor(f"{HANDLER}._fill_direct_ops", "bound", "end_idx",
             "one size written past a data reference's descriptors: the next reference or group writes its own "
             "there, or it lies past the last descriptor (the view ends there)"),
    Survivor(f"{HANDLER}.transfer_async", "comparison", "<",
             "a pooled descriptor buffer of exactly the size needed replaced by a new one of that size"),
    Survivor(f"{HANDLER}.transfer_async", "bound", "num_copy_ops",
             "a descriptor view one longer: the views are cut to op_idx before the swap"),
    *(Survivor(f"{HANDLER}.transfer_async", "bound", end,
               "one block id more handed to compute_sub_block_ptrs: it fills only its output's sub-blocks")
      for end in ("src_end_offset", "dst_end_offset")),
    Survivor(f"{HANDLER}.transfer_async", "bound", "op_idx",
             "the views cut one longer: the direct layout's estimate is exact (op_idx == num_copy_ops) and the views "
             "are num_copy_ops long"),
)
LRU_CLASS, ARC_CLASS, MANAGER_CLASS = "LRUCachePolicy", "ARCCachePolicy", "CPUOffloadingManager"
STATE_TEST = ("state is None\n            or state.owner is not self\n"
              "            or state.cache_generation != self._cache_generation")
ONE_MANAGER = ("a request context's state left by another manager or policy: each side of the lockstep has its own "
               "manager and its own contexts")
HEAP_REBUILD = ("the lazy heap's rebuild threshold (max(64, 2 x evictable keys)): a rebuild keeps every current entry, "
                "so the eviction order is the same; only the heap's size differs")
MAX_MIN_SWAPPED = "max's or min's two arguments swapped"
T2_EXHAUSTED = ("ARC evict's virtual T1 size after a T1 fallback (the pick under `if candidate is None:` that follows "
                "T2's): T2's scan came back empty and its iterator is spent, so every later pick of the call, whatever "
                "that size makes it try first, falls back to T1's iterator alike")
MANAGER_SURVIVORS = (
    Survivor(LRU_CLASS, "constant", "0", "a counter started at 1, or a rank's second element 1 for keys without a "
                                         "position: ranks differ in their first elements and are only compared with "
                                         "each other; cache generations only with their own copies"),
    Survivor(LRU_CLASS, "constant", "1", "the shared rank counter, or the policy's cache generation on clear, "
                                         "advanced by 2: the ranks keep their order, and cache generations are only "
                                         "compared for equality"),
    Survivor(LRU_CLASS, "boolean", STATE_TEST, ONE_MANAGER,
             replacement="((state is None) or (state.cache_generation != self._cache_generation)\n\n)"),
    Survivor(LRU_CLASS, "comparison", ">=", "on_request_access's `self._ranks[key] >= rank` made `>`: at an equal rank "
                                            "the key is given the rank it has (and an evictable one a second heap "
                                            "entry of it, which eviction selects once)",
             line="if self._ranks[key] >= rank:"),
    Survivor(LRU_CLASS, "comparison", "<", HEAP_REBUILD),
    Survivor(LRU_CLASS, "constant", "64", HEAP_REBUILD),
    Survivor(LRU_CLASS, "constant", "2", HEAP_REBUILD),
    Survivor(LRU_CLASS, "arguments", "64, 2 * len(self._evictable)", HEAP_REBUILD),
    *(Survivor(ARC_CLASS, "arguments", args, MAX_MIN_SWAPPED) for args in (
        "1, len(self.b2) / len(self.b1)", "1, len(self.b1) / len(self.b2)", "self.target_t1_size - delta, 0")),
    *(Survivor(ARC_CLASS, operator, original, T2_EXHAUSTED, replacement=replacement, line="if candidate is None:")
      for operator, original, replacement in (("assignment", "-=", "="), ("constant", "1", "0"),
                                              ("constant", "1", "2"))),
    Survivor(MANAGER_CLASS, "boolean", STATE_TEST, ONE_MANAGER),
    Survivor(MANAGER_CLASS, "boolean", STATE_TEST + "\n            or state.finished",
             ONE_MANAGER + "; or a request finished twice: the scheduler finishes a request once (the lockstep "
                           "replaces a finished request by a new one)"),
    Survivor(MANAGER_CLASS, "comparison", ">", "complete_load's assertion ref_cnt > 0 made >= 0 (the scheduler "
                                               "completes only loads it prepared, so the lockstep completes pinned "
                                               "keys only), or an eviction of 0 chunks asked for (both policies' "
                                               "evict(0) returns none)"),
    Survivor(MANAGER_CLASS, "constant", "0", "an untracked key's count 0 made 1 (the tracker is on only for "
                                             "store_threshold >= 2, above both), or the cache generation started at "
                                             "1 (only compared with its own copies)"),
    *(Survivor(MANAGER_CLASS, "arguments", args, MAX_MIN_SWAPPED) for args in (
        "len(keys), self._num_chunks - self._num_allocated_chunks", "usage - write_usage, 0.0")),
    Survivor(MANAGER_CLASS, "constant", "1", "the cache generation advanced by 2 on a reset: it is only compared with "
                                             "its own copies"),
)

# The swap kernel's mutants that copy the same bytes on every input the fast path takes (each page a multiple of 8
# bytes, `bytes_per_chunk` a power of two of at least 8, a one-dimensional grid), each with why.
K = "_swap_blocks_kernel"
SWAP_KERNEL_EQUIVALENT = (
    Survivor(K, "constant", "0", "tl.num_programs(1) is 1 in a one-dimensional grid: each program strides by 1 "
             "and copies every later job again, the same bytes", replacement="1",
             line="num_progs = tl.num_programs(0)"),
    Survivor(K, "division", "BYTES_PER_CHUNK // 8", "ceiling division of a multiple of 8 (bytes_per_chunk is a "
             "power of two of at least 8: tl.arange needs a power of two) is the floor"),
    Survivor(K, "division", "tl.load(sizes + job) // 8", "ceiling division of a page size, a multiple of 8 on "
             "the fast path (the handler takes it for 8-byte-aligned pages only), is the floor"),
    Survivor(K, "bound", "words", "one more chunk of the loop starts at or past `words`: every index in it is "
             "masked off", replacement="(words) + 1", line="for start in range(0, words, WORDS_PER_CHUNK):"),
    Survivor(K, "constant", "0", "the value a masked-off load gives is never stored (the store has the same "
             "mask)", replacement="1", line="data = tl.load(src + idx, mask=mask, other=0)"),
)

CONFORM = (
    ConformTarget(
        "vllm", "offload_transfer_async",
        upstream=WORKER + (Upstream(GPU_WORKER, (HANDLER, "compute_sub_block_ptrs"), checked=(
            "compute_sub_block_ptrs", f"{HANDLER}.__init__", f"{HANDLER}._estimate_max_copy_ops",
            f"{HANDLER}._fill_direct_ops", f"{HANDLER}.transfer_async")),),
        adapter="kvsim.conform.vllm.offload_mapping:TRANSFER", unreached=TRANSFER_UNREACHED,
        survivors=TRANSFER_SURVIVORS,
        doc="the batched swap's (src, dst, size) triples, bytes and descriptors per transfer, random geometries, "
            "both directions; the model's mapping properties on upstream's triples"),
    ConformTarget(
        "vllm", "offload_get_finished",
        upstream=WORKER + (Upstream(GPU_WORKER, (HANDLER, "compute_sub_block_ptrs"), checked=(
            f"{HANDLER}.get_finished", f"{HANDLER}.wait")),),
        adapter="kvsim.conform.vllm.offload_mapping:FINISHED",
        doc="transfers reported in submission order whatever order their events fire in: the handler in lockstep "
            "with the model's TransferQueue (submits, fires, polls, waits)"),
    ConformTarget(
        "vllm", "offload-swap-triton",
        upstream=(Upstream(SWAP_TRITON, ("swap_blocks_batch", "_swap_blocks_kernel", "NUM_SMS", "THRESHOLD_BYTES",
                                         "MIN_N"), checked=("swap_blocks_batch", "_swap_blocks_kernel")),),
        adapter="kvsim.conform.vllm.offload_mapping:SWAP_TRITON",
        survivors=(Survivor("swap_blocks_batch", "arguments", "NUM_SMS, n", "min's two arguments swapped"),
                   *SWAP_KERNEL_EQUIVALENT),
        doc="upstream's swap_blocks_batch and its Triton kernel (the CPU->GPU fast path for small 8-byte-aligned "
            "pages) on the model's triples, in the kernel child; bytes against apply_swap"),
    ConformTarget(
        "vllm", "CPUOffloadingManager", upstream=MANAGER_FILES,
        adapter="kvsim.conform.vllm.offload:MANAGER", unreached=MANAGER_UNREACHED, survivors=MANAGER_SURVIVORS,
        doc="the manager (LRU and ARC) in lockstep with the model, one Hypothesis state machine; every return "
            "value, the events, counters, slots and policy order after every step"),
    ConformTarget(
        "vllm", "offload_rename", upstream=MANAGER_FILES,
        adapter="kvsim.conform.vllm.offload:RENAME",
        doc="the #52615 rename: this release (new names) and vLLM 0.29.0 (old names) in lockstep, each read "
            "through its naming"),
)
