"""Planner, metadata and workspace of the mla-chunks model: unit tests, input validation, and planted mutations
that show the checks which hold by construction on `fixed` can fail."""

from __future__ import annotations

import dataclasses

import pytest

from kvsim.models.mla_chunks import metadata as metadata_module
from kvsim.app.catalog import load
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.runner import run_property
from kvsim.models.mla_chunks.planner import (FIXED, ContextChunkPlan, _largest_split,
                                             align_mla_chunked_context_workspace_size, check_counts,
                                             chunked_context_workspace_size, determine_chunked_prefill_workspace_size,
                                             plan_mla_context_chunks)
from kvsim.models.mla_chunks.variants import VARIANTS
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.metadata import (AccumulateOp, ContextChunk, build_context_metadata, build_mla_chunked_context_metadata,
                                 mla_accumulation_schedule, query_start_loc_of)
from kvsim.properties.mla_chunks.cases import CONTINUATION_CASE, MlaChunkCase, TAIL_SPLIT_CASE, case
from kvsim.properties.mla_chunks.plan import (check_accumulation_schedule, check_continuation, check_exact_tiling,
                                        check_no_empty_spans, check_token_bookkeeping, chunk_count_lower_bound,
                                        chunk_count_upper_bound, context_runs)

MODEL = "mla-chunks"
PRE = VARIANTS["pre_b38e111d"]
B38E111D = VARIANTS["b38e111d"]  # the seed commit, before vllm#51733 (never released)


def run(name: str, variant: str = "fixed", n: int = 40, pinned: bool = False):
    """Hypothesis has to find the failure itself unless `pinned` (the upstream cases run first)."""
    return run_property(load().property(MODEL, name), variant, max_examples=n, seed=0, use_examples=pinned)


# -- planner --------------------------------------------------------------------------------------

def test_planner_by_hand_with_alignment_one_packs_exactly() -> None:
    plans = plan_mla_context_chunks([5, 7, 3], row_budget=6, max_context_chunk=6, split_alignment=1)
    assert [(p.request_start, p.request_end, p.starts, p.seq_lens, p.is_continuation) for p in plans] == [
        (0, 2, (0, 0), (5, 1), False), (1, 2, (1,), (6,), True), (2, 3, (0,), (3,), False)]
    assert len(plans) == chunk_count_lower_bound([5, 7, 3], 6, per_run=True) == 3


def test_a_context_free_request_ends_the_chunk() -> None:
    plans = plan_mla_context_chunks([64, 0, 64], 1024, 1024, 16)
    assert [(p.request_start, p.request_end) for p in plans] == [(0, 1), (2, 3)]
    assert context_runs([64, 0, 64]) == [[0], [2]]
    assert chunk_count_lower_bound([64, 0, 64], 1024, per_run=False) == 1  # the global bound is not a bound here


def test_split_leaves_a_row_and_respects_the_padded_cost() -> None:
    # 17 rows, budget 16, alignment 16: the split is 16 and one row continues
    assert [p.seq_lens for p in plan_mla_context_chunks([17], 16, 16, 16)] == [(16,), (1,)]
    # DCP 2 x 4: virtual 8, alignment lcm(8, 8) = 8, budget 4 local rows = 8 global rows per chunk
    dcp = DcpConfig(2, 4)
    plans = plan_mla_context_chunks([20], 4, 8, 8, dcp.padded_rows)
    assert [(p.starts, p.seq_lens) for p in plans] == [((0,), (8,)), ((8,), (8,)), ((16,), (4,))]


@pytest.mark.parametrize("kwargs, field", [
    (dict(context_lens=[1, -1], row_budget=4, max_context_chunk=4, split_alignment=1), "context_lens[1]"),
    (dict(context_lens=[1], row_budget=0, max_context_chunk=4, split_alignment=1), "row_budget"),
    (dict(context_lens=[1], row_budget=4, max_context_chunk=0, split_alignment=1), "max_context_chunk"),
    (dict(context_lens=[1], row_budget=4, max_context_chunk=4, split_alignment=0), "split_alignment"),
    (dict(context_lens=[1], row_budget=True, max_context_chunk=4, split_alignment=1), "row_budget"),
    (dict(context_lens="12", row_budget=4, max_context_chunk=4, split_alignment=1), "context_lens"),
])
def test_planner_rejects_bad_input_naming_the_field(kwargs, field) -> None:
    with pytest.raises(ConfigError) as info:
        plan_mla_context_chunks(**kwargs)
    assert info.value.field == field


