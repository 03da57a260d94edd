"""kvsim conform sglang: the staging ring in lockstep and the write gate, against the real sglang 0.5.23 wheel."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.models.pd_staging.conform import STAGING_BUFFER as RELPATH

RING = "StagingAllocator"


def _run(name, source, n=40, target=None):
    return run_target(target or select_targets("sglang", name)[0], source, RunOptions(max_examples=n))


def test_ring_lockstep_conforms_on_0_5_23_with_its_variant():
    """0.5.23 follows `sglang_0_5_23`: the frees that empty the ring (#37166's fresh round) compare equal."""
    result = _run(RING, resolve_source("sglang", version="0.5.23"))
    assert result.compared > 200 and result.divergent == 0, result
    assert result.status == "conforms" and "model variant sglang_0_5_23" in result.note
    assert int(result.note.split("; ")[1].split()[0]) > 0  # some frees emptied the ring: the flag was exercised


def test_releases_map_to_the_variant_of_their_ring():
    target = select_targets("sglang", RING)[0]
    assert target.variant_name("0.5.17") == "fixed" and target.variant_name("0.5.13") == "fixed"
    assert target.variant_name("0.5.19") == "sglang_0_5_23" and target.variant_name("0.5.23") == "sglang_0_5_23"
    assert target.variant_name("0.5.23.post1") == "sglang_0_5_23" and target.variant_name(None) == "sglang_0_5_23"


@pytest.mark.parametrize("version, wrong", [("0.5.23", "fixed"), ("0.5.17", "sglang_0_5_23")])
def test_the_other_empty_ring_rule_diverges_at_a_free(version, wrong):
    """The flag is what conforms: the release's ring under the other variant diverges at a free emptying it,
    shrunk to a short program."""
    target = replace(select_targets("sglang", RING)[0], releases=((None, wrong),))
    result = _run(RING, resolve_source("sglang", version=version), target=target)
    assert result.status == "diverges" and result.divergent == 1
    program = result.divergences[0]["input"]["program"]
    assert program[-1].startswith("free(") and len(program) <= 4, program
    assert result.divergences[0]["field"] in ("head", "round", "watermark[0]", "watermark[1]")


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
    result = _run(RING, resolve_source("sglang", from_path=str(tree)))
    assert result.status == "diverges" and result.divergent == 1
    assert "assign(" in " ".join(result.divergences[0]["input"]["program"])
    assert result.subject == "code under test"
