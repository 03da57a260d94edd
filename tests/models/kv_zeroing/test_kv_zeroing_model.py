"""Model of vLLM's KVBlockZeroer (d6af803): pinned upstream numbers, assertions, both variants."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvsim.engine.canon import to_jsonable
from kvsim.engine.errors import ConfigError
from kvsim.models.kv_zeroing import DESCRIPTOR, FIXED, VARIANTS, ZeroingVariant
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry, KVCacheGroup, KVView, owned_bytes
from kvsim.models.kv_zeroing.layouts import (deepseek_v4_geometry, dense_layout, last_block_page_geometry,
                                             non_uniform_pages_geometry, overlaid_groups_geometry, packed_layout,
                                             with_mamba_state)
from kvsim.models.kv_zeroing.zeroer import (KVBlockZeroer, LaunchConfig, Segment, SegmentTable, launch_config,
                                            plan_segments, write_spans, zero_blocks)

DSV4_ROW, DSV4_PAGE, DSV4_ALLOCATION = 149_760, 37_376, 14_976_000
PRE = VARIANTS["pre_d6af803"]


def _int32_rows(memory: np.ndarray, arena: Arena, rows: int) -> np.ndarray:
    base = arena.bases[0]
    return memory[base:base + arena.sizes[0]].view(np.int32).reshape(rows, -1)


# --- test_packed_segment_zeros_only_its_last_block_page --------------------------------------------

def test_last_block_page_hand_built_segment_clears_only_its_page() -> None:
    backing = np.ones((4, 12), dtype=np.int32)
    memory = backing.view(np.uint8).reshape(-1)
    table = SegmentTable((Segment(addr=3 * 4, block_stride=12, page=4),), num_blocks=4)
    assert launch_config(table) == LaunchConfig(block_size=4, max_chunks=1, n_segs=1)  # upstream _meta
    zero_blocks(memory, table, [3])
    expected = np.ones((4, 12), dtype=np.int32)
    expected[3, 3:7] = 0
    assert np.array_equal(backing, expected)


def test_last_block_page_old_semantics_write_three_words_past_the_end() -> None:
    old = SegmentTable((Segment(addr=3 * 4, block_stride=12, page=12),), num_blocks=4, variant=PRE)
    assert write_spans(old, [3]) == [(156, 204)]  # 12 words from word 39; the backing ends at word 48
    with pytest.raises(ConfigError, match=r"up to byte 204.*192 bytes"):
        zero_blocks(np.ones(192, dtype=np.uint8), old, [3])


@pytest.mark.parametrize("variant, cleared_in_bounds, past_end", [(FIXED, 4, 0), (PRE, 9, 3)], ids=str)
def test_last_block_page_from_the_planner(variant: ZeroingVariant, cleared_in_bounds: int, past_end: int) -> None:
    geometry = last_block_page_geometry()
    zeroer = KVBlockZeroer(geometry, variant)
    arena = zeroer.arena
    seg, = zeroer.table.segments
    assert (seg.addr - arena.bases[0], seg.block_stride, seg.page) == (12, 12, 4 if variant is FIXED else 12)
    memory = np.full(arena.size, 1, dtype=np.uint8)
    zeroer.zero_block_ids(memory, [3])
    inside = memory[arena.bases[0]:arena.bases[0] + 192]
    assert int((inside == 0).sum()) // 4 == cleared_in_bounds
    assert int((memory[arena.bases[0] + 192:] == 0).sum()) // 4 == past_end
    rows = _int32_rows(memory, arena, 4)
    assert (rows[3, 3:7] == 0).all() and (rows[:3] == 0x01010101).all()


# --- DeepSeek-V4 packed geometry (#50276 thread, #51288 CPU test) ---------------------------------

def test_deepseek_v4_fixed_plan_matches_the_cpu_geometry_test() -> None:
    geometry = deepseek_v4_geometry()
    assert geometry.allocations == (DSV4_ALLOCATION,)
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, arena=arena)
    assert {4 * s.block_stride for s in table.segments} == {DSV4_ROW}
    assert {4 * s.page for s in table.segments} == {DSV4_PAGE}
    assert [s.addr - arena.bases[0] for s in table.segments] == [0, 37_440, 74_880, 112_320]
    last_end = max(end for _, end in write_spans(table, [99])) - arena.bases[0]
    assert last_end == 14_975_936 <= DSV4_ALLOCATION
    memory = np.ones(arena.size, dtype=np.uint8)
    zero_blocks(memory, table, [5])
    assert int((memory == 0).sum()) == 4 * DSV4_PAGE
    assert launch_config(table) == launch_config(table, FIXED)
    assert (launch_config(table).block_size, launch_config(table).max_chunks) == (1024, 10)


def test_deepseek_v4_old_plan_wipes_the_next_block_and_overflows() -> None:
    geometry = deepseek_v4_geometry()
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, PRE, arena=arena)
    assert {(4 * s.block_stride, 4 * s.page) for s in table.segments} == {(DSV4_ROW, DSV4_ROW)}
    memory = np.ones(arena.size, dtype=np.uint8)
    zero_blocks(memory, table, [5])
    block6 = memory[arena.bases[0] + 6 * DSV4_ROW:arena.bases[0] + 7 * DSV4_ROW]
    assert int((block6 == 0).sum()) == 112_320
    last_end = max(end for _, end in write_spans(table, [99])) - arena.bases[0]
    assert last_end - DSV4_ALLOCATION == 112_320
    config = launch_config(table)
    assert (config.block_size, config.max_chunks) == (64, 585)  # smallest power-of-two divisor of 37,440 words


# --- test_non_uniform_page_sizes, in-flight IDs, overlaid groups ------------------------------------

@pytest.mark.parametrize("variant", [FIXED, PRE], ids=str)
def test_non_uniform_page_sizes(variant: ZeroingVariant) -> None:
    geometry = non_uniform_pages_geometry()
    zeroer = KVBlockZeroer(geometry, variant)
    assert [s.page for s in zeroer.table.segments] == [10_496, 2_112]
    memory = np.full(zeroer.arena.size, 1, dtype=np.uint8)
    zeroer.zero_block_ids(memory, [1, 2])
    for index, words in enumerate((10_496, 2_112)):
        base = zeroer.arena.bases[index]
        rows = memory[base:base + 16 * words].reshape(4, -1)
        assert (rows[[0, 3]] == 1).all() and (rows[[1, 2]] == 0).all()


def test_consecutive_calls_keep_their_own_block_ids() -> None:
    """`test_block_ids_are_not_overwritten_while_copy_is_in_flight`: (4 blocks, 4 words), zero [1] then [2]."""
    geometry = dense_layout(num_blocks=4, kernel_block_size=1, heads=1, head_size=4, element_size=4, kv="none")
    zeroer = KVBlockZeroer(geometry)
    memory = zeroer.new_memory(fill=1)
    zeroer.zero_block_ids(memory, [1])
    zeroer.zero_block_ids(memory, [2])
    rows = memory[zeroer.arena.bases[0]:zeroer.arena.bases[0] + 64].reshape(4, 16)
    assert (rows[[0, 3]] == 1).all() and (rows[[1, 2]] == 0).all()


def test_overlaid_groups_merge_to_the_widest_page() -> None:
    geometry = overlaid_groups_geometry()
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, arena=arena)
    rows = [(s.addr - arena.bases[0], 4 * s.block_stride, 4 * s.page) for s in table.segments]
    # g0: 512- and 128-wide layers (pages 32,768 and 8,192 B); g1: one 1024-wide layer (65,536 B).
    assert rows == [(0, 65_536, 65_536), (32_768, 65_536, 8_192)]
    assert table.segments[0].layers == ("g0.0", "g1.0")


def test_overlaid_layers_with_different_strides_are_rejected() -> None:
    geometry = overlaid_groups_geometry()
    narrow = KVView(layer="other", allocation=0, offset=0, shape=(2, 64, 4), strides=(256, 4, 1), element_size=1)
    geometry = KVCacheGeometry(geometry.allocations, geometry.groups, geometry.views + (narrow,))
    with pytest.raises(ConfigError) as info:
        plan_segments(geometry)
    assert info.value.field.startswith("segment at address") and "one block stride" in info.value.expected


# --- virtual block splitting, K/V outer, Mamba ----------------------------------------------------

def test_kv_outer_with_ratio_gives_a_segment_per_half_and_kernel_block() -> None:
    geometry = dense_layout(num_blocks=3, kernel_block_size=2, heads=2, head_size=4, element_size=2, ratio=2,
                            kv="outer", block_padding=4)
    arena = Arena.for_geometry(geometry)
    base = arena.bases[0]
    fixed = [(s.addr - base, s.block_stride, s.page) for s in plan_segments(geometry, arena=arena).segments]
    assert fixed == [(0, 18, 8), (36, 18, 8), (216, 18, 8), (252, 18, 8)]  # V starts 6 kernel blocks of 36 B on
    old = [(s.addr - base, s.block_stride, s.page)
           for s in plan_segments(geometry, PRE, arena=arena).segments]
    assert old == [(0, 18, 18), (216, 18, 18)]  # one page spanning both kernel blocks and their padding


def test_single_kernel_block_kv_outer_page_spans_k_and_v_as_upstream() -> None:
    """With one kernel block, stride(0) == stride(block_dim), so K/V is not an "outer" dimension and its
    extent lands in the page. vLLM plans it so (no release checks page <= stride; `kvsim conform vllm` found
    that the model refused it), and clears exactly the block's K and V."""
    geometry = dense_layout(num_blocks=1, kernel_block_size=1, heads=1, head_size=4, element_size=4, kv="outer")
    (seg,) = plan_segments(geometry).segments
    assert (seg.block_stride, seg.page) == (4, 8)  # K and V of the only block
    zeroer = KVBlockZeroer(geometry)
    memory = zeroer.new_memory(fill=7)
    zeroer.zero_block_ids(memory, [0])
    base = zeroer.arena.bases[0]
    assert (memory[base:base + 32] == 0).all() and (memory[:base] == 7).all() and (memory[base + 32:] == 7).all()
    old = plan_segments(geometry, PRE)
    assert [s.page for s in old.segments] == [4]  # the old plan clears K and leaves V stale