def test_planner_takes_the_arguments_upstream_plans() -> None:
    """Found by `kvsim conform vllm` (target plan_mla_context_chunks, free arguments): upstream asserts only
    max_context_chunk > 0 and split_alignment > 0; the model refused a chunk cap that is no multiple of the
    alignment, or below it, and a budget below 1, where upstream plans (or asserts only once a chunk is empty)."""
    assert [(p.starts, p.seq_lens) for p in plan_mla_context_chunks([20], 8, 6, 4)] == [
        ((0,), (4,)), ((4,), (4,)), ((8,), (4,)), ((12,), (8,))]  # splits capped at round_down(6, 4) = 4
    assert [(p.starts, p.seq_lens) for p in plan_mla_context_chunks([3], 4, 2, 4)] == [((0,), (3,))]  # it fits
    assert plan_mla_context_chunks([0, 0], -1, 4, 4) == []  # no context: nothing to fit
    with pytest.raises(ConfigError, match="row_budget: expected room for one aligned split"):
        plan_mla_context_chunks([9], 4, 2, 4)  # no split fits under a cap below the alignment


def test_planner_reports_a_budget_with_no_room_instead_of_looping() -> None:
    with pytest.raises(ConfigError, match="row_budget: expected room for one aligned split"):
        plan_mla_context_chunks([100], row_budget=3, max_context_chunk=16, split_alignment=16)


def test_context_chunk_plan_validates() -> None:
    with pytest.raises(ConfigError, match="request_end"):
        ContextChunkPlan(2, 2, (), (), False)
    with pytest.raises(ConfigError, match="starts/seq_lens"):
        ContextChunkPlan(0, 2, (0,), (1, 2), False)


def test_metadata_validates_its_inputs() -> None:
    with pytest.raises(ConfigError, match="query_start_loc"):
        build_mla_chunked_context_metadata([1, 2], [0, 3], 64, 16)
    with pytest.raises(ConfigError, match="query_lens\\[1\\]: expected an integer >= 1"):
        query_start_loc_of([1, 0])
    # the builder's constructor asserts W % world == 0; the function floors the per-rank budget (as upstream's)
    assert build_mla_chunked_context_metadata([1], [0, 1], 63, 16, dcp=DcpConfig(2)).chunks[0].seq_lens == (1,)
    with pytest.raises(ConfigError, match="workspace_size: expected >= split alignment 16"):
        build_mla_chunked_context_metadata([1], [0, 1], 8, 16)
    with pytest.raises(ConfigError, match="variant"):
        VARIANTS["pre_50613"]  # a name is resolved once, at the boundary, and an unknown one is refused
    with pytest.raises(ConfigError, match="dcp_interleave"):
        MlaChunkCase((1,), (1,), dcp_interleave=2)
    with pytest.raises(ConfigError, match="context_lens/query_lens"):
        MlaChunkCase((1, 2), (1,))


def test_workspace_sizes() -> None:
    assert determine_chunked_prefill_workspace_size(4096, 256, 16) == 32768
    assert determine_chunked_prefill_workspace_size(163840, 256, 64) == 65536
    assert align_mla_chunked_context_workspace_size(100, 8, 16) == 112  # round_up(100, 16): no max_num_seqs term
    assert align_mla_chunked_context_workspace_size(100, 8, 16, variant=B38E111D) == 128  # max_num_seqs * alignment
    assert chunked_context_workspace_size(8008, 1, 64, variant=PRE) == 8008  # old: no rounding
    assert chunked_context_workspace_size(8008, 1, 64, variant=FIXED) == 8064


def test_align_chunk_to_block_false_uses_alignment_one() -> None:
    md = build_context_metadata([37], [1], 32, 1, 16, align_chunk_to_block=False, variant=FIXED)
    assert [ch.seq_lens for ch in md.chunks] == [(32,), (5,)]
    md = build_context_metadata([37], [1], 32, 1, 16, variant=FIXED)
    assert [ch.seq_lens for ch in md.chunks] == [(32,), (5,)] and md.split_alignment == 16


