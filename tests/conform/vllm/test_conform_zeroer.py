"""kvsim conform vllm --target KVBlockZeroer against the real vllm releases (cached wheels; a failed download fails)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from kvsim.conform import cli
from kvsim.conform.run import load_upstream
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.conform.vllm.zeroer import loading, upstream_plan
from kvsim.models.kv_zeroing.conform import UTILS as RELPATH
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import dense_layout
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.models.kv_zeroing.zeroer import plan_segments

ZEROER = "KVBlockZeroer"


def _target(**changes):  # type: ignore[no-untyped-def]
    return replace(select_targets("vllm", ZEROER)[0], **changes)


def _run(version, target=None, n=40):  # type: ignore[no-untyped-def]
    return run_target(target or _target(), resolve_source("vllm", version=version), RunOptions(max_examples=n))


def _props(result):  # type: ignore[no-untyped-def]
    return {p["property"]: p["status"] for p in result.properties}


def _zeroer_class(version):  # type: ignore[no-untyped-def]
    upstream = _target().upstream[0]
    return load_upstream(resolve_source("vllm", version=version), upstream, **loading(upstream, None)).KVBlockZeroer


def test_releases_map_to_their_planner_variant():
    target = _target()
    assert [target.variant_name(v) for v in ("0.27.1", "0.28.0", "0.28.1", "0.29.0", "0.32.0", "0.33.0", None)] == \
        ["pre_d6af803", "first_view_overlaid", "first_view_overlaid", "fixed", "fixed", "fixed", "fixed"]


# the properties the pinned cases make fail on each release (the seed bug before d6af803, the overlaid-page finding
# of 0.28.0); every other property holds on upstream's plans
FAILING = {"0.27.1": {"zeroing_preserves_other_bytes", "segments_stay_inside_allocations",
                      "logical_block_zeroes_its_kernel_blocks"},
           "0.28.0": {"zeroed_blocks_are_cleared", "logical_block_zeroes_its_kernel_blocks",
                      "overlaid_groups_get_the_widest_page"},
           "0.29.0": set(), "0.33.0": set()}


@pytest.mark.parametrize("version", sorted(FAILING))
def test_each_release_plans_exactly_as_its_model_variant(version):
    result = _run(version)
    variant = _target().variant_name(version)
    assert f"model variant {variant}" in result.note
    assert result.compared >= 40 and result.divergences == [], result.divergences
    failing = {name for name, status in _props(result).items() if status == "fails"}
    assert FAILING[version] <= failing and failing <= FAILING[version] | {"segment_geometry_is_valid"}, failing
    assert len(result.properties) == 8


def test_0_29_0_already_merges_overlaid_segments():
    """The merge of overlaid segments shipped in 0.29.0: under 0.28.0's variant 0.29.0's plans keep the widest page
    where the model's first-view planner does not (a differential divergence, shrunk)."""
    result = _run("0.29.0", _target(releases=((None, "first_view_overlaid"),)), n=40)
    assert result.status == "diverges" and result.divergent == 1
    assert result.divergences[0]["field"].startswith("segments")


def test_dense_single_block_layout_plans_as_upstream_does():
    """Settled divergence: the model used to refuse this layout (a page-within-stride check no release has)."""
    geometry = dense_layout(num_blocks=1, kernel_block_size=1, heads=1, head_size=2, element_size=4, kv="outer")
    table, _ = upstream_plan(_zeroer_class("0.33.0"), geometry)
    (seg,) = table.segments
    assert (seg.block_stride, seg.page) == (2, 4)  # K and V of the only block: page = 2 x block stride
    (model,) = plan_segments(geometry, VARIANTS.fixed, arena=Arena.for_geometry(geometry)).segments
    assert (model.addr, model.block_stride, model.page) == (seg.addr, seg.block_stride, seg.page)


def test_outer_dimensions_after_the_block_dimension_are_outer_since_0_29_0():
    """Model fix found by the conform target: 0.29.0+ standardize views block dim first and count every other
    dimension whose stride spans more than a block as outer; the model counted only those before the block dim
    (0.28.0's rule), so a view listing K/V after its blocks got one page spanning K and V."""
    dense = dense_layout(num_blocks=2, kernel_block_size=1, heads=1, head_size=4, element_size=4, kv="outer")
    view = dense.views[0]  # (2 K/V, 2 blocks, 1, 1, 4), block dim 1
    order = (1, 0, 2, 3, 4)
    blocks_first = replace(view, shape=tuple(view.shape[d] for d in order),
                           strides=tuple(view.strides[d] for d in order), block_dim=0)
    geometry = KVCacheGeometry(dense.allocations, dense.groups, (blocks_first,))
    arena = Arena.for_geometry(geometry)

    def rows(table):  # type: ignore[no-untyped-def]
        return [(s.addr, s.block_stride, s.page) for s in table.segments]

    fixed = rows(plan_segments(geometry, VARIANTS.fixed, arena=arena))
    assert fixed == [(64, 4, 4), (96, 4, 4)]  # K and V: two segments, one block's data each
    assert fixed == rows(upstream_plan(_zeroer_class("0.33.0"), geometry)[0])
    before = rows(plan_segments(geometry, VARIANTS["first_view_overlaid"], arena=arena))
    assert before == [(64, 4, 12)] == rows(upstream_plan(_zeroer_class("0.28.0"), geometry)[0])


def test_planted_page_change_makes_the_zeroer_target_fail(tmp_path, capsys):
    src = resolve_source("vllm", version="0.33.0")
    tree = tmp_path / "vllm-planted"
    shutil.copytree(src.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "seg_page_sizes.append(kernel_page_bytes // 4)"
    assert text.count(line) == 1
    target.unlink()  # hard link: replace the file, never write through to the cache
    target.write_text(text.replace(line, "seg_page_sizes.append(kernel_page_bytes // 4 + 1)"))
    code = cli.main(["vllm", "--from", str(tree), "--target", ZEROER, "--max-examples", "20", "--json"])
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert code == 1 and result["status"] == "diverges" and result["divergent"] == 1
    (found,) = result["divergences"]
    assert found["field"].startswith("segments[") and found["field"].endswith(".page"), found["field"]
    assert len(found["input"]["views"]) == 1  # shrunk to one view
    assert (src.root / RELPATH).read_text() == text
