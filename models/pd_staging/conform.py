"""The engines' code `pd-staging` is checked against (`kvsim conform sglang`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.sglang`, imported only when the target runs). `releases`: the variant each release follows.
"""

from kvsim.engine.conformance.declare import ConformTarget, Upstream

STAGING_BUFFER = "sglang/srt/disaggregation/common/staging_buffer.py"
STAGING_HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
FRESH_ROUND = ((None, "fixed"), ("0.5.19", "sglang_0_5_23"))  # SGLang #37166: an emptied ring starts a fresh round

CONFORM = (
    ConformTarget(
        "sglang", "StagingAllocator",
        upstream=(Upstream(STAGING_BUFFER, ("StagingAllocator",)),
                  Upstream(STAGING_HANDLER, ("is_watermark_ready",), checked=())),
        adapter="kvsim.conform.sglang.ring:LOCKSTEP", releases=FRESH_ROUND,
        doc="ring assign/free in lockstep with the model (one Hypothesis state machine), every observable after "
            "every step"),
    ConformTarget(
        "sglang", "is_watermark_ready",
        upstream=(Upstream(STAGING_HANDLER, ("is_watermark_ready",)),),
        adapter="kvsim.conform.sglang.ring:GATE",
        doc="prefill write gate, exhaustive over a small domain"),
)
