"""pd-staging pure functions: pinned upstream numbers and scenarios, properties on both variants, planted mutations."""

from dataclasses import replace

import pytest

from kvsim.app import catalog
from kvsim.engine.errors import ConfigError
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging import plan
from kvsim.models.pd_staging import ring as ring_model
from kvsim.models.pd_staging.layout import HeadReshard, HeadSliceParams, compute_head_slice_params, compute_staging_layout
from kvsim.models.pd_staging.plan import (StagingPlanConfig, StagingReq, compute_grid_segments, full_chunk_pages,
                                    grid_tokens, prefetch_plan, scatter_token_range, staging_prefix_accepted)
from kvsim.models.pd_staging.ring import Allocation, StagingAllocator, is_watermark_ready, merge_remote_watermark
from kvsim.models.pd_staging.variants import AFTER_05C7EBF, FIXED, IN_EVERY_RELEASE, VARIANTS, StagingVariant
from kvsim.properties.pd_staging.cases import (LLAMA_31_8B, SCENARIO_A, SCENARIO_A_EARLY, SCENARIO_B, SCENARIO_D,
                                               STAGED_A_DOWN, STAGED_A_UP)
from kvsim.properties.pd_staging.plan import staged_writes

PRE = VARIANTS["pre_05c7ebf"]

REG = catalog.load()
PROPS = {p.name: p for p in REG.properties_of("pd-staging")}
STAGING_PROPS = [n for n, p in PROPS.items() if not n.startswith(("status_", "all_reduce")) and not p.is_kernel]
BROKEN_BEFORE_FIX = ["non_last_sends_end_on_grid", "each_send_fits_one_slot", "sends_partition_suffix",
                     "scatter_rows_stay_in_suffix", "misaligned_decode_prefix_fails_room",
                     "staged_writes_stay_in_slot", "staged_writes_accepted"]
BUG = "sglang-05c7ebf-staging-slot-overrun"


def _spans(sends):
    return [(s.token_start, s.token_end, s.page_start, s.num_pages, s.chunk_idx, s.is_last) for s in sends]


# ---- pinned numbers -------------------------------------------------------------------------------------------

def test_grid_numbers():
    assert grid_tokens(256, 16) == 256 and full_chunk_pages(256, 16) == 16  # section 2.9 shared setup
    assert grid_tokens(None, 16) == 8192 and grid_tokens(None, 1) == 8192  # `or 8192`
    assert grid_tokens(300, 16) == 288  # floored to whole pages
    assert grid_tokens(8, 16) == 16  # at least one page
    assert grid_tokens(-1, 16) == 16  # chunking disabled: -1 // 16 = -1, so one page per slot
    cfg = StagingPlanConfig(1000, 0, 16, 256)
    assert (cfg.grid, cfg.full_chunk_pages, cfg.suffix_pages, cfg.num_chunks) == (256, 16, 63, 4)


def test_scenario_a_prefill_radix_hit():
    """D=0, L=1000, prefill hit 608: first batch ends at 864; prefetch asks 16, 16, 16, 15 pages."""
    fixed, old = SCENARIO_A.plan(FIXED), SCENARIO_A.plan(PRE)
    assert fixed.batch_ends == (864, 1000)
    assert fixed.prefetch == (StagingReq(0, 16), StagingReq(1, 16), StagingReq(2, 16), StagingReq(3, 15))
    assert _spans(fixed.sends) == [(0, 256, 0, 16, 0, False), (256, 512, 16, 16, 1, False),
                                   (512, 768, 32, 16, 2, False), (768, 1000, 48, 15, 3, True)]
    # old: one send of pages [0, 54) named chunk 0 (overruns slots 1-3), then pages [54, 63) named chunk 3
    assert _spans(old.sends) == [(0, 864, 0, 54, 0, False), (864, 1000, 54, 9, 3, True)]
    assert [c.start_send_idx for c in fixed.cursors] == [0, 768, 1000]
    assert [c.start_send_idx for c in old.cursors] == [0, 864, 1000]


def test_scenario_a_with_early_send():
    """The snapshot (608) is grid-floored to 512 on fixed; pre-05c7ebf never early-sends under staging."""
    fixed = SCENARIO_A_EARLY.plan(FIXED)
    assert fixed.cursors[1].early_send_prefix_end == 608
    assert [(s.token_start, s.token_end, s.early) for s in fixed.sends] == [
        (0, 256, True), (256, 512, True), (512, 768, False), (768, 1000, False)]
    assert _spans(SCENARIO_A_EARLY.plan(PRE).sends) == _spans(SCENARIO_A.plan(PRE).sends)


