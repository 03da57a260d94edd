"""Pinned upstream regression numbers of MLA chunked context (research note vllm.md 1.5 and 1.7), exactly."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_chunks.attention import init_mla_context_partial
from kvsim.models.mla_chunks.planner import (FIXED, align_mla_chunked_context_workspace_size,
                                             chunked_context_workspace_size, plan_uniform_context_chunks)
from kvsim.models.mla_chunks.variants import VARIANTS
from kvsim.models.mla_chunks.dcp import DcpConfig, get_dcp_local_seq_lens, reorg_kvcache, reorg_kvcache_by_chunk_index
from kvsim.models.mla_chunks.metadata import (build_mla_chunked_context_metadata, query_start_loc_of, build_uniform_chunked_context_metadata,
                                 mla_accumulation_schedule, query_start_loc_of)
from kvsim.models.mla_chunks.prefill import make_mla_prefill_inputs, suffix_attention
from kvsim.properties.mla_chunks.cases import (BACKEND_CASE, CONTEXT_ORDER_CASE, CONTINUATION_CASE, DCP_BUDGET_CASE,
                                         DCP_MISALIGNED_CASE, DCP_UNALIGNED_PREFIX_CASE, KIMI_K3_CASE, NO_CONTEXT_CASE,
                                         PERF_CASE, RFC_CASE, SKIPPED_CASE, TAIL_SPLIT_CASE, MlaChunkCase, case)
from kvsim.properties.mla_chunks.dcp import rank_buffers
from kvsim.properties.mla_chunks.numeric import chunked_prefill_matches_full_attention, run_case
from kvsim.properties.mla_chunks.plan import workspace_size_is_aligned

PRE = VARIANTS["pre_b38e111d"]


def new_plan(c: MlaChunkCase):
    return c.metadata(FIXED)


def old_plan(c: MlaChunkCase):
    return c.metadata(PRE)


def spans(md) -> list[list[tuple[int, int, int]]]:
    """[(request, start, len) per piece] per chunk."""
    return [[(r, ch.starts[k], ch.seq_lens[k]) for k, r in enumerate(range(ch.request_slice.start,
                                                                           ch.request_slice.stop))]
            for ch in md.chunks]


# test_chunks_gather_every_context_row_exactly_once (W 1024, block 16): new schedule, old mcc and chunk count
@pytest.mark.parametrize("ctx, new, mcc, old_chunks", [
    ([960] + [16] * 7, [[(0, 0, 960), (1, 0, 16), (2, 0, 16), (3, 0, 16), (4, 0, 16)],
                        [(5, 0, 16), (6, 0, 16), (7, 0, 16)]], 128, 8),
    ([2048, 320], [[(0, 0, 1024)], [(0, 1024, 1024)], [(1, 0, 320)]], 512, 4),
    ([1024, 1024, 1024], [[(0, 0, 1024)], [(1, 0, 1024)], [(2, 0, 1024)]], 336, 4),
    ([37, 1000, 5], [[(0, 0, 37), (1, 0, 976)], [(1, 976, 24), (2, 0, 5)]], 336, 3),
    ([1], [[(0, 0, 1)]], 1024, 1),
])
def test_tiling_cases(ctx, new, mcc, old_chunks) -> None:
    c = case(ctx)
    assert spans(new_plan(c)) == new
    old = old_plan(c)
    assert (old.max_context_chunk, len(old.chunks)) == (mcc, old_chunks)


def test_continuation_is_confined_to_a_chunks_first_request() -> None:
    md = new_plan(CONTINUATION_CASE)
    assert [ch.is_continuation for ch in md.chunks] == [False, True, False]
    assert [(ch.token_slice.start, ch.token_slice.stop) for ch in md.chunks] == [(0, 3), (0, 3), (3, 15)]
    assert [ch.continuation_token_end for ch in md.chunks[:2]] == [3, 3]
    assert md.chunks[2].query_start_loc == (0, 5, 12)


def test_tail_splitting_minimizes_chunks() -> None:
    md = new_plan(TAIL_SPLIT_CASE)
    assert [(ch.starts, ch.seq_lens, ch.is_continuation) for ch in md.chunks] == [
        ((0, 0), (768, 256), False), ((256, 0), (256, 512), True)]


def test_prefills_without_context_are_skipped_and_neutralized() -> None:
    md = new_plan(SKIPPED_CASE)
    covered = {r for ch in md.chunks for r in range(ch.request_slice.start, ch.request_slice.stop)}
    assert covered == {0, 2} and len(md.chunks) == 2
    assert md.empty_token_slices == (slice(4, 8), slice(12, 16))
    out, lse = init_mla_context_partial(np.ones((4, 2, 3)), 16, md.empty_token_slices)
    assert out.shape == (16, 2, 3) and lse.shape == (2, 16)
    for s in md.empty_token_slices:
        assert np.all(out[s] == 0.0) and np.all(np.isneginf(lse[:, s]))


def test_no_context_needs_no_chunks() -> None:
    assert new_plan(NO_CONTEXT_CASE) is None
    assert old_plan(NO_CONTEXT_CASE) is None


def test_dcp_chunks_fit_the_per_rank_row_budget() -> None:
    md = new_plan(DCP_BUDGET_CASE)
    table = [(spans_, ch.local_starts, ch.padded_local_seq_lens, ch.num_local_context_tokens)
             for spans_, ch in zip(spans(md), md.chunks)]
    assert table == [
        ([(0, 0, 1024)], (0,), (512,), 512),
        ([(0, 1024, 1024)], (512,), (512,), 512),
        ([(0, 2048, 952)], (1024,), (512,), 512),
        ([(1, 0, 200), (2, 0, 200)], (0, 0), (128, 128), 256),
    ]
    assert all(ch.num_local_context_tokens <= 1024 // 2 for ch in md.chunks)
    assert get_dcp_local_seq_lens(3000, DCP_BUDGET_CASE.dcp) == (1528, 1472)
    old = old_plan(DCP_BUDGET_CASE)
    assert (old.max_context_chunk, old.local_chunk_size, len(old.chunks)) == (256, 128, 12)


def test_dcp_reorg_uses_each_chunks_local_starts() -> None:
    """Rank buffers hold `request*100000 + rank*10000 + local_index`; the reorg output is compared exactly."""
    md = new_plan(DCP_BUDGET_CASE)
    dcp = DCP_BUDGET_CASE.dcp
    for ch in md.chunks:
        toks = ch.num_local_context_tokens
        buffers = np.concatenate([np.asarray([r * 100000 + rank * 10000 + j
                                              for k, r in enumerate(range(ch.request_slice.start,
                                                                          ch.request_slice.stop))
                                              for j in range(ch.local_starts[k],
                                                             ch.local_starts[k] + ch.padded_local_seq_lens[k])])
                                  for rank in range(2)])[:, None]
        assert buffers.shape[0] == 2 * toks
        out, _ = reorg_kvcache(buffers, None, ch.padded_local_seq_lens, ch.local_context_lens_allranks,
                               ch.local_starts, ch.cu_seq_lens[-1], ch.max_seq_len, toks)
        want = [r * 100000 + rank * 10000 + j
                for k, r in enumerate(range(ch.request_slice.start, ch.request_slice.stop))
                for rank in range(2)
                for j in range(ch.local_starts[k], ch.local_starts[k] + min(
                    max(0, get_dcp_local_seq_lens(DCP_BUDGET_CASE.context_lens[r], dcp)[rank] - ch.local_starts[k]),
                    ch.padded_local_seq_lens[k]))]
        assert out[:, 0].tolist() == want
    # chunk 2: rank 0 keeps local [1024, 1528), rank 1 local [1024, 1472): 504 + 448 = 952 rows
    assert md.chunks[2].cu_seq_lens == (0, 952)


def test_dcp_non_virtual_aligned_prefix() -> None:
    md = new_plan(DCP_UNALIGNED_PREFIX_CASE)
    assert [ch.seq_lens for ch in md.chunks] == [(65,), (96,)]
    assert [ch.starts for ch in md.chunks] == [(0,), (0,)]
    assert [ch.local_context_lens_allranks for ch in md.chunks] == [((17, 16, 16, 16),), ((24, 24, 24, 24),)]
    # per-rank budget 32: 17 + 24 > 32, and a split of 64 rows (lcm(64, 4)) costs 16 local rows > 15 left
    assert [ch.num_local_context_tokens for ch in md.chunks] == [17, 24]


def test_backend_correctness_batch() -> None:
    for block in (16, 32, 64, 128):
        md = new_plan(MlaChunkCase(BACKEND_CASE.context_lens, BACKEND_CASE.query_lens, block_size=block))
        assert spans(md) == [[(0, 0, 1024)], [(0, 1024, 512), (1, 0, 512)], [(3, 0, 64), (4, 0, 80)]], block
        assert md.empty_token_slices == (slice(40, 48), slice(80, 88))
    old = old_plan(BACKEND_CASE)
    assert (old.max_context_chunk, len(old.chunks)) == (256, 6)
    assert all(ch.has_empty_context for ch in old.chunks)


def test_kimi_k3_batch() -> None:
    md = new_plan(KIMI_K3_CASE)
    assert spans(md) == [[(0, 0, 128)], [(0, 128, 72), (1, 0, 48)], [(2, 0, 32)]]
    assert md.empty_token_slices == (slice(18, 23),)


def test_pr_performance_case_and_rfc_example() -> None:
    assert len(new_plan(PERF_CASE).chunks) == 1
    assert len(old_plan(PERF_CASE).chunks) == 30
    assert len(new_plan(RFC_CASE).chunks) == 2
    old = old_plan(RFC_CASE)
    assert (old.max_context_chunk, len(old.chunks)) == (8192, 8)


def test_workspace_alignment_examples() -> None:
    assert align_mla_chunked_context_workspace_size(8008, 1, 64) == 8064
    assert align_mla_chunked_context_workspace_size(8064, 1, 64, DcpConfig(2, 64)) == 8064  # lcm(64, 128) = 128


# (requested W, max_num_seqs, block, DCP) -> (vllm 0.28.0 and 0.33.0, b38e111d), from `kvsim conform vllm`
# on both releases (mla_attention.py align_mla_chunked_context_workspace_size: round_up(max(W, A), A)).
UPSTREAM_WORKSPACES = (
    ((1, 4, 2, DcpConfig(2, 1)), 2, 8),  # the conform counterexample: A = lcm(2, 2) = 2
    ((1, 8, 1, None), 1, 8),
    ((100, 8, 16, None), 112, 128),
    ((65536, 256, 64, DcpConfig(8, 64)), 65536, 131072),  # b38e111d doubled the 64 Ki-capped workspace
    ((8008, 1, 64, None), 8064, 8064),
)


def test_workspace_drops_the_max_num_seqs_term_as_vllm_51733() -> None:
    """vllm#51733 (in 0.28.0 and later) dropped b38e111d's max_num_seqs * alignment floor: `fixed` follows it."""
    b38e111d = VARIANTS["b38e111d"]
    assert not FIXED.workspace_seq_term
    for (w, seqs, block, dcp), upstream, before in UPSTREAM_WORKSPACES:
        assert align_mla_chunked_context_workspace_size(w, seqs, block, dcp) == upstream
        assert chunked_context_workspace_size(w, seqs, block, dcp, FIXED) == upstream
        assert align_mla_chunked_context_workspace_size(w, seqs, block, dcp, b38e111d) == before
    # the property states what upstream guarantees, and the dropped term breaks it
    c = case([1], workspace_size=1, max_num_seqs=4, block_size=2, dcp_world_size=2, dcp_interleave=1)
    workspace_size_is_aligned(c, FIXED)
    with pytest.raises(PropertyViolation, match=r"expected < max\(W, A\) \+ A = 4 .*got 8"):
        workspace_size_is_aligned(c, b38e111d)


