"""The engines' code `kv-zeroing` is checked against (`kvsim conform vllm`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.vllm`, imported only when the target runs). `releases`: the variant each release follows.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Upstream

UTILS = "vllm/v1/worker/utils.py"
# d6af803 (#50276, first released in 0.28.0): a segment's stride apart from its page; the merge of overlaid
# segments (the widest page per address) first released in 0.29.0
ZEROER_RELEASES = ((None, "pre_d6af803"), ("0.28.0", "first_view_overlaid"), ("0.29.0", "fixed"))

ZEROER_INIT = "KVBlockZeroer.__init__"
ASSERTED_WHOLE = "ceiling division of a quotient the assertion before it makes whole"
ZEROER_SURVIVORS = (
    Survivor(ZEROER_INIT, "division", "kv.shape[0] // num_blocks", ASSERTED_WHOLE + " (kv.shape[0] % num_blocks)"),
    Survivor(ZEROER_INIT, "division", "logical_block_stride_bytes // 4",
             ASSERTED_WHOLE + " (block_stride_bytes % 4: the logical stride is a multiple of it)"),
    Survivor(ZEROER_INIT, "division", "kernel_page_bytes // 4", ASSERTED_WHOLE + " (kernel_page_bytes % 4)"),
    Survivor(ZEROER_INIT, "constant", "1", "the outer-dimension search started at dimension 0: the block dimension's "
                                           "stride is the block stride, never greater than itself"),
    Survivor(ZEROER_INIT, "arguments", "outer, outer_strides", "zip's two arguments swapped: the sum of products is "
                                                               "the same"),
    Survivor(ZEROER_INIT, "arguments", "seg_page_sizes[idx], kernel_page_bytes // 4", "max's two arguments swapped"),
    Survivor(ZEROER_INIT, "arguments", "1 << (max_page_size_el - 1).bit_length(), 1024",
             "min's two arguments swapped"),
)

CONFORM = (
    ConformTarget(
        "vllm", "KVBlockZeroer",
        upstream=(Upstream(UTILS, ("KVBlockZeroer",), checked=("KVBlockZeroer.__init__",)),),
        adapter="kvsim.conform.vllm.zeroer:ZEROER", releases=ZEROER_RELEASES, survivors=ZEROER_SURVIVORS,
        doc="segment table and launch (BLOCK_SIZE, chunks, segments) of the real KVBlockZeroer.__init__ on CPU "
            "tensors vs plan_segments/launch_config of the release's variant; every kv-zeroing property on "
            "upstream's plan"),
    ConformTarget(
        "vllm", "zero-kv-blocks-kernel",
        upstream=(Upstream(UTILS, ("KVBlockZeroer", "_zero_kv_blocks_kernel"),
                           checked=("_zero_kv_blocks_kernel", "KVBlockZeroer.zero_block_ids",
                                    "KVBlockZeroer.warmup")),),
        adapter="kvsim.conform.vllm.kernels:ZERO_KV_BLOCKS", releases=ZEROER_RELEASES,
        survivors=(Survivor("KVBlockZeroer.zero_block_ids", "boolean", "not block_ids or self._meta is None",
                            "an empty block list launched: a grid of no block, the same no-op as the early return"),
                   Survivor("_zero_kv_blocks_kernel", "comparison", ">=",
                            "a chunk that starts exactly at the page's end goes on to a store whose every column is "
                            "masked off (cols < page_size_el): nothing is written", replacement=">",
                            line="if chunk_offset >= page_size_el:")),
        doc="upstream's Triton _zero_kv_blocks_kernel (launched by zero_block_ids and warmup, in the kernel child) "
            "vs the reference memset zero_blocks, bit for bit; probe: the d6af803 frame property on upstream's "
            "planner and kernel, guard bytes around each allocation"),
)
