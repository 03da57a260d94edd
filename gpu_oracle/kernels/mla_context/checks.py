"""Differential checks of the MLA chunked-context kernels against `models.mla_attention` (vLLM b38e111d).

* `gather_mla_context.differential`: batches planned by the metadata builder (every
  variant, with and without DCP), context rows in the model's paged caches (random block
  order, NaN poison in unused slots), cast to float64/float32/float16, optionally with a
  padded entry stride: every chunk's (and every DCP rank's) workspace rows from the
  backend equal `gather_context_rows` bit for bit.
* `gather_mla_context.asan_catches_bad_metadata`: a cu_seq_lens one row off and a block
  table naming a block past the cache stop the ASan build with a heap-buffer-overflow READ
  in gather_mla_context.cu; the builder's metadata runs clean with the reference bytes.
* `merge_attn_states.differential`: fp32 states (LSEs finite, -inf or FA2's +inf on either
  or both sides, padded strides) merged by the backend agree with the float64 reference
  within `MERGE_TOLERANCE`; empty-on-both-sides gives exactly (0, -inf).
The end-to-end SDPA checks of `models.mla_prefill` are in `gpu_oracle.mla_prefill_checks`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.errors import PropertyViolation
from kvsim.models.mla_chunks.attention import gather_context_rows
from kvsim.models.mla_chunks.attention import merge_attn_states as merge_reference
from kvsim.models.mla_chunks.planner import VARIANTS
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.metadata import build_context_metadata
from kvsim.models.mla_chunks.prefill import (MlaShape, PagedLatentCache, build_context_caches, build_paged_latent_cache,
                                make_mla_prefill_inputs)

from ...runtime import asan
from ...runtime.checks import CheckOutcome, hypothesis_check, oracle_check
from .backends import gather_mla_context, merge_attn_states

# fp32 merge vs float64 (research note trtllm_flashinfer.md 2.6: vLLM allows 1e-3/1e-3 for fp32; a merge
# alone is a few roundings, so much less is owed). out: |d| <= 2e-6 * (|op| + |os|): the weights carry
# ~3 ulps (expf, divide) and exp(x) of a rounded difference x adds |x| e^-|x| ulp <= 0.4 ulp.
# lse: |d| <= 1e-6 * (1 + |lse|): M is exact, log(total) in [0, ln 2] and the sum round once each.
MERGE_TOLERANCE = {"output_rtol": 2e-6, "lse_rtol": 1e-6}


# --- gather ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GatherCase:
    """A batch planned by `build_context_metadata`, and how its paged cache is stored."""

    variant: str
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    block_size: int
    workspace_size: int
    max_num_seqs: int
    dcp: tuple[int, int] | None  # (world, interleave)
    latent_width: int
    dtype: str
    entry_pad: int  # extra elements after each cache entry (a padded entry stride)
    threads: int
    seed: int


_DCP_LAYOUTS = ((2, 1), (2, 2), (4, 1))


@st.composite
def gather_cases(draw: st.DrawFn, variants: tuple[str, ...] = VARIANTS) -> GatherCase:
    ctx = draw(st.lists(st.integers(-10, 40).map(lambda c: max(c, 0)), min_size=1, max_size=4))
    dcp = draw(st.none() | st.sampled_from(_DCP_LAYOUTS))
    virtual = 1 if dcp is None else dcp[0] * dcp[1]
    block = virtual * draw(st.sampled_from((1, 2, 3, 4, 8) if dcp is None else (1, 2, 4)))
    return GatherCase(draw(st.sampled_from(variants)), tuple(ctx),
                      tuple(draw(st.lists(st.integers(1, 3), min_size=len(ctx), max_size=len(ctx)))), block,
                      draw(st.integers(1, 64)), len(ctx) + draw(st.integers(0, 2)), dcp, draw(st.integers(1, 12)),
                      draw(st.sampled_from(("float64", "float32", "float16"))), draw(st.sampled_from((0, 0, 3))),
                      draw(st.sampled_from((64, 1, 5, 256))), draw(st.integers(0, 2**16)))


def _cast_cache(cache: PagedLatentCache, dtype: str, entry_pad: int) -> np.ndarray:
    """The cache in `dtype`, as a view into a buffer whose entries are `entry_pad` elements wider."""
    nb, bs, width = cache.kv_cache.shape
    buffer = np.full((nb, bs, width + entry_pad), 7, dtype=dtype)
    buffer[:, :, :width] = cache.kv_cache.astype(dtype)
    return buffer[:, :, :width]


def gather_launches(case: GatherCase):  # type: ignore[no-untyped-def]
    """(what, kv_cache, block_table, cu_seq_lens, token_to_seq, seq_starts) for every chunk and DCP rank."""
    dcp = None if case.dcp is None else DcpConfig(*case.dcp)
    metadata = build_context_metadata(case.variant, case.context_lens, case.query_lens, case.workspace_size,
                                      case.max_num_seqs, case.block_size, dcp=dcp)
    if metadata is None:
        return
    shape = MlaShape(kv_lora_rank=case.latent_width, qk_rope_head_dim=1)
    inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, shape, seed=case.seed)
    caches = build_context_caches(inputs, case.block_size, dcp, seed=case.seed)
    for chunk in metadata.chunks:
        rs = chunk.request_slice
        for rank, cache in enumerate(caches):
            table = cache.block_table[rs]
            kv = _cast_cache(cache, case.dtype, case.entry_pad)
            if dcp is None:
                yield f"chunk {chunk.index}", kv, table, chunk.cu_seq_lens, chunk.token_to_seq, chunk.starts
            else:
                yield (f"chunk {chunk.index} rank {rank}", kv, table, chunk.padded_local_cu_seq_lens,
                       chunk.padded_local_token_to_seq, chunk.local_starts)


def _first_difference(expected: np.ndarray, got: np.ndarray) -> str:
    if expected.shape != got.shape:
        return f"shape {got.shape} instead of {expected.shape}"
    differ = np.argwhere(expected.view(np.uint8).reshape(expected.shape[0], -1)
                         != got.view(np.uint8).reshape(got.shape[0], -1))
    row = int(differ[0][0])
    return (f"{len(np.unique(differ[:, 0]))} rows differ, first row {row}: reference "
            f"{expected[row][:4].tolist()}..., backend {got[row][:4].tolist()}...")


@oracle_check("gather_mla_context.differential")
def gather_differential(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """For batches planned by the metadata builder (all variants, with and without DCP) over paged caches in
    random block order with NaN-poisoned unused slots, in float64/float32/float16 and with padded entry strides,
    every chunk's workspace rows from the backend equal models.mla_attention.gather_context_rows bit for bit."""

    def test(case: GatherCase) -> None:
        for what, kv, table, cu, seq, starts in gather_launches(case):
            expected = gather_context_rows(kv, table, cu, seq, starts)
            got = gather_mla_context(backend, kv, table, cu, seq, starts, threads=case.threads)
            if expected.shape != got.shape or expected.tobytes() != got.tobytes():
                raise PropertyViolation(f"workspace bytes of {what} on {backend} equal to the reference gather's: "
                                        f"{_first_difference(expected, got)}")

    return hypothesis_check(gather_cases(), test, max_examples, seed)