def test_early_send_skips():
    cfg = StagingPlanConfig(1000, 0, 16, 256)
    snap = plan.snapshot_early_send_prefix_end(plan.initial_cursor(cfg), 600)  # 600 is not page-aligned
    assert plan.early_send(cfg, snap)[1] == ()
    snap = plan.snapshot_early_send_prefix_end(plan.initial_cursor(cfg), 608)
    assert plan.early_send(cfg, snap, bootstrap_done=False)[1] == ()  # bootstrap pending
    assert plan.snapshot_early_send_prefix_end(snap, 992).early_send_prefix_end == 608  # written once
    assert plan.snapshot_early_send_prefix_end(plan.initial_cursor(cfg), 608, 700).early_send_prefix_end == 0
    past = replace(snap, start_send_idx=768)
    assert plan.early_send(cfg, past)[1] == ()  # not past the cursor


def test_scenario_b_decode_radix_hit_rows():
    """D=512: fixed scatters suffix slot 0 into rows [512, 768); before the fix into the cached rows [0, 256)."""
    sends = SCENARIO_B.plan(FIXED).sends
    assert _spans(sends) == [(512, 768, 0, 16, 0, False), (768, 1000, 16, 15, 1, True)]
    assert scatter_token_range(0, 16, 512, 16) == (512, 768)
    assert scatter_token_range(0, 16, 512, 16, PRE) == (0, 256)
    assert scatter_token_range(16, 15, 512, 16) == (768, 1008)


def test_scenario_d_non_aligned_prefix():
    assert not staging_prefix_accepted(SCENARIO_D.decode_prefix_len, 16)
    assert staging_prefix_accepted(SCENARIO_D.decode_prefix_len, 16, PRE)
    assert staging_prefix_accepted(512, 16)


def _writes(case, variant):
    return [(w.send, w.writer, w.slot, w.end_in_slot, w.slot_bytes, w.accepted) for w in staged_writes(case, variant)]


def test_scenario_a_staged_bytes_depend_on_tp_direction():
    """Section 2.5 item 1: with P_tp > D_tp the 54-page send exceeds the prefill buffer and the room fails;
    with P_tp < D_tp it fits the buffer, passes the rest-of-ring check and overruns slot 0 into slots 1-3."""
    assert _writes(STAGED_A_DOWN, FIXED)[:2] == [(0, 0, 0, 2048, 4096, True), (0, 1, 0, 4096, 4096, True)]
    assert _writes(STAGED_A_DOWN, PRE)[:2] == [(0, 0, 0, 6912, 4096, False), (0, 1, 0, 8960, 4096, False)]
    assert all(w[-1] for w in _writes(STAGED_A_UP, FIXED))
    assert _writes(STAGED_A_UP, PRE) == [(0, 0, 0, 6912, 2048, True), (1, 0, 3, 1152, 1920, True)]
    assert layout.prefill_buffer_bytes(LLAMA_31_8B, 16, 16, 1, 2) == 2048  # one writer's share of a slot


def test_compute_grid_segments_numbers():
    assert compute_grid_segments(0, 864, 0, 256) == ((0, 256), (256, 512), (512, 768), (768, 864))
    assert compute_grid_segments(600, 1000, 512, 256) == ((600, 768), (768, 1000))
    assert compute_grid_segments(768, 768, 0, 256) == ((768, 768),)  # metadata-only last chunk
    assert prefetch_plan(63, 16)[-1] == StagingReq(3, 15) and prefetch_plan(0, 16) == ()


