"""The engines' code `kv-zeroing` is checked against (`kvsim conform vllm`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.vllm`, imported only when the target runs). `releases`: the variant each release follows.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Upstream

UTILS = "vllm/v1/worker/utils.py"
# d6af803 (#50276, first released in 0.28.0): a segment's stride apart from its page; the merge of overlaid
# segments (the widest page per address) first released in 0.29.0
ZEROER_RELEASES = ((None, "pre_d6af803"), ("0.28.0", "first_view_overlaid"), ("0.29.0", "fixed"))

CONFORM = (
    ConformTarget(
        "vllm", "KVBlockZeroer",
        upstream=(Upstream(UTILS, ("KVBlockZeroer",), checked=("KVBlockZeroer.__init__",)),),
        adapter="kvsim.conform.vllm.zeroer:ZEROER", releases=ZEROER_RELEASES,
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
                            "an empty block list launched: a grid of no block, the same no-op as the early return"),),
        doc="upstream's Triton _zero_kv_blocks_kernel (launched by zero_block_ids and warmup, in the kernel child) "
            "vs the reference memset zero_blocks, bit for bit; probe: the d6af803 frame property on upstream's "
            "planner and kernel, guard bytes around each allocation"),
)