def test_mamba_state_is_not_zeroed() -> None:
    geometry = with_mamba_state(packed_layout(num_blocks=2, kernel_block_size=1, widths=(4,), element_size=4), 3)
    zeroer = KVBlockZeroer(geometry)
    assert [s.layers for s in zeroer.table.segments] == [("layer0",)]
    memory = zeroer.new_memory(fill=7)
    zeroer.zero_block_ids(memory, [0, 1])
    mamba = zeroer.arena.bases[1]
    assert (memory[mamba:mamba + 24] == 7).all()


def test_virtual_splitting_zeroes_kernel_blocks_not_padding() -> None:
    geometry = packed_layout(num_blocks=2, kernel_block_size=1, widths=(1,), element_size=4, ratio=3, row_padding=4)
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, arena=arena)
    assert len(table.segments) == 3 and table.num_blocks == 2
    spans = [(a - arena.bases[0], b - arena.bases[0]) for a, b in write_spans(table, [1])]
    assert spans == [(24, 28), (32, 36), (40, 44)]  # kernel blocks 3, 4, 5 of 8-byte rows, 4 bytes each
    mask = np.zeros(arena.size, dtype=bool)
    for a, b in write_spans(table, [1]):
        mask[a:b] = True
    assert np.array_equal(mask, owned_bytes(geometry, arena, [1]))