def test_llama_31_8b_resharding():
    """H=8, prefill TP 4 -> decode TP 2: src_per 2, dst_per 4, W 2.

    Prefill rank r lands at local head (2r) % 4 of decode rank r // 2, as writer r % 2.
    """
    cfg = LLAMA_31_8B
    assert (cfg.src_per, cfg.dst_per, cfg.num_writers) == (2, 4, 2)
    for r in range(4):
        assert cfg.prefill_heads(r) == (2 * r, 2 * r + 1)
        assert r in cfg.writer_ranks(r // 2)
        assert compute_head_slice_params(8, 4, 2, r, r // 2) == HeadSliceParams(0, 2, (2 * r) % 4, r % 2, 2)
    assert cfg.decode_heads(1) == (4, 5, 6, 7)
    lay = compute_staging_layout(cfg, 0, tokens=256, num_layers=32, head_bytes=256)  # 256-token slot, bf16 x 128
    assert lay.writer_heads == (2, 2) and lay.writer_offsets == (0, 8 * 2**20)
    assert lay.total_bytes == 16 * 2**20  # a 1024 MB pool holds 64 such slots
    assert lay.region(1, 1, 31) == (16 * 2**20 - 131072, 16 * 2**20)  # writer 1's V of the last layer ends the slot
    assert lay.region(0, 1, 0) == (32 * 131072, 33 * 131072)  # V layer 0 follows the 32 K layers


def test_gqa_replication_cases():
    rep = HeadReshard(2, 8, 2)  # P_tp > H: four prefill ranks hold each head, all write it
    assert [p for _, p in layout.writers_of_decode_rank(rep, 1)] == [HeadSliceParams(0, 1, 0, w, 4) for w in range(4)]
    wide = HeadReshard(4, 8, 2)  # ranks 2r, 2r+1 share head r
    assert [p.dst_head_start for _, p in layout.writers_of_decode_rank(wide, 0)] == [0, 0, 1, 1]
    down = HeadReshard(2, 1, 4)  # D_tp > H: decode ranks 0,1 hold head 0 and 2,3 head 1
    assert [compute_head_slice_params(2, 1, 4, 0, d).src_head_start for d in range(4)] == [0, 0, 1, 1]
    assert [len(layout.writers_of_decode_rank(down, d)) for d in range(4)] == [1, 1, 1, 1]
    assert [compute_head_slice_params(8, 2, 4, d // 2, d).src_head_start for d in range(4)] == [0, 2, 0, 2]


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="prefill_tp: expected a divisor or a multiple of total_kv_heads=8, got 3"):
        HeadReshard(8, 3, 2)
    with pytest.raises(ConfigError, match="prefill_rank"):
        compute_head_slice_params(8, 4, 2, 3, 0)
    with pytest.raises(ConfigError, match="decode_prefix_len: expected an integer <= 999"):
        StagingPlanConfig(1000, 1000, 16)
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        StagingPlanConfig(1000, 0, 16, 0)
    with pytest.raises(ConfigError, match="--variant: expected one of fixed, pre_05c7ebf, sglang_0_5_23, proposed_per_dst_retry, got 'old'"):
        VARIANTS["old"]


def test_each_flag_is_one_05c7ebf_change_read_where_it_was_made():
    """Turning one flag of `fixed` off changes only the function that reads it."""
    own = [name for name in FIXED.flags() if name not in AFTER_05C7EBF + IN_EVERY_RELEASE]
    assert all(FIXED.flags()[n] for n in own) and not any(PRE.flags()[n] for n in own + list(AFTER_05C7EBF))
    assert all(v.flags()[n] for v in (FIXED, PRE) for n in IN_EVERY_RELEASE)
    assert not any(FIXED.flags()[n] for n in AFTER_05C7EBF)  # `fixed` is 05c7ebf: no later upstream change
    off = {name: StagingVariant("probe", **{**FIXED.flags(), name: False}) for name in own}
    assert plan.floor_non_last_end(864, 0, 16, 256, off["grid_floored_sends"]) == 864
    assert plan.floor_non_last_end(864, 0, 16, 256, off["grid_segmented_sends"]) == 768
    assert _spans(SCENARIO_A.plan(off["grid_segmented_sends"]).sends)[0] == (0, 768, 0, 48, 0, False)
    assert _spans(SCENARIO_A_EARLY.plan(off["early_send_under_staging"]).sends) == _spans(SCENARIO_A.plan(FIXED).sends)
    assert staging_prefix_accepted(500, 16, off["aligned_prefix_check"])
    assert scatter_token_range(0, 16, 512, 16, off["scatter_adds_decode_prefix"]) == (0, 256)
    assert plan.prefill_write_accepted(20, 4, 16, 0, 64, 8, off["slot_size_write_check"])
    assert not plan.prefill_write_accepted(20, 4, 16, 0, 64, 8, FIXED)


# ---- the ring ---------------------------------------------------------------------------------------------------

def test_ring_overcommit_and_watermark_numbers():
    ring = StagingAllocator(100)
    a, ring = ring.assign(60)
    b, ring = ring.assign(30)
    c, ring = ring.assign(50)  # 50 > 100 - 90: round 1 at [0, 50) while a is live there
    assert (a, b, c) == (Allocation(0, 0, 60, 0), Allocation(1, 60, 30, 0), Allocation(2, 0, 50, 1))
    assert not ring.ready(c) and ring.ready(a)
    ring = ring.free(1)
    assert ring.watermark == (0, 0) and not ring.ready(c)  # a is still the oldest
    ring = ring.free(0)
    assert ring.watermark == (1, 0) and ring.ready(c)
    assert ring.assign(101) == (None, ring)  # ALLOC_OVERSIZED
    with pytest.raises(ConfigError, match="alloc_id"):
        ring.free(0)  # freed at most once (S9)


def test_ring_stale_head_hazard_of_37166():
    """At 05c7ebf: free [0, 60), then 70 bytes wrap to round 1 at [0, 70) and wait on 70 <= 60 with nothing to free."""
    _, ring = StagingAllocator(100).assign(60)
    ring = ring.free(0)
    alloc, ring = ring.assign(70)
    assert alloc == Allocation(1, 0, 70, 1) and ring.watermark == (0, 60)
    assert not ring.ready(alloc) and ring.allocations == (alloc,)


def test_watermark_gate_and_merge():
    assert is_watermark_ready(0, 10**9, (0, 0))
    assert is_watermark_ready(2, 50, (2, 0)) and is_watermark_ready(2, 50, (1, 50))
    assert not is_watermark_ready(2, 51, (1, 50)) and not is_watermark_ready(3, 1, (1, 99))
    assert merge_remote_watermark((2, 10), (1, 90)) == (2, 10)  # a late WATERMARK never moves it back


# ---- properties on both variants, and the bug ------------------------------------------------------------------

@pytest.mark.parametrize("name", STAGING_PROPS)
def test_every_property_holds_on_fixed(name):
    result = run_property(PROPS[name], FIXED, max_examples=150, seed=0)
    assert result.status == "passed", result.message


@pytest.mark.parametrize("name", BROKEN_BEFORE_FIX)
def test_pre_fix_variant_fails_without_pinned_examples(name):
    result = run_property(PROPS[name], PRE, max_examples=500, seed=0, use_examples=False)
    assert result.status == "failed", name


@pytest.mark.parametrize("name", BROKEN_BEFORE_FIX)
def test_pinned_scenarios_fail_on_pre_fix(name):
    case = {"scatter_rows_stay_in_suffix": SCENARIO_B, "misaligned_decode_prefix_fails_room": SCENARIO_D,
            "staged_writes_stay_in_slot": STAGED_A_UP, "staged_writes_accepted": STAGED_A_DOWN}.get(name, SCENARIO_A)
    PROPS[name](case, FIXED)
    with pytest.raises(AssertionError):
        PROPS[name](case, PRE)


def test_bug_report_reproduces_fast_and_shrinks():
    result = reproduce(REG.bug(BUG), seed=0)
    assert result.reproduced and result.fixed_passes and result.ok
    assert result.seconds < 2.0
    case = result.counterexample["case"]
    assert case["prefill_hit"] > 0 and case["page_size"] == 1 and case["prompt_len"] <= 3
    assert "spanning slots 0..1" in result.message


# ---- planted mutations: properties true by construction on both variants can still fail ------------------------

def _fails(name, max_examples=300):
    result = run_property(PROPS[name], FIXED, max_examples=max_examples, seed=0, use_examples=False)
    return result.status == "failed"


def test_grid_property_fails_when_grid_rounds_up(monkeypatch):
    monkeypatch.setattr(plan, "grid_tokens", lambda cps, ps: -(-(cps or 8192) // ps) * ps if cps != -1 else ps)
    assert _fails("grid_is_whole_pages")


def test_prefetch_property_fails_when_the_partial_slot_is_dropped(monkeypatch):
    monkeypatch.setattr(plan, "prefetch_plan", lambda n, f: tuple(StagingReq(k, f) for k in range(n // f)))
    assert _fails("prefetch_covers_suffix")


def test_segments_property_fails_when_cut_from_start(monkeypatch):
    def from_start(start, end, prefix, grid):
        return tuple((a, min(end, a + grid)) for a in range(start, end, grid)) or ((start, start),)
    monkeypatch.setattr(plan, "compute_grid_segments", from_start)
    assert _fails("grid_segments_tile_range")


def test_last_send_property_fails_when_every_segment_is_last(monkeypatch):
    real = plan.send_batch

    def all_last(cfg, cursor, end, last, variant=FIXED, early=False):
        cursor, calls = real(cfg, cursor, end, last, variant, early)
        return cursor, tuple(replace(c, is_last=last) for c in calls)
    monkeypatch.setattr(plan, "send_batch", all_last)
    assert _fails("exactly_one_last_send")


def test_cursor_property_fails_when_curr_idx_drifts(monkeypatch):
    real = plan.send_batch

    def drift(cfg, cursor, end, last, variant=FIXED, early=False):
        new, calls = real(cfg, cursor, end, last, variant, early)
        return (replace(new, curr_idx=new.curr_idx + 1) if calls else new), calls
    monkeypatch.setattr(plan, "send_batch", drift)
    assert _fails("send_cursor_monotone")


def test_early_send_property_fails_when_snapshot_is_rewritten(monkeypatch):
    monkeypatch.setattr(plan, "snapshot_early_send_prefix_end",
                        lambda cursor, n, host=0: replace(cursor, early_send_prefix_end=max(0, n - host)))
    assert _fails("early_send_within_snapshot")


def _without_replication(h, p, d, pr, dr):
    real = compute_head_slice_params(h, p, d, pr, dr)
    cfg = HeadReshard(h, p, d)
    if p > d:
        return replace(real, dst_head_start=(pr * cfg.src_per) % cfg.dst_per)
    return replace(real, src_head_start=(dr * cfg.dst_per) % cfg.src_per)


def test_head_property_fails_without_gqa_replication_terms(monkeypatch):
    monkeypatch.setattr(layout, "compute_head_slice_params", _without_replication)
    result = run_property(PROPS["head_slices_cover_decode_heads"], FIXED, max_examples=300, seed=0)
    assert result.status == "failed" and "global heads" in result.message


def test_layout_property_fails_when_v_precedes_k(monkeypatch):
    real = layout.StagingLayout.region
    monkeypatch.setattr(layout.StagingLayout, "region", lambda self, w, kv, l: real(self, w, 1 - kv, l))
    assert _fails("staging_layout_tiles_slot")


def test_ring_bounds_property_fails_when_wrap_keeps_the_round(monkeypatch):
    real = StagingAllocator.assign

    def same_round(self, size):
        alloc, ring = real(self, size)
        if alloc is not None and alloc.round != self.round:
            alloc = replace(alloc, round=self.round)
            ring = replace(ring, round=self.round, allocations=ring.allocations[:-1] + (alloc,))
        return alloc, ring
    monkeypatch.setattr(StagingAllocator, "assign", same_round)
    assert _fails("ring_assign_in_bounds")


def test_s6_fails_when_the_gate_always_opens(monkeypatch):
    monkeypatch.setattr(ring_model, "is_watermark_ready", lambda r, end, wm: True)
    assert _fails("ready_allocations_never_overlap_older_rounds")


def test_watermark_properties_fail_when_an_empty_ring_resets_the_tail(monkeypatch):
    real = StagingAllocator.free

    def reset(self, alloc_id, variant=FIXED):
        ring = real(self, alloc_id, variant)
        return ring if ring.allocations else replace(ring, watermark=(ring.round, 0))
    monkeypatch.setattr(StagingAllocator, "free", reset)
    assert _fails("watermark_never_decreases")
    assert _fails("watermark_tracks_oldest_live")


def test_liveness_property_fails_when_free_forgets_the_watermark(monkeypatch):
    real = StagingAllocator.free
    monkeypatch.setattr(StagingAllocator, "free",
                        lambda self, i, variant=FIXED: replace(real(self, i, variant), watermark=self.watermark))
    assert _fails("freed_predecessors_make_ready")


def test_pre_fix_send_counts_pages_from_its_start_as_sglang_did():
    """`kvsim conform sglang` (0.5.13-0.5.17): a send covers len(req_to_token[start:end][::ps]) pages. With an
    unaligned decode prefix the model counted from D and sent one page too many after the first send, so its
    final flag never fired. L=1000, D=500, ps=16, cps=256: 1 + 16 + 15 pages, the last one final."""
    sends = plan.plan_room_sends(StagingPlanConfig(1000, 500, 16, 256), variant=VARIANTS["pre_05c7ebf"]).sends
    assert [(s.token_start, s.token_end, s.num_pages, s.is_last) for s in sends] == [
        (500, 512, 1, False), (512, 768, 16, False), (768, 1000, 15, True)]
    assert [s.page_start for s in sends] == [0, 1, 17]  # curr_idx reaches the 32 pages upstream sends