def test_accumulation_schedule_by_hand() -> None:
    md = TAIL_SPLIT_CASE.metadata(FIXED)  # chunk 0: reqs 0-1 (tokens 0..8), chunk 1: reqs 1 (cont.) - 2
    assert mla_accumulation_schedule(md) == (
        AccumulateOp(0, "copy", 0, 8), AccumulateOp(1, "merge", 3, 8), AccumulateOp(1, "copy", 8, 15))
    single = case([16, 16]).metadata(FIXED)
    assert mla_accumulation_schedule(single) == (AccumulateOp(0, "copy", 0, 8),)  # the fast path
    old = case([512, 16], workspace_size=512).metadata(PRE)  # mcc 256: 2 columns over all tokens
    assert mla_accumulation_schedule(old) == (AccumulateOp(0, "copy", 0, 8), AccumulateOp(1, "merge", 0, 8))


def test_upper_bound_formula() -> None:
    # [960, 16 x 7], W 1024, A 16: one run of 1072 rows, each chunk may leave < 15 rows: 2 chunks
    assert chunk_count_upper_bound([960] + [16] * 7, 1024, 16, None) == 2
    assert chunk_count_upper_bound([5, 7, 3], 6, 1, None) == 3 == chunk_count_lower_bound([5, 7, 3], 6, True)
    assert chunk_count_upper_bound([100], 8, 8, DcpConfig(2, 4)) is None  # B - s <= 0: no bound


# -- the checks fail on planted mutations -------------------------------------------------------

def mutate(chunk, **fields):
    return dataclasses.replace(chunk, **fields)


def test_tiling_check_catches_dropped_duplicated_and_stray_rows() -> None:
    md = TAIL_SPLIT_CASE.metadata(FIXED)
    ctx = TAIL_SPLIT_CASE.context_lens
    check_exact_tiling(ctx, md.chunks)
    dropped = (md.chunks[0], mutate(md.chunks[1], starts=(272, 0), seq_lens=(240, 512)))
    with pytest.raises(PropertyViolation, match=r"start of request 1's piece in chunk 1: expected 256 .* got 272: "
                                                r"rows \[256, 272\) dropped"):
        check_exact_tiling(ctx, dropped)
    twice = (md.chunks[0], mutate(md.chunks[1], starts=(240, 0), seq_lens=(272, 512)))
    with pytest.raises(PropertyViolation, match=r"rows \[240, 256\) gathered twice"):
        check_exact_tiling(ctx, twice)
    with pytest.raises(PropertyViolation, match="rows gathered for request 2: expected 512, got 511"):
        check_exact_tiling(ctx, (md.chunks[0], mutate(md.chunks[1], seq_lens=(256, 511))))
    with pytest.raises(PropertyViolation, match="rows gathered for context-free request 1"):
        check_exact_tiling((16, 0), (mutate(md.chunks[0], seq_lens=(16, 4)),))
    with pytest.raises(PropertyViolation, match="span of request 1 in chunk 0: expected > 0 rows, got 0"):
        check_no_empty_spans((mutate(md.chunks[0], seq_lens=(768, 0)),))


def test_bookkeeping_and_continuation_checks_catch_wrong_fields() -> None:
    md = CONTINUATION_CASE.metadata(FIXED)
    qsl = CONTINUATION_CASE.query_start_loc
    check_token_bookkeeping(qsl, md.chunks)
    bad = [mutate(md.chunks[1], continuation_token_end=0), mutate(md.chunks[2], query_start_loc=(3, 8, 15)),
           mutate(md.chunks[2], token_to_seq=md.chunks[2].token_to_seq[::-1]), mutate(md.chunks[2], max_query_len=5),
           mutate(md.chunks[2], token_slice=slice(0, 15))]
    for wrong in bad:
        with pytest.raises(PropertyViolation):
            check_token_bookkeeping(qsl, (*md.chunks[:wrong.index], wrong, *md.chunks[wrong.index + 1:]))
    with pytest.raises(PropertyViolation, match="is_continuation of chunk 1: expected True"):
        check_continuation((md.chunks[0], mutate(md.chunks[1], is_continuation=False), md.chunks[2]))
    with pytest.raises(PropertyViolation, match="request continued by chunk 1"):
        check_continuation((md.chunks[2], md.chunks[1]))


def test_schedule_check_catches_a_copy_instead_of_a_merge() -> None:
    md = TAIL_SPLIT_CASE.metadata(FIXED)
    ops = mla_accumulation_schedule(md)
    check_accumulation_schedule(TAIL_SPLIT_CASE.context_lens, TAIL_SPLIT_CASE.query_start_loc, md.chunks, ops)
    wrong = tuple(dataclasses.replace(op, kind="copy") for op in ops)
    with pytest.raises(PropertyViolation, match=r"accumulation of token 3 \(request 1\): expected one copy before "
                                                r"any merge, got \['copy', 'copy'\]"):
        check_accumulation_schedule(TAIL_SPLIT_CASE.context_lens, TAIL_SPLIT_CASE.query_start_loc, md.chunks, wrong)


