"""The four `mla-chunks` bug reports (vLLM b38e111d and #49294), as data."""

from __future__ import annotations

from kvsim.engine.registry import BugReport

MODEL = "mla-chunks"

BUGS = (
    BugReport(
        id="vllm-b38e111d-mla-dcp-misaligned-chunk", model=MODEL, variant="pre_b38e111d",
        property="dcp_reorg_matches_chunk_spans", source="vLLM b38e111d (#50613)",
        summary="uniform DCP chunk size mcc not a multiple of world*interleave: each rank's local chunk "
                "P = cdiv(mcc, virtual)*interleave covers more global rows than cu_seq_lens says, so reorg_kvcache "
                "keeps the wrong total (world 2, interleave 64, [1000]*3: 1152 rows vs 960)",
        max_examples=500),
    BugReport(
        id="vllm-b38e111d-mla-context-order", model=MODEL, variant="pre_b38e111d",
        property="chunked_prefill_matches_full_attention", source="vLLM b38e111d (#50613)",
        summary="prefill_tokens_with_context = qsl[n_ctx] assumes context-ful prefills come first: with contexts "
                "[0, 64] request 1's tokens skip the context merge and the output differs from full attention",
        max_examples=500),
    BugReport(
        id="vllm-b38e111d-mla-chunk-blowup", model=MODEL, variant="pre_b38e111d",
        property="chunk_count_within_alignment_slack", source="vLLM b38e111d (#50613, RFC #50497)",
        summary="cost: the uniform plan runs cdiv(max ctx, round_down(W / n_ctx, block)) chunks over every prefill, "
                "beyond the per-run bound ([960, 16x7], W 1024: 8 chunks instead of 2)",
        max_examples=500),
    BugReport(
        id="vllm-49294-mla-empty-span", model=MODEL, variant="uniform_unmasked",
        property="context_partial_matches_context_attention", source="vLLM #49294 (fixes #49334)",
        summary="without mask_empty_context an empty span's backend scratch (NaN output, finite LSE) is merged "
                "into the context partial and poisons the output",
        max_examples=500),
)