def bad_metadata_cases() -> list[tuple[str, np.ndarray, np.ndarray, tuple, tuple, tuple]]:
    """Requests with context 5 and 8 rows, block 4, one chunk: the builder's metadata, then two wrong ones.

    The second request's table row ends exactly at its last block, so one row too far is out of the table.
    """
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal((n, 6)).astype(np.float32) for n in (5, 8)]
    cache = build_paged_latent_cache(rows, (5, 8), 4, 6, rng)
    kv = cache.kv_cache.astype(np.float32)
    metadata = build_context_metadata("fixed", (5, 8), (1, 1), 64, 2, 4)
    assert metadata is not None and len(metadata.chunks) == 1
    chunk = metadata.chunks[0]
    good = (chunk.cu_seq_lens, chunk.token_to_seq, chunk.starts)
    shifted = (chunk.cu_seq_lens[0], chunk.cu_seq_lens[1] - 1, chunk.cu_seq_lens[2])
    foreign = cache.block_table.copy()
    foreign[1, 1] = kv.shape[0]  # a block id from a larger cache
    return [("builder metadata", kv, cache.block_table, *good),
            ("cu_seq_lens[1] one row early", kv, cache.block_table, shifted, good[1], good[2]),
            ("block table naming block num_blocks", kv, foreign, *good)]


