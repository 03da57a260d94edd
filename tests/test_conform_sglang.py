"""kvsim conform sglang against the real sglang 0.5.23 wheel (cached; a failed download fails the test)."""

from __future__ import annotations

import os
import shutil

import pytest

from kvsim.conform import cli
from kvsim.conform.report import run_target
from kvsim.conform.sglang.staging import RELPATH
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets


@pytest.fixture(scope="module")
def sglang_src():
    return resolve_source("sglang", version="0.5.23")


def _run(name, source, n=60):
    return run_target(select_targets("sglang", name)[0], source, RunOptions(max_examples=n))


def test_head_slice_and_layout_conform_exhaustively(sglang_src):
    heads = _run("compute_head_slice_params", sglang_src)
    assert heads.status == "conforms" and heads.compared == 12717, heads
    layout = _run("compute_staging_layout", sglang_src)
    assert layout.status == "conforms" and layout.compared == 8856, layout


def test_budget_conforms_page_size_one_included(sglang_src):
    """Settled: at page size 1 upstream charges (and allocates) the SWA pool the whole length; the model now does."""
    result = _run("_prealloc_required_tokens", sglang_src, n=150)
    assert result.status == "conforms" and result.divergent == 0 and result.compared == 150


def test_planted_head_slice_change_makes_conformance_fail(sglang_src, tmp_path):
    tree = tmp_path / "sglang-planted"
    shutil.copytree(sglang_src.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "unique_head_idx = local_tp_rank // src_replication"
    assert text.count(line) == 1
    target.unlink()
    target.write_text(text.replace(line, "unique_head_idx = local_tp_rank % src_replication"))
    assert cli.main(["sglang", "--from", str(tree), "--target", "compute_head_slice_params"]) == 1
