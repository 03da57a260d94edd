"""kvsim conform sglang: the staging ring in lockstep and the write gate, against the real sglang 0.5.23 wheel."""

from __future__ import annotations

import os
import shutil

from kvsim.conform.report import run_target
from kvsim.conform.sglang.ring import RELPATH
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets


def _run(name, source, n=40):
    return run_target(select_targets("sglang", name)[0], source, RunOptions(max_examples=n))


def test_ring_lockstep_diverges_only_by_the_37166_fresh_round():
    result = _run("StagingAllocator", resolve_source("sglang", version="0.5.23"))
    assert result.compared > 200 and result.divergent == 0, result
    assert result.status == "diverges" and "#37166" in result.note


def test_watermark_gate_conforms_exhaustively():
    result = _run("is_watermark_ready", resolve_source("sglang", version="0.5.23"))
    assert result.status == "conforms" and result.compared == 6 * 9 * 6 * 9


def test_planted_wrap_change_makes_the_lockstep_fail(tmp_path):
    src = resolve_source("sglang", version="0.5.23")
    tree = tmp_path / "sglang-planted"
    shutil.copytree(src.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "if required_bytes <= space_at_end:"
    assert text.count(line) == 1
    target.unlink()
    target.write_text(text.replace(line, "if required_bytes < space_at_end:"))
    result = _run("StagingAllocator", resolve_source("sglang", from_path=str(tree)))
    assert result.status == "diverges" and result.divergent == 1
    assert "assign(" in " ".join(result.divergences[0]["input"]["program"])
