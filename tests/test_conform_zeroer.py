"""kvsim conform vllm --target KVBlockZeroer against the real vllm releases (cached wheels; a failed download fails)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kvsim.conform import cli
from kvsim.conform.report import run_target
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets
from kvsim.conform.vllm.zeroer import RELPATH, load, release_variant, upstream_table
from kvsim.models.kv_zeroing.geometry import Arena
from kvsim.models.kv_zeroing.layouts import dense_layout
from kvsim.models.kv_zeroing.zeroer import VARIANTS

OPTIONS = RunOptions(max_examples=40)


def _run(version):
    return run_target(select_targets("vllm", "KVBlockZeroer")[0], resolve_source("vllm", version=version), OPTIONS)


def _props(result):
    return {p["property"]: p["status"] for p in result.properties}


def test_each_release_plans_exactly_as_its_model_variant():
    for version, variant in (("0.27.1", "pre_d6af803"), ("0.28.0", "first_view_overlaid"), ("0.33.0", "fixed")):
        result = _run(version)
        assert release_variant(version).name == variant and f"model variant {variant}" in result.note
        assert result.compared >= 30, result
        assert result.divergences == [], result.divergences
        props = _props(result)
        assert props["zeroing_preserves_other_bytes"] == ("fails" if version == "0.27.1" else "holds")
        assert props["overlaid_groups_get_the_widest_page"] == ("fails" if version == "0.28.0" else "holds")


def test_dense_single_block_layout_plans_as_upstream_does():
    """Settled divergence: the model used to refuse this layout (a page-within-stride check no release has)."""
    geometry = dense_layout(num_blocks=1, kernel_block_size=1, heads=1, head_size=2, element_size=4, kv="outer")
    arena = Arena.for_geometry(geometry)
    up = load(resolve_source("vllm", version="0.33.0"))
    table, launch = upstream_table(up, geometry, arena, VARIANTS.fixed)
    (seg,) = table.segments
    assert (seg.block_stride, seg.page) == (2, 4)  # K and V of the only block: page = 2 x block stride
    from kvsim.models.kv_zeroing.zeroer import plan_segments
    (model,) = plan_segments(geometry, VARIANTS.fixed, arena=arena).segments
    assert (model.addr, model.block_stride, model.page) == (seg.addr, seg.block_stride, seg.page)


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
    code = cli.main(["vllm", "--from", str(tree), "--target", "KVBlockZeroer", "--max-examples", "20", "--json"])
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert code == 1 and result["status"] == "diverges"
    assert result["divergences"]
    assert (src.root / RELPATH).read_text() == text