# --- upstream assertions as ConfigError ----------------------------------------------------------

def _packed(**changes: object) -> KVCacheGeometry:
    view = KVView(layer="x", allocation=0, offset=0, shape=(4, 2, 4), strides=(8, 4, 1), element_size=4)
    view = KVView(**{**to_jsonable(view), "shape": view.shape, "strides": view.strides, **changes})
    return KVCacheGeometry((4096,), (KVCacheGroup(2, 1),), (view,))


@pytest.mark.parametrize("geometry, field, expected", [
    (KVCacheGeometry((4096,), (KVCacheGroup(3, 2),), _packed().views), "groups[0].block_size", "multiple of kernel"),
    (_packed(shape=(3, 2, 4)), "views[0] (x).shape[0]", "multiple of ratio=2"),
    (_packed(element_size=1, strides=(10, 4, 1), shape=(4, 2, 2)), "views[0] (x).strides[0]", "multiple of 4"),
    (_packed(element_size=2, strides=(4, 3, 1), shape=(4, 1, 3)), "views[0] (x) page span", "multiple of 4 bytes"),
    (_packed(element_size=2, offset=2, strides=(8, 4, 1), shape=(4, 2, 2)), "views[0] (x) segment address",
     "multiple of 4"),
])
def test_planner_assertions_raise_config_errors(geometry: KVCacheGeometry, field: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_segments(geometry)
    assert info.value.field == field and expected in info.value.expected
    assert str(info.value.received)


def test_pre_fix_planner_lacks_the_new_assertions() -> None:
    geometry = KVCacheGeometry((4096,), (KVCacheGroup(3, 2),), _packed().views)
    assert plan_segments(geometry, PRE).segments[0].page == 8  # floor ratio 1, no complaint
    misaligned = _packed(element_size=2, offset=2, strides=(8, 4, 1), shape=(4, 2, 2))
    assert plan_segments(misaligned, PRE).segments[0].addr % 4 == 2


@pytest.mark.parametrize("build, field", [
    (lambda: KVView("a", 0, 3, (2, 2), (2, 1), 2), "view a.offset"),
    (lambda: KVView("a", 0, 0, (2, 2), (2, 1), 3), "view a.element_size"),
    (lambda: KVView("a", 0, 0, (2, 2), (2,), 4), "view a.strides"),
    (lambda: KVView("a", 0, 0, (2, 2), (2, 1), 4, block_dim=2), "view a.block_dim"),
    (lambda: KVView("a", 0, 0, (2, 2), (2, 1), 4, kind="ssm"), "view a.kind"),
    (lambda: KVCacheGroup(1, 2), "kernel_block_size"),
    (lambda: KVCacheGeometry((15,), (KVCacheGroup(1, 1),), (KVView("a", 0, 0, (2, 2), (2, 1), 4),)), "views[0] (a)"),
    (lambda: SegmentTable((Segment(0, 1, 1),), 2, variant="pre_d6af803"), "variant"),  # a name is not a record
])
def test_invalid_inputs_are_rejected_at_construction(build, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field


def test_block_ids_are_checked_against_num_blocks() -> None:
    zeroer = KVBlockZeroer(deepseek_v4_geometry(num_blocks=2))
    with pytest.raises(ConfigError, match=r"block_ids\[1\]: expected an integer <= 1, got 2"):
        zeroer.zero_block_ids(zeroer.new_memory(), [0, 2])


def test_warmup_zeroes_block_zero_only_when_there_are_blocks() -> None:
    zeroer = KVBlockZeroer(packed_layout(num_blocks=3, kernel_block_size=1, widths=(2,), element_size=4))
    memory = zeroer.new_memory(fill=9)
    zeroer.warmup(memory, 0)
    assert (memory == 9).all()
    zeroer.warmup(memory, 3)
    assert np.array_equal(memory == 0, owned_bytes(zeroer.geometry, zeroer.arena, [0]))


def test_geometry_round_trips_through_json_and_plans_deterministically() -> None:
    geometry = overlaid_groups_geometry()
    again = KVCacheGeometry.from_jsonable(to_jsonable(geometry))
    assert again == geometry
    assert plan_segments(again) == plan_segments(geometry)


# --- the variant record: one flag per d6af803 change, each read where that change touched -------------

def test_descriptor_and_variant_table() -> None:
    assert DESCRIPTOR.name == "kv-zeroing" and DESCRIPTOR.variants is VARIANTS
    assert "d6af803" in DESCRIPTOR.source and DESCRIPTOR.system is None and DESCRIPTOR.simulate is None
    assert VARIANTS.names == ("fixed", "pre_d6af803", "first_view_overlaid") and FIXED is VARIANTS.fixed
    assert DESCRIPTOR.variant("pre_d6af803") is PRE
    assert all(FIXED.flags().values()) and not any(PRE.flags().values())
    with pytest.raises(ConfigError):
        DESCRIPTOR.variant("pre_fix")
    table = plan_segments(last_block_page_geometry(), PRE)
    assert table.variant is PRE and to_jsonable(table)["variant"] == "pre_d6af803"


def _only(flag: str, value: bool) -> ZeroingVariant:
    """The fixed record with one flag set to its pre-d6af803 value (or the pre record with one fixed flag)."""
    base = FIXED if not value else PRE
    return replace(base, name=f"{base.name}+{flag}={value}", **{flag: value})


def test_whole_kernel_blocks_flag_guards_the_ratio_assertions() -> None:
    geometry = KVCacheGeometry((4096,), (KVCacheGroup(3, 2),), _packed().views)
    assert plan_segments(geometry, _only("whole_kernel_blocks", False)).num_blocks == 4  # floor ratio 1
    uneven = _packed(shape=(3, 2, 4))
    with pytest.raises(ConfigError, match=r"shape\[0\]"):
        plan_segments(uneven, _only("whole_kernel_blocks", True))
    assert plan_segments(uneven, _only("whole_kernel_blocks", False)).num_blocks == 1


def test_separate_stride_flag_is_the_packed_stride_fix() -> None:
    geometry = deepseek_v4_geometry(num_blocks=2)

    def rows(variant: ZeroingVariant) -> set[tuple[int, int]]:
        return {(4 * s.block_stride, 4 * s.page) for s in plan_segments(geometry, variant).segments}

    assert rows(_only("separate_stride", False)) == {(DSV4_ROW, DSV4_ROW)}  # the page doubles as the stride
    assert rows(_only("separate_stride", True)) == {(DSV4_ROW, DSV4_PAGE)}


def test_merge_overlaid_flag_replaces_the_data_ptr_dedupe() -> None:
    geometry = overlaid_groups_geometry()
    arena = Arena.for_geometry(geometry)
    merged = plan_segments(geometry, _only("merge_overlaid", True), arena=arena)
    assert merged.segments[0].layers == ("g0.0", "g1.0")  # pre pages (whole rows), merged at one address
    skipped = plan_segments(geometry, _only("merge_overlaid", False), arena=arena)
    assert [s.layers for s in skipped.segments] == [("g0.0",), ("g0.1",)]  # g1.0 shares g0.0's data_ptr
    assert [s.page for s in skipped.segments] == [8_192, 2_048]  # so its 1024-wide page is lost


def test_masked_launch_flag_chooses_the_launcher() -> None:
    table = plan_segments(deepseek_v4_geometry(num_blocks=2))
    # page 9,344 words = 128 x 73: the unmasked launcher takes the smallest power-of-two divisor
    assert launch_config(table, _only("masked_launch", False)) == LaunchConfig(128, 73, 4)
    assert launch_config(table, FIXED) == LaunchConfig(1024, 10, 4)
    assert launch_config(replace(table, variant=_only("masked_launch", False))) == LaunchConfig(128, 73, 4)


def test_a_views_block_offsets_are_worked_out_once_per_layout_and_cannot_be_changed() -> None:
    """`block_byte_offsets` is kept per layout (a plan asks it of every view for every block): the same read-only
    array for an equal layout, every byte of kernel block 0 in order."""
    view = KVView(layer="x", allocation=0, offset=0, shape=(2, 3, 2), strides=(2, 8, 1), element_size=2)
    offsets = view.block_byte_offsets()
    assert offsets.tolist() == [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35]
    assert replace(view, layer="y").block_byte_offsets() is offsets
    with pytest.raises(ValueError):
        offsets[0] = 5