def _packing_across_runs(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows=None):
    """Mutation: drop the context-free requests, plan the rest as one run, map back (packs across runs)."""
    keep = [r for r, c in enumerate(context_lens) if c > 0]
    plans = plan_mla_context_chunks([context_lens[r] for r in keep], row_budget, max_context_chunk, split_alignment,
                                    padded_rows)
    out = []
    for p in plans:
        first, last = keep[p.request_start], keep[p.request_end - 1]
        span = list(range(first, last + 1))
        starts = [p.starts[keep.index(r) - p.request_start] if r in keep else 0 for r in span]
        lens = [p.seq_lens[keep.index(r) - p.request_start] if r in keep else 0 for r in span]
        out.append(ContextChunkPlan(first, last + 1, tuple(starts), tuple(lens), p.is_continuation))
    return out


def test_run_checks_fail_when_the_planner_packs_across_context_free_requests(monkeypatch) -> None:
    monkeypatch.setattr(metadata_module, "plan_mla_context_chunks", _packing_across_runs)
    assert run("chunk_count_meets_lower_bound").status == "failed"
    assert run("chunks_follow_request_order").status == "failed"
    assert run("chunks_have_no_empty_spans").status == "failed"


def test_plan_checks_fail_when_the_split_ignores_alignment(monkeypatch) -> None:
    real = plan_mla_context_chunks
    monkeypatch.setattr(metadata_module, "plan_mla_context_chunks",
                        lambda ctx, budget, mcc, alignment, pad=None: real(ctx, budget, mcc, 1, pad))
    result = run("chunk_starts_are_aligned")
    assert result.status == "failed" and "expected a multiple of" in result.message


def test_tiling_property_fails_on_an_off_by_one_split(monkeypatch) -> None:
    real = plan_mla_context_chunks

    def off_by_one(*args, **kwargs):  # a continuation skips its first row
        return [dataclasses.replace(p, starts=(p.starts[0] + 1, *p.starts[1:]),
                                    seq_lens=(p.seq_lens[0] - 1, *p.seq_lens[1:])) if p.is_continuation else p
                for p in real(*args, **kwargs)]

    monkeypatch.setattr(metadata_module, "plan_mla_context_chunks", off_by_one)
    result = run("chunks_tile_every_context_row_once")
    assert result.status == "failed" and ("dropped" in result.message or "rows gathered" in result.message)
    # the lost row depends on where the split falls, so the output now depends on the workspace and block size
    assert run("output_independent_of_workspace_block_and_alignment", n=30, pinned=True).status == "failed"
    assert run("chunked_prefill_matches_full_attention", n=30, pinned=True).status == "failed"


def test_empty_slice_property_and_numbers_fail_when_a_slice_is_dropped(monkeypatch) -> None:
    real = metadata_module.build_mla_chunked_context_metadata

    def drop_last_slice(*args, **kwargs):
        md = real(*args, **kwargs)
        return md if md is None else dataclasses.replace(md, empty_token_slices=md.empty_token_slices[:-1])

    monkeypatch.setattr(metadata_module, "build_mla_chunked_context_metadata", drop_last_slice)
    assert run("context_free_prefills_are_neutralised").status == "failed"
    # [64, 0, 64, 0]: the last context-free request's rows are never written (NaN)
    assert run("chunked_prefill_matches_full_attention", n=30, pinned=True).status == "failed"


def test_bookkeeping_and_numbers_fail_on_a_wrong_continuation_token_end(monkeypatch) -> None:
    real = metadata_module.build_mla_chunked_context_metadata

    def wrong_end(*args, **kwargs):
        md = real(*args, **kwargs)
        if md is None:
            return md
        chunks = tuple(dataclasses.replace(c, continuation_token_end=c.token_slice.stop) for c in md.chunks)
        return dataclasses.replace(md, chunks=chunks)

    monkeypatch.setattr(metadata_module, "build_mla_chunked_context_metadata", wrong_end)
    assert run("token_bookkeeping_matches_query_start_loc").status == "failed"
    assert run("accumulation_copies_once_then_merges").status == "failed"
    # [768, 512, 512]: chunk 1 copies request 1's continuation over its first part instead of merging
    assert run("chunked_prefill_matches_full_attention", n=30, pinned=True).status == "failed"