# -- note 1.7: the old behaviour's failing inputs ----------------------------------------------

def test_old_dcp_chunk_not_a_multiple_of_the_virtual_block() -> None:
    old = old_plan(DCP_MISALIGNED_CASE)
    assert (old.max_context_chunk, old.local_chunk_size) == (320, 192)  # round_down(341, 64); cdiv(320, 128) * 64
    first = old.chunks[0]
    assert first.cu_seq_lens[-1] == 960 and first.num_local_context_tokens == 576
    with pytest.raises(PropertyViolation, match=r"expected 960 \(cu_seq_lens\[-1\]\), got 1152"):
        reorg_kvcache_by_chunk_index(rank_buffers(first, DCP_MISALIGNED_CASE.dcp), None, first.padded_local_seq_lens,
                                     first.local_context_lens_allranks, 960, first.max_seq_len, 192, 0, 576)
    assert new_plan(DCP_MISALIGNED_CASE) is not None  # the new planner handles it (see the DCP properties)


def test_old_reorg_cannot_be_reused_with_the_new_plan() -> None:
    """The 4th chunk of [3000, 200, 200] starts requests 1-2 at 0; `3 * 512` drops all their rows."""
    ch = new_plan(DCP_BUDGET_CASE).chunks[3]
    buffers = rank_buffers(ch, DCP_BUDGET_CASE.dcp)
    out, _ = reorg_kvcache_by_chunk_index(buffers, None, ch.padded_local_seq_lens, ch.local_context_lens_allranks,
                                          400, 200, chunk_size=512, chunk_idx=3, toks=256, strict=False)
    assert out.shape[0] == 0
    with pytest.raises(PropertyViolation, match=r"expected 400 \(cu_seq_lens\[-1\]\), got 0"):
        reorg_kvcache_by_chunk_index(buffers, None, ch.padded_local_seq_lens, ch.local_context_lens_allranks,
                                     400, 200, chunk_size=512, chunk_idx=3, toks=256)


