"""kvsim conform sglang: the staging ring in lockstep and the write gate, against the real sglang 0.5.23 wheel."""

from __future__ import annotations

import os
import shutil

import pytest

from kvsim.conform.report import run_target
from kvsim.conform.sglang import ring as ring_target
from kvsim.conform.sglang.ring import RELPATH, release_variant
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets
from kvsim.models.pd_staging.variants import FIXED, VARIANTS

SGLANG_0_5_23 = VARIANTS["sglang_0_5_23"]


def _run(name, source, n=40):
    return run_target(select_targets("sglang", name)[0], source, RunOptions(max_examples=n))


def test_ring_lockstep_conforms_on_0_5_23_with_its_variant():
    """0.5.23 follows `sglang_0_5_23`: the frees that empty the ring (#37166's fresh round) compare equal."""
    result = _run("StagingAllocator", resolve_source("sglang", version="0.5.23"))
    assert result.compared > 200 and result.divergent == 0, result
    assert result.status == "conforms" and "model variant sglang_0_5_23" in result.note
    assert int(result.note.split("; ")[1].split()[0]) > 0  # some frees emptied the ring: the flag was exercised


def test_releases_map_to_the_variant_of_their_ring():
    assert release_variant("0.5.17") == FIXED and release_variant("0.5.13") == FIXED
    assert release_variant("0.5.19") == SGLANG_0_5_23 and release_variant("0.5.23") == SGLANG_0_5_23
    assert release_variant("0.5.23.post1") == SGLANG_0_5_23 and release_variant(None) == SGLANG_0_5_23


@pytest.mark.parametrize("version, wrong", [("0.5.23", FIXED), ("0.5.17", SGLANG_0_5_23)])
def test_the_other_empty_ring_rule_diverges_at_a_free(monkeypatch, version, wrong):
    """The flag is what conforms: the release's ring under the other variant diverges at a free emptying it."""
    monkeypatch.setattr(ring_target, "release_variant", lambda _version: wrong)
    result = _run("StagingAllocator", resolve_source("sglang", version=version))
    assert result.status == "diverges" and result.divergent == 1
    assert result.divergences[0]["input"]["program"][-1].startswith("free(")


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
