"""Properties of the kv-zeroing model on both variants, the pinned cases, and the bug report."""

from __future__ import annotations

import json

import pytest

from kvsim.app.catalog import load
from kvsim.engine.errors import PropertyViolation
from kvsim.engine.runner import run_property
from kvsim.models.kv_zeroing import FIXED, VARIANTS
from kvsim.properties.kv_zeroing.cases import (DEEPSEEK_V4, LAST_BLOCK_PAGE, NON_UNIFORM_PAGES, OVERLAID_GROUPS,
                                               PINNED)
from kvsim.properties.kv_zeroing.zeroer import (logical_block_zeroes_its_kernel_blocks,
                                                overlaid_groups_get_the_widest_page, segments_stay_inside_allocations,
                                                zeroing_preserves_other_bytes)

MODEL = "kv-zeroing"
PRE = VARIANTS["pre_d6af803"]
BUG = "vllm-d6af803-packed-zeroing-stride"
PROPERTIES = ("zeroed_blocks_are_cleared", "zeroing_preserves_other_bytes", "segments_stay_inside_allocations",
              "segment_geometry_is_valid", "logical_block_zeroes_its_kernel_blocks",
              "zeroing_is_idempotent_and_order_free", "dense_layouts_zero_the_same_bytes",
              "overlaid_groups_get_the_widest_page")
# Properties the pre-fix planner breaks, and those it keeps (they hold on both variants by design).
# The shrunk counterexample of the bug report at seed 0 (unchanged since the report was catalogued).
MINIMAL_COUNTEREXAMPLE = {
    "block_ids": [0],
    "geometry": {"allocations": [8], "groups": [{"block_size": 1, "kernel_block_size": 1}],
                 "views": [{"allocation": 0, "block_dim": 0, "element_size": 4, "group": 0, "kind": "attention",
                            "layer": "layer0", "offset": 0, "shape": [1, 1, 1], "strides": [2, 1, 1]}]},
}
BROKEN_BEFORE_FIX = ("zeroing_preserves_other_bytes", "segments_stay_inside_allocations",
                     "segment_geometry_is_valid", "logical_block_zeroes_its_kernel_blocks")


def test_model_properties_and_bug_are_registered() -> None:
    registry = load()
    spec = registry.model(MODEL)
    assert spec.variants.names == ("fixed", "pre_d6af803", "first_view_overlaid")
    assert tuple(p.name for p in registry.properties_of(MODEL) if not p.is_kernel) == PROPERTIES
    assert all(p.doc for p in registry.properties_of(MODEL))
    bug = registry.bug(BUG)
    assert (bug.model, bug.variant, bug.property) == (MODEL, "pre_d6af803", "zeroing_preserves_other_bytes")
    assert "50276" in bug.source and "d6af803" in bug.source


@pytest.mark.parametrize("name", PROPERTIES)
def test_every_property_holds_on_the_fixed_variant(name: str) -> None:
    result = run_property(load().property(MODEL, name), FIXED, max_examples=40, seed=0)
    assert result.status == "passed", result.message
    assert result.examples >= 40


@pytest.mark.parametrize("name", BROKEN_BEFORE_FIX)
def test_hypothesis_finds_the_pre_fix_violation_without_pinned_examples(name: str) -> None:
    result = run_property(load().property(MODEL, name), PRE, max_examples=300, seed=0,
                          use_examples=False)
    assert result.status == "failed", f"{name} held on pre_d6af803 over {result.examples} examples"
    json.dumps(result.counterexample)  # plain JSON, ready for `kvsim repro --json`


@pytest.mark.parametrize("name", sorted(set(PROPERTIES) - set(BROKEN_BEFORE_FIX)))
def test_properties_the_fix_did_not_change_hold_before_it(name: str) -> None:
    result = run_property(load().property(MODEL, name), PRE, max_examples=30, seed=0)
    assert result.status == "passed", result.message


def test_bug_reproduces_minimally_and_the_fix_passes() -> None:
    registry = load()
    bug = registry.bug(BUG)
    prop = registry.property(MODEL, bug.property)
    before = run_property(prop, bug.variant, max_examples=bug.max_examples, seed=0, use_examples=False)
    assert before.status == "failed"
    assert before.seconds < 10  # about 0.2 s here; generous for a loaded CI machine
    assert before.counterexample["case"] == MINIMAL_COUNTEREXAMPLE  # shrunk: one layer, one block, one padding word
    assert "bytes changed outside blocks [0]: expected 0, got 4" in before.message
    after = run_property(prop, FIXED, max_examples=100, seed=0, use_examples=False)
    assert after.status == "passed", after.message


def test_pinned_last_block_page_numbers() -> None:
    with pytest.raises(PropertyViolation, match=r"got 32, 12 of them outside every allocation"):
        zeroing_preserves_other_bytes(LAST_BLOCK_PAGE, PRE)  # 5 foreign words in bounds + 3 past
    with pytest.raises(PropertyViolation, match=r"got 204 \(12 bytes out of bounds"):
        segments_stay_inside_allocations(LAST_BLOCK_PAGE, PRE)
    zeroing_preserves_other_bytes(LAST_BLOCK_PAGE, FIXED)


