"""Numeric properties of `mla-chunks`: chunked context against full attention (vllm.md 1.4, 13 and 14).

The chunked path (`kvsim.models.mla_chunks.prefill`) gathers context rows from a paged cache with a
random block permutation, attends each chunk with its LSE, accumulates and merges with
the causal suffix; it must equal attention over `context + causal new tokens` in one
softmax, in float64, whatever the workspace, block size, alignment or DCP layout.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.mla_chunks.planner import FIXED, MlaVariant
from kvsim.models.mla_chunks.variants import VARIANTS
from kvsim.models.mla_chunks.prefill import (MlaPrefillResult, chunked_prefill_attention, context_attention_reference,
                                             full_attention_reference, make_mla_prefill_inputs)

from .cases import (BATCH_SOMETIMES, CONTEXT_FIRST_SOMETIMES, CONTINUATION_CASE, KIMI_K3_CASE, NUMERIC_EXAMPLES,
                    TAIL_SPLIT_CASE, MlaChunkCase, MlaChunkCasePair)

MODEL = "mla-chunks"
RTOL, ATOL = 1e-9, 1e-11  # float64 with a different summation order


def run_case(case: MlaChunkCase, variant: MlaVariant = FIXED) -> MlaPrefillResult:
    inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, case.seed)
    return chunked_prefill_attention(inputs, workspace_size=case.workspace_size, max_num_seqs=case.max_num_seqs,
                                     block_size=case.block_size, dcp=case.dcp,
                                     align_chunk_to_block=case.align_chunk_to_block, cache_seed=case.seed + 1,
                                     variant=variant)


def _request_of(case: MlaChunkCase, token: int) -> int:
    qsl = case.query_start_loc
    return next(r for r in range(len(qsl) - 1) if qsl[r] <= token < qsl[r + 1])


def assert_states_close(case: MlaChunkCase, what: str, out: np.ndarray, lse: np.ndarray, want_out: np.ndarray,
                        want_lse: np.ndarray) -> None:
    """Outputs `[T, H, D]` and LSEs `[H, T]` agree per token; -inf LSEs must match exactly, outputs must be finite."""
    bad_out = ~np.isclose(out, want_out, rtol=RTOL, atol=ATOL)
    bad_lse = ~((lse == want_lse) | np.isclose(lse, want_lse, rtol=RTOL, atol=ATOL))
    bad = bad_out.any(axis=(1, 2)) | bad_lse.any(axis=0)
    if bad.any():
        t = int(np.argmax(bad))
        r = _request_of(case, t)
        raise PropertyViolation(
            f"{what} of token {t} (request {r}, context {case.context_lens[r]}): expected output "
            f"{np.round(want_out[t, 0, :3], 6).tolist()}... lse {np.round(want_lse[:, t], 6).tolist()}, "
            f"got output {np.round(out[t, 0, :3], 6).tolist()}... lse {np.round(lse[:, t], 6).tolist()}")


@kv_property(model=MODEL, strategy="NUMERIC_CASES", examples=NUMERIC_EXAMPLES,
             sometimes=BATCH_SOMETIMES)
def chunked_prefill_matches_full_attention(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Context chunks merged with the causal suffix equal full attention over context + causal new tokens."""
    inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, case.seed)
    want_out, want_lse = full_attention_reference(inputs)
    got = run_case(case, variant)
    assert_states_close(case, "attention output", got.output, got.lse, want_out, want_lse)


@kv_property(model=MODEL, strategy="NUMERIC_CASES", examples=NUMERIC_EXAMPLES,
             sometimes=BATCH_SOMETIMES)
def context_partial_matches_context_attention(case: MlaChunkCase, variant: MlaVariant) -> None:
    """After all chunks, each token's context partial is attention over its request's whole context.

    Context-free requests must hold exactly the empty state (output 0, lse -inf): that is
    what `init_mla_context_partial` or `mask_empty_context` guarantees, and what an empty
    span's unmasked scratch (NaN output, finite LSE) breaks.
    """
    got = run_case(case, variant)
    if got.context_output is None:
        return
    inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, case.seed)
    want_out, want_lse = context_attention_reference(inputs)
    assert_states_close(case, "context partial", got.context_output, got.context_lse, want_out, want_lse)


@kv_property(model=MODEL, strategy="CONTEXT_FIRST_CASES",
             examples=[CONTINUATION_CASE, TAIL_SPLIT_CASE, KIMI_K3_CASE], sometimes=CONTEXT_FIRST_SOMETIMES)
def uniform_and_per_request_plans_agree(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Where the uniform plan is sound (one rank, context-ful prefills first) both plans give the same output,
    and the per-request plan needs no more chunks than the uniform plan on the uniform plan's workspace.

    The variant is compared with the other plan: the per-request plan (`fixed`) with
    `pre_b38e111d`, the uniform variants with `fixed`. The chunk counts are compared at one
    workspace: the uniform plan's lower bound `max(W, max_num_seqs * block)` can exceed the
    per-request plan's `round_up(max(W, A), A)` (vllm#51733), and a larger workspace is not the plan's merit.
    """
    other = VARIANTS["pre_b38e111d"] if variant.per_request_plan else FIXED
    mine, theirs = run_case(case, variant), run_case(case, other)
    assert_states_close(case, f"output ({variant} vs {other})", mine.output, mine.lse, theirs.output, theirs.lse)
    (per_request, uniform), old = ((variant, other), theirs) if variant.per_request_plan else ((other, variant), mine)
    new_md = replace(case, workspace_size=case.workspace(uniform)).metadata(per_request)
    n_new = 0 if new_md is None else len(new_md.chunks)
    n_old = 0 if old.metadata is None else len(old.metadata.chunks)
    if n_new > n_old:
        raise PropertyViolation(f"chunks for {list(case.context_lens)}: expected per-request <= uniform {n_old}, "
                                f"got {n_new}")


@kv_property(model=MODEL, strategy="NUMERIC_CASE_PAIRS",
             examples=[MlaChunkCasePair(c, MlaChunkCase(c.context_lens, c.query_lens, block_size=1,
                                                        workspace_size=100, max_num_seqs=c.max_num_seqs,
                                                        align_chunk_to_block=False, seed=c.seed))
                       for c in NUMERIC_EXAMPLES[:3]])
def output_independent_of_workspace_block_and_alignment(pair: MlaChunkCasePair, variant: MlaVariant) -> None:
    """The final output and LSE do not depend on the workspace size, the block size or the split alignment."""
    a, b = run_case(pair.first, variant), run_case(pair.second, variant)
    assert_states_close(pair.first, f"output under (W {pair.second.workspace_size}, block {pair.second.block_size}, "
                        f"aligned {pair.second.align_chunk_to_block}) vs the first configuration",
                        b.output, b.lse, a.output, a.lse)