# -- fast paths: what the one-pass checks and the per-chunk fields give is what the entry-by-entry forms give ----

@pytest.mark.parametrize("values, bad", [([3, True], "counts[1]"), ([0, -1], "counts[1]"), ([2.0], "counts[0]"),
                                         ("12", "counts"), ((1, 2, None), "counts[2]")])
def test_check_counts_refuses_each_bad_entry_by_its_index(values, bad) -> None:
    with pytest.raises(ConfigError) as info:
        check_counts(values, "counts")
    assert info.value.field == bad


def test_check_counts_takes_int_subclasses_and_gives_a_tuple() -> None:
    import enum

    class Rows(enum.IntEnum):
        ONE = 1

    assert check_counts([0, 3, 1], "c") == (0, 3, 1) and check_counts([Rows.ONE], "c") == (Rows.ONE,)
    assert check_counts((), "c") == ()


@pytest.mark.parametrize("ctx, qsl, w, block", [((5, 3, 0, 9), (0, 0, 2, 3, 3), 4, 1), ((40, 0, 17), (0, 2, 3, 7), 16, 8),
                                               ((64, 64), (0, 1, 5), 32, 4)])
def test_chunk_fields_are_their_definitions(ctx, qsl, w, block) -> None:
    """Each chunk's counts as the upstream metadata defines them, recomputed from the plan entry by entry (a query
    of no token, qsl[i + 1] == qsl[i], is a row that is not active)."""
    md = build_mla_chunked_context_metadata(ctx, qsl, w, block)
    assert md.chunks
    for chunk in md.chunks:
        rs, re = chunk.request_slice.start, chunk.request_slice.stop
        assert chunk.num_context_tokens == sum(chunk.seq_lens)
        assert chunk.max_query_len == max(qsl[i + 1] - qsl[i] for i in range(rs, re))
        assert chunk.all_rows_active == (all(qsl[i + 1] > qsl[i] for i in range(rs, re)) and min(chunk.seq_lens) > 0)
        assert chunk.token_to_seq == tuple(k for k, n in enumerate(chunk.seq_lens) for _ in range(n))
        assert chunk.cu_seq_lens == tuple(sum(chunk.seq_lens[:k]) for k in range(re - rs + 1))
        assert chunk.query_start_loc == tuple(qsl[i] - qsl[rs] for i in range(rs, re + 1))
        assert chunk.max_seq_len == max(chunk.seq_lens)
        # the builder fills the record without its __init__: every field is there, and the record is the one
        # ContextChunk(...) makes of the same values
        values = {f.name: getattr(chunk, f.name) for f in dataclasses.fields(chunk)}
        assert chunk == metadata_module.ContextChunk(**values)
        assert repr(chunk) == repr(ContextChunk(**values))


def test_planned_plans_are_the_checked_records() -> None:
    """The planner builds its plans without the checks (`ContextChunkPlan.planned`): each is the record the
    checked constructor makes of the same values, request_end and is_continuation included."""
    for ctx, budget, mcc, alignment, pad in [([5, 7, 3], 6, 6, 1, None), ([17, 0, 40, 3], 16, 16, 8, None),
                                             ([20, 3], 8, 16, 8, DcpConfig(2, 4).padded_rows)]:
        plans = plan_mla_context_chunks(ctx, budget, mcc, alignment, pad)
        assert any(p.is_continuation for p in plans) and any(p.request_end - p.request_start > 1 for p in plans)
        for p in plans:
            checked = ContextChunkPlan(p.request_start, p.request_start + len(p.seq_lens), p.starts, p.seq_lens,
                                       p.starts[0] > 0)
            assert p == checked and repr(p) == repr(checked)


@pytest.mark.parametrize("alignment", [1, 3, 16])
def test_largest_split_of_unpadded_rows_is_the_search(alignment) -> None:
    """Without padding (`padded_rows` None) the split is computed at once; it is the binary search's answer over
    every start, remainder and budget (the search runs with the identity cost)."""
    for start in (0, alignment, 5 * alignment):
        for remainder in range(1, 6 * alignment + 2):
            for budget_left in range(-1, 6 * alignment + 2):
                for cap in (alignment, 2 * alignment + 1, 64):
                    assert _largest_split(start, remainder, budget_left, cap, alignment, None) == \
                        _largest_split(start, remainder, budget_left, cap, alignment, lambda rows: rows)