def test_pinned_deepseek_v4_numbers() -> None:
    # Blocks 5 and 99: each old zeroing clears row + 112,320 - 4 x 37,376 = 112,576 foreign bytes.
    with pytest.raises(PropertyViolation, match=r"got 225152, 112320 of them outside every allocation"):
        zeroing_preserves_other_bytes(DEEPSEEK_V4, PRE)
    with pytest.raises(PropertyViolation, match=r"got 15088320 \(112320 bytes out of bounds; 3 of 4 segments"):
        segments_stay_inside_allocations(DEEPSEEK_V4, PRE)
    with pytest.raises(PropertyViolation, match=r"expected 149504, got 262080"):
        logical_block_zeroes_its_kernel_blocks(DEEPSEEK_V4, PRE)
    segments_stay_inside_allocations(DEEPSEEK_V4, FIXED)


def test_pinned_non_uniform_pages_hold_on_both_variants() -> None:
    for variant in (FIXED, PRE):  # dense buffers: page == stride, the fix changes nothing
        zeroing_preserves_other_bytes(NON_UNIFORM_PAGES, variant)
        logical_block_zeroes_its_kernel_blocks(NON_UNIFORM_PAGES, variant)


def test_pinned_overlaid_groups() -> None:
    overlaid_groups_get_the_widest_page(OVERLAID_GROUPS, FIXED)
    zeroing_preserves_other_bytes(OVERLAID_GROUPS, FIXED)
    # The old plan covers the widest page too (its page is the whole row) but, from g0's second layer at
    # 32,768 B, also clears the first half of the next row: blocks 0 and 3 give 2 x 32,768 foreign bytes.
    overlaid_groups_get_the_widest_page(OVERLAID_GROUPS, PRE)
    with pytest.raises(PropertyViolation, match=r"got 65536, 32768 of them outside every allocation"):
        zeroing_preserves_other_bytes(OVERLAID_GROUPS, PRE)


def test_pinned_examples_are_attached() -> None:
    prop = load().property(MODEL, "zeroing_preserves_other_bytes")
    assert prop.examples == PINNED
    result = run_property(prop, PRE, max_examples=1, seed=0)  # the first pinned case fails at once
    assert result.status == "failed" and result.examples == 1


def test_strategies_reach_the_shapes_where_the_bug_lives() -> None:
    from hypothesis import Phase, find, settings

    from kvsim.models.kv_zeroing.zeroer import plan_segments as plan
    from kvsim.properties.kv_zeroing.strategies import ZEROING_CASES

    def packed_with_offset_and_padding(case) -> bool:  # type: ignore[no-untyped-def]
        return any(v.offset > 0 and v.block_stride_bytes > v.extent_bytes - (v.shape[0] - 1) * v.block_stride_bytes
                   for v in case.geometry.views)

    checks = {
        "a packed layer at an offset, padding in its row": packed_with_offset_and_padding,
        "virtual block splitting (ratio > 1)": lambda c: any(g.ratio > 1 for g in c.geometry.groups),
        "several segments": lambda c: len(plan(c.geometry).segments) >= 3,
        "the last of several blocks": lambda c: 1 < c.geometry.num_blocks == max(c.block_ids) + 1,
        "several allocations": lambda c: len(c.geometry.allocations) >= 2,
    }
    for what, predicate in checks.items():
        assert find(ZEROING_CASES, predicate, settings=settings(max_examples=300, database=None,
                                                               phases=(Phase.generate,))), what


def test_layout_strategies_are_public_and_plan_on_the_fixed_variant() -> None:
    """The layout families gpu_oracle reuses draw geometries the fixed planner accepts, at any block count."""
    from hypothesis import Phase, find, given, settings, strategies as st

    from kvsim.models.kv_zeroing.zeroer import plan_segments
    from kvsim.properties.kv_zeroing import strategies

    families = (strategies.packed_geometries, strategies.dense_geometries, strategies.overlaid_geometries,
                strategies.layout_geometries)

    @settings(max_examples=60, database=None, derandomize=True)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        num_blocks = data.draw(st.integers(1, 5))
        family = data.draw(st.sampled_from(families))
        geometry = data.draw(family(num_blocks))
        assert plan_segments(geometry, FIXED).num_blocks == num_blocks == geometry.num_blocks
        ids = data.draw(strategies.block_id_lists(num_blocks, min_size=0, max_size=6))
        assert len(ids) <= 6 and all(0 <= b < num_blocks for b in ids)

    check()
    # the width knob reaches pages the default never draws (widths of at most 3 units of at most 4 elements)
    wide = find(strategies.packed_geometries(2, max_width=40), lambda g: max(v.shape[-1] for v in g.views) > 12,
                settings=settings(max_examples=300, database=None, phases=(Phase.generate,)))
    assert max(v.shape[-1] for v in wide.views) > 12


def test_listing_and_registering_never_import_hypothesis() -> None:
    import subprocess
    import sys

    code = ("import sys; from kvsim.engine.registry import Registry; import kvsim.models.kv_zeroing as m; "
            "import kvsim.properties.kv_zeroing as p; r = Registry(); r.add_model(m.DESCRIPTOR); p.register(r); "
            "assert len([q for q in r.properties_of('kv-zeroing') if not q.is_kernel]) == 8 and r.bugs; "
            "assert 'hypothesis' not in sys.modules, 'hypothesis imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pattern_of_every_size_is_its_formula_and_read_only() -> None:
    """The fill is made once at the largest size asked and sliced: each size still gets byte i = (131 i + 7) % 251 + 1."""
    import numpy as np

    from kvsim.properties.kv_zeroing.zeroer import _pattern

    for size in (5, 300, 7, 5000, 300, 0):
        got = _pattern(size)
        assert got.dtype == np.uint8 and not got.flags.writeable and got.size == size
        assert got.tolist() == [(131 * i + 7) % 251 + 1 for i in range(size)]
