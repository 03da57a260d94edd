"""Kernel properties of the MLA chunked-context kernels against model `mla-chunks` (vLLM b38e111d).

* `gather_mla_context_differential`: batches planned by the metadata builder (every
  variant, with and without DCP), context rows in the model's paged caches (random block
  order, NaN poison in unused slots), cast to float64/float32/float16, optionally with a
  padded entry stride: every chunk's (and every DCP rank's) workspace rows from the
  backend equal `gather_context_rows` bit for bit.
* `gather_mla_context_asan_catches_bad_metadata`: a cu_seq_lens one row off and a block
  table naming a block past the cache stop the ASan build with a heap-buffer-overflow READ
  in gather_mla_context.cu; the builder's metadata runs clean with the reference bytes.
* `merge_attn_states_differential`: fp32 states (LSEs finite, -inf or FA2's +inf on either
  or both sides, padded strides) merged by the backend agree with the float64 reference
  within `MERGE_TOLERANCE`; empty-on-both-sides gives exactly (0, -inf).

The end-to-end SDPA properties of the prefill are in `prefill_properties`. The kernels have
no variants: these properties hold on every variant of the model (the cases carry their plans).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kernel_property
from kvsim.models.mla_chunks.attention import gather_context_rows
from kvsim.models.mla_chunks.attention import merge_attn_states as merge_reference

from ...runtime import asan
from ...runtime.discovery import BACKEND_NAMES
from .backends import case_document, gather_mla_context, merge_attn_states
from .cases import BadMetadataCase, GatherCase, MergeCase, gather_launches

MODEL = "mla-chunks"
# fp32 merge vs float64 (research note trtllm_flashinfer.md 2.6: vLLM allows 1e-3/1e-3 for fp32; a merge
# alone is a few roundings, so much less is owed). out: |d| <= 2e-6 * (|op| + |os|): the weights carry
# ~3 ulps (expf, divide) and exp(x) of a rounded difference x adds |x| e^-|x| ulp <= 0.4 ulp.
# lse: |d| <= 1e-6 * (1 + |lse|): M is exact, log(total) in [0, ln 2] and the sum round once each.
MERGE_TOLERANCE = {"output_rtol": 2e-6, "lse_rtol": 1e-6}


def _first_difference(expected: np.ndarray, got: np.ndarray) -> str:
    if expected.shape != got.shape:
        return f"shape {got.shape} instead of {expected.shape}"
    differ = np.argwhere(expected.view(np.uint8).reshape(expected.shape[0], -1)
                         != got.view(np.uint8).reshape(got.shape[0], -1))
    row = int(differ[0][0])
    return (f"{len(np.unique(differ[:, 0]))} rows differ, first row {row}: reference "
            f"{expected[row][:4].tolist()}..., backend {got[row][:4].tolist()}...")


@kernel_property(model=MODEL, strategy="GATHER_CASES", backends=BACKEND_NAMES)
def gather_mla_context_differential(case: GatherCase, variant: Any, backend: str) -> None:
    """For batches planned by the metadata builder (all variants, with and without DCP) over paged caches in
    random block order with NaN-poisoned unused slots, in float64/float32/float16 and with padded entry strides,
    every chunk's workspace rows from the backend equal gather_context_rows bit for bit."""
    for what, kv, table, cu, seq, starts in gather_launches(case):
        expected = gather_context_rows(kv, table, cu, seq, starts)
        got = gather_mla_context(backend, kv, table, cu, seq, starts, threads=case.threads)
        if expected.shape != got.shape or expected.tobytes() != got.tobytes():
            raise PropertyViolation(f"workspace bytes of {what} on {backend} equal to the reference gather's: "
                                    f"{_first_difference(expected, got)}")


@kernel_property(model=MODEL, strategy="BAD_METADATA", backends=("cpu-shim-asan",), asan_in_child=False)
def gather_mla_context_asan_catches_bad_metadata(case: BadMetadataCase, variant: Any, backend: str) -> None:
    """Fed a cu_seq_lens one row off (the block table is read past its end) or a block table naming a block
    past the cache (the cache is read past its end), the ASan build stops with a heap-buffer-overflow READ in
    gather_mla_context.cu; the metadata builder's own metadata runs clean and gives the reference bytes."""
    child = asan.run_case("mla_context", case_document(*case.arguments))
    if case.overrun:
        asan.expect_overflow(case.what, child, "READ", "gather_mla_context.cu")
    else:
        asan.expect_clean(case.what, child, gather_context_rows(*case.arguments))


def merge_violation(case: MergeCase, backend: str, out: np.ndarray, lse: np.ndarray | None,
                    padding_untouched: bool) -> str | None:
    """What the backend's merge got wrong against the float64 reference, or None."""
    ref_out, ref_lse = merge_reference(*(x.astype(np.float64) for x in (case.prefix_output, case.prefix_lse,
                                                                        case.suffix_output, case.suffix_lse)))
    if not padding_untouched:
        return f"padding of the strided output on {backend}: expected untouched, got overwritten"
    both_empty = np.isneginf(ref_lse).T  # [T, H]
    if np.isnan(out).any():
        t, h, _ = np.argwhere(np.isnan(out))[0]
        return f"NaN in the merged output on {backend}: expected none, got one at token {t} head {h}"
    if (out[both_empty] != 0).any():
        return f"output of states empty on both sides on {backend}: expected exactly 0, got {out[both_empty][:4]}"
    bound = MERGE_TOLERANCE["output_rtol"] * (np.abs(case.prefix_output) + np.abs(case.suffix_output))
    err = np.abs(out.astype(np.float64) - ref_out)
    if (err > bound).any():
        at = tuple(np.argwhere(err > bound)[0])
        return (f"merged output at {at} on {backend}: expected {ref_out[at]!r} within {bound[at]:.3g}, "
                f"got {out[at]!r}")
    if lse is not None:
        if not np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)) or np.isnan(lse).any():
            where = np.argwhere(np.isneginf(ref_lse)).tolist()
            return f"empty merged LSEs on {backend}: expected -inf exactly at (head, token) {where}, got {lse.tolist()}"
        finite = np.isfinite(ref_lse)
        lerr = np.abs(lse[finite].astype(np.float64) - ref_lse[finite])
        lbound = MERGE_TOLERANCE["lse_rtol"] * (1 + np.abs(ref_lse[finite]))
        if (lerr > lbound).any():
            i = int(np.argmax(lerr - lbound))
            return (f"merged LSE on {backend}: expected {ref_lse[finite][i]!r} within {lbound[i]:.3g}, "
                    f"got {lse[finite][i]!r}")
    return None


@kernel_property(model=MODEL, strategy="MERGE_CASES", backends=BACKEND_NAMES)
def merge_attn_states_differential(case: MergeCase, variant: Any, backend: str) -> None:
    """fp32 partial states with LSEs finite, -inf or +inf (FA2's empty row) on either or both sides, outputs of
    magnitude 1 or 100, padded head and token strides: the backend's merge equals the float64 reference within
    output |d| <= 2e-6 (|op| + |os|) and LSE |d| <= 1e-6 (1 + |lse|); both sides empty gives exactly (0, -inf);
    no NaN; the output padding is never written."""
    result = merge_attn_states(backend, case.prefix_output, case.prefix_lse, case.suffix_output,
                               case.suffix_lse, head_pad=case.head_pad, token_pad=case.token_pad,
                               threads=case.threads, with_lse=case.with_lse)
    message = merge_violation(case, backend, result.output, result.lse, result.padding_untouched)
    if message:
        raise PropertyViolation(message)
