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
POSITIONS = ("a key's position in its request (ReqContext.get_offload_key_position): the model's keys carry none, "
             "so the adapter's ReqContext answers None")
MANAGER_UNREACHED = (
    Unreached("LRUCachePolicy._update_heap", "if len(updated_evictable) >= max(64,",
              "a heap rebuilt for 64 or more updated keys: the lockstep has 6 keys"),
    Unreached("LRUCachePolicy.insert", "self._ranks[key] = (self._get_request_rank(req_context), -position)",
              POSITIONS),
    Unreached("LRUCachePolicy.insert", "if chunk.ref_cnt == 0:",
              "a chunk inserted already evictable: the manager inserts chunks write-pending (ref_cnt -1)"),
    Unreached("LRUCachePolicy.on_request_access", "rank = (request_rank, -position)", POSITIONS),
    Unreached("LRUCachePolicy.on_request_access", "if self._ranks[key] >= rank:", POSITIONS),
    Unreached("LRUCachePolicy.on_request_access", "self._ranks[key] = rank", POSITIONS),
    Unreached("LRUCachePolicy.on_request_access", "if key in self._evictable:", POSITIONS),
    Unreached("CPUOffloadingManager", "if len(positions) == len(keys):", POSITIONS),
    Unreached("CPUOffloadingManager.config_info", "return [self._config_info]",
              "config_info: connector metadata the model has no counterpart of"),
)

CONFORM = (
    ConformTarget(
        "vllm", "offload_transfer_async",
        upstream=WORKER + (Upstream(GPU_WORKER, (HANDLER, "compute_sub_block_ptrs"), checked=(
            "compute_sub_block_ptrs", f"{HANDLER}.__init__", f"{HANDLER}._estimate_max_copy_ops",
            f"{HANDLER}._fill_direct_ops", f"{HANDLER}.transfer_async")),),
        adapter="kvsim.conform.vllm.offload_mapping:TRANSFER",
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
        survivors=(Survivor("swap_blocks_batch", "arguments", "NUM_SMS, n", "min's two arguments swapped"),),
        doc="upstream's swap_blocks_batch and its Triton kernel (the CPU->GPU fast path for small 8-byte-aligned "
            "pages) on the model's triples, in the kernel child; bytes against apply_swap"),
    ConformTarget(
        "vllm", "CPUOffloadingManager", upstream=MANAGER_FILES,
        adapter="kvsim.conform.vllm.offload:MANAGER", unreached=MANAGER_UNREACHED,
        doc="the manager (LRU and ARC) in lockstep with the model, one Hypothesis state machine; every return "
            "value, the events, counters, slots and policy order after every step"),
    ConformTarget(
        "vllm", "offload_rename", upstream=MANAGER_FILES,
        adapter="kvsim.conform.vllm.offload:RENAME",
        doc="the #52615 rename: this release (new names) and vLLM 0.29.0 (old names) in lockstep, each read "
            "through its naming"),
)
