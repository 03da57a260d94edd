"""kvsim conform sglang: the staging ring in lockstep and the write gate, against the real sglang 0.5.23 wheel.

Each has a planted regression (a changed line in a copy of the tree, or a mutant of the release's code) that must
diverge with a shrunk input or program.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

from kvsim.conform.loader import mutated
from kvsim.conform.mutate import target_mutants
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
    assert result.status == "conforms" and result.compared == 6 * 9 * (1 + 6 * 9)  # and no watermark received yet


def test_watermark_advance_as_if_is_a_divergence_with_a_shrunk_program():
    """The issue's regression: `free`'s watermark advance written `if` instead of `while` made the next line read a
    freed id (KeyError). That raise is upstream's answer: a divergence with the shortest program that reaches it,
    never an error of the run (exit 2)."""
    source = resolve_source("sglang", version="0.5.23")
    target = select_targets("sglang", RING)[0]
    (loop,) = [m for m in target_mutants(target, source) if m.operator == "loop"]
    assert loop.original.startswith("while self.alloc_order and self.alloc_order[0] not in self.allocations")
    with mutated(loop):
        result = run_target(target, source, RunOptions(max_examples=60))
    assert result.status == "diverges" and result.divergent == 1, result
    first = result.divergences[0]
    assert first["program"] == ["start(total=1)", "assign(1)", "assign(1)", "assign(1)", "free(1)", "free(0)"]
    assert first["upstream"]["returned"] == {"raised": "KeyError", "message": "1", "origin": "upstream",
                                             "where": "sglang/srt/disaggregation/common/staging_buffer.py:339"}
    assert first["field"] == "returned" and first["model"]["returned"] is None


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