def test_old_planner_asserts_on_too_many_context_prefills() -> None:
    with pytest.raises(ConfigError, match="max_context_chunk"):
        plan_uniform_context_chunks([64] * 17, 1024, 64)
    md = build_mla_chunked_context_metadata([64] * 17, query_start_loc_of([1] * 17), 1024, 64)
    assert len(md.chunks) == 2  # the new planner only needs W >= alignment


def test_old_cut_off_drops_a_later_requests_context() -> None:
    old = old_plan(CONTEXT_ORDER_CASE)
    assert old.prefill_tokens_with_context == 4  # qsl[n_ctx] = qsl[1]: request 1's tokens 4..7 are past it
    c = CONTEXT_ORDER_CASE
    before, after = run_case(c, PRE), run_case(c, FIXED)
    suffix_out, _ = suffix_attention(make_mla_prefill_inputs(c.context_lens, c.query_lens, c.shape, c.seed))
    assert np.array_equal(before.output[4:], suffix_out[4:])  # the context partial was computed, then ignored
    assert np.isfinite(before.context_output[4:]).all()
    assert not np.allclose(after.output[4:], suffix_out[4:], atol=1e-3)


def test_the_backend_correctness_batch_itself_breaks_the_old_cut_off() -> None:
    """n_ctx = 4, so prefill_tokens_with_context = qsl[4] = 64: request 4 (tokens 64..79, context 80) is cut off."""
    assert old_plan(BACKEND_CASE).prefill_tokens_with_context == 64
    with pytest.raises(PropertyViolation, match=r"attention output of token 64 \(request 4, context 80\)"):
        chunked_prefill_matches_full_attention(BACKEND_CASE, PRE)
    chunked_prefill_matches_full_attention(BACKEND_CASE, FIXED)


