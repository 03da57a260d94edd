"""The engines' code `swa-budget` is checked against (`kvsim conform sglang`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.sglang`, imported only when the target runs). `releases`: the variant each release follows.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Upstream

DECODE = "sglang/srt/disaggregation/decode.py"
PAGE_ROUNDED = ((None, "pre_af7c62e"), ("0.5.18", "fixed"))  # af7c62e (#33794): whole pages, not raw tokens
QUEUE = "DecodePreallocQueue"
TAIL, REQUIRED = f"{QUEUE}._swa_tail_len", f"{QUEUE}._prealloc_required_tokens"
RADIX_LINE = ("the decode radix cache's window start (disaggregation_decode_enable_radix_cache): no input runs it, "
              "the model has no radix-cache insert boundary")
MAX_IS_SYMMETRIC = "max's two arguments swapped: the same maximum"

CONFORM = (
    ConformTarget(
        "sglang", "_prealloc_required_tokens",
        upstream=(Upstream(DECODE, (QUEUE,), checked=tuple(f"{QUEUE}.{m}" for m in (
            "_prealloc_required_tokens", "_prealloc_kv_lens", "_uses_swa_tail_prealloc", "_swa_tail_len"))),),
        adapter="kvsim.conform.sglang.budget:BUDGET", releases=PAGE_ROUNDED,
        doc="(full, SWA) admission requirement in tokens",
        survivors=(
            Survivor(TAIL, "boolean", "not self._uses_swa_tail_prealloc() or seq_len <= 0",
                     "the seq_len <= 0 clause dropped: a fill length is never negative, and a tail of 0 tokens is 0 "
                     "either way"),
            Survivor(TAIL, "comparison", "<=", "seq_len <= 0 made < 0: at 0 the window path gives 0 too"),
            Survivor(TAIL, "constant", "0",
                     "seq_len <= 0 made <= 1 (the tail of one token is that token, for every window), or max(0, "
                     "seq_len - window) made max(1, ...) (1 // page_size is 0 on the tail path, page_size > 1); "
                     "in the radix-cache line: " + RADIX_LINE),
            Survivor(TAIL, "constant", "1", RADIX_LINE),
            *(Survivor(TAIL, "arguments", original, MAX_IS_SYMMETRIC) for original in (
                "seq_len, 0", "0, seq_len - window_size", "0, seq_len - 1 - max(window_size, page_size)",
                "window_size, page_size")),
            Survivor(REQUIRED, "comparison", ">", "page_size > 1 made >= 1: ceil_align to one token changes nothing"),
            Survivor(REQUIRED, "constant", "1", "page_size > 1 made > 0: ceil_align to one token changes nothing"),
        )),
)