@oracle_check("gather_mla_context.asan_catches_bad_metadata", backends=("cpu-shim-asan",), asan_in_child=False)
def gather_asan(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """Fed a cu_seq_lens one row off (the block table is read past its end) or a block table naming a block
    past the cache (the cache is read past its end), the ASan build stops with a heap-buffer-overflow READ in
    gather_mla_context.cu; the metadata builder's own metadata runs clean and gives the reference bytes."""
    caught = []
    for examples, (what, kv, table, cu, seq, starts) in enumerate(bad_metadata_cases(), 1):
        child = asan.run_gather_case(kv, table, cu, seq, starts)
        if what == "builder metadata":
            digest = hashlib.sha256(gather_context_rows(kv, table, cu, seq, starts).tobytes()).hexdigest()
            if not child.clean or child.output is None or child.output["sha256"] != digest:
                return CheckOutcome(examples, "failed", f"{what}: expected a clean run with the reference bytes, "
                                    f"got {child.explain()}")
            continue
        report = child.report
        if report is None or report.kind != "heap-buffer-overflow" or report.access != "READ" \
                or not report.file.endswith("gather_mla_context.cu"):
            return CheckOutcome(examples, "failed", f"{what}: expected an ASan heap-buffer-overflow READ in "
                                f"gather_mla_context.cu, got {child.explain()}")
        caught.append(f"{what}: {report}")
    return CheckOutcome(len(caught) + 1, "passed", "caught " + "; ".join(caught))


# --- merge -------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MergeCase:
    prefix_output: np.ndarray  # float32 [T, H, D]
    prefix_lse: np.ndarray  # float32 [H, T]
    suffix_output: np.ndarray
    suffix_lse: np.ndarray
    head_pad: int
    token_pad: int
    threads: int
    with_lse: bool


@st.composite
def merge_cases(draw: st.DrawFn) -> MergeCase:
    t, h, d = draw(st.integers(0, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude, spread = draw(st.sampled_from((1.0, 100.0))), draw(st.sampled_from((1.0, 30.0)))
    # Per (head, token): 0 both finite, 1 prefix empty, 2 suffix empty, 3 both empty; each -inf or FA2's +inf.
    kinds = rng.choice(4, size=(h, t), p=draw(st.sampled_from(((1, 0, 0, 0), (.4, .2, .2, .2), (0, 0, 0, 1)))))
    lses = []
    for empty_kinds in ((1, 3), (2, 3)):
        lse = (rng.standard_normal((h, t)) * spread).astype(np.float32)
        empty = np.isin(kinds, empty_kinds)
        lse[empty] = np.where(rng.random(empty.sum()) < 0.75, -np.inf, np.inf)
        lses.append(lse)
    outs = [(rng.uniform(-1, 1, (t, h, d)) * magnitude).astype(np.float32) for _ in range(2)]
    return MergeCase(outs[0], lses[0], outs[1], lses[1], draw(st.integers(0, 3)), draw(st.integers(0, 3)),
                     draw(st.sampled_from((32, 1, 3, 128))), draw(st.booleans()))


def _merge_describe(case: MergeCase) -> dict:
    return {"T_H_D": case.prefix_output.shape, "prefix_lse": case.prefix_lse, "suffix_lse": case.suffix_lse,
            "head_pad": case.head_pad, "token_pad": case.token_pad, "threads": case.threads,
            "with_lse": case.with_lse}


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


@oracle_check("merge_attn_states.differential")
def merge_differential(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """fp32 partial states with LSEs finite, -inf or +inf (FA2's empty row) on either or both sides, outputs of
    magnitude 1 or 100, padded head and token strides: the backend's merge equals the float64 reference within
    output |d| <= 2e-6 (|op| + |os|) and LSE |d| <= 1e-6 (1 + |lse|); both sides empty gives exactly (0, -inf);
    no NaN; the output padding is never written."""

    def test(case: MergeCase) -> None:
        result = merge_attn_states(backend, case.prefix_output, case.prefix_lse, case.suffix_output,
                                   case.suffix_lse, head_pad=case.head_pad, token_pad=case.token_pad,
                                   threads=case.threads, with_lse=case.with_lse)
        message = merge_violation(case, backend, result.output, result.lse, result.padding_untouched)
        if message:
            raise PropertyViolation(message)

    return hypothesis_check(merge_cases(), test, max_examples, seed, _merge_describe)