def test_kimi_k3_non_continuation_chunks_are_written_in_place() -> None:
    """With an `out=` backend the chunks whose only step is one copy of their own tokens write in place."""
    md = new_plan(KIMI_K3_CASE)
    ops = mla_accumulation_schedule(md)
    in_place = [ch.index for ch in md.chunks
                if [(op.kind, op.token_start, op.token_end) for op in ops if op.chunk == ch.index]
                == [("copy", ch.token_slice.start, ch.token_slice.stop)]]
    assert in_place == [ch.index for ch in md.chunks if not ch.is_continuation] == [0, 2]


def test_new_plan_can_take_more_chunks_than_the_old_one_across_context_free_prefills() -> None:
    """Not an upstream case: a context-free prefill ends a per-request chunk, the uniform columns do not."""
    c = case([16, 0, 16, 0, 16])
    assert len(new_plan(c).chunks) == 3 and len(old_plan(c).chunks) == 1


def test_uniform_metadata_shapes() -> None:
    md = build_uniform_chunked_context_metadata([512, 16], query_start_loc_of([2, 3]), 512, 16)
    assert md.max_context_chunk == 256 and len(md.chunks) == 2
    assert md.chunks[1].seq_lens == (256, 0) and md.chunks[1].has_empty_context


def test_dcp_without_block_alignment_aligns_splits_to_the_interleave_only():
    """Found by `kvsim conform vllm` (0.33.0): under DCP with align_chunk_to_block=False upstream aligns the splits
    to lcm(1, world * interleave), not to the block size. [3000, 309, 77, 0], workspace 128, block 64, DCP (2, 1)."""
    dcp = DcpConfig(2, 1)
    metadata = build_mla_chunked_context_metadata([3000, 309, 77, 0], query_start_loc_of([1, 1, 1, 1]), 128, 64,
                                                  dcp=dcp, align_chunk_to_block=False)
    aligned = build_mla_chunked_context_metadata([3000, 309, 77, 0], query_start_loc_of([1, 1, 1, 1]), 128, 64,
                                                 dcp=dcp, align_chunk_to_block=True)
    starts = [s for chunk in metadata.chunks for s in chunk.starts]
    assert all(s % 2 == 0 for s in starts) and any(s % 64 for s in starts)
    assert all(s % 64 == 0 for chunk in aligned.chunks for s in chunk.starts)
