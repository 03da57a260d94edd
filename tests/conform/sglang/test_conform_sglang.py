"""kvsim conform sglang: head slicing, slot layout and the pre-allocation budget, against the real sglang wheels.

The releases are cached (a failed download fails the test). Each target has a planted regression that must
diverge with the smallest input: a changed line in a copy of the release's tree, or a mutant of it.
"""

from __future__ import annotations

import pytest
from test_conform_layout import planted_tree

from kvsim.conform import cli
from kvsim.conform.loader import mutated
from kvsim.conform.mutate import target_mutants
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.models.pd_staging.conform import STAGING_BUFFER as RELPATH


@pytest.fixture(scope="module")
def sglang_src():
    return resolve_source("sglang", version="0.5.23")


def _run(name, source, n=40):
    return run_target(select_targets("sglang", name)[0], source, RunOptions(max_examples=n))


def test_head_slice_and_layout_conform_exhaustively(sglang_src):
    heads = _run("compute_head_slice_params", sglang_src)
    assert heads.status == "conforms" and heads.compared == 4 * 12717, heads  # every pairing, ranks of two groups
    assert "31053 configurations refused by the model" in heads.note
    layout = _run("compute_staging_layout", sglang_src)
    assert layout.status == "conforms" and layout.compared == 2 * 8856 + 27 * 156, layout


def test_planted_head_slice_change_diverges_at_the_smallest_pairing(sglang_src, tmp_path):
    planted = planted_tree(sglang_src, tmp_path, RELPATH, "unique_head_idx = local_tp_rank // src_replication",
                       "unique_head_idx = local_tp_rank % src_replication")
    result = _run("compute_head_slice_params", planted)
    assert result.status == "diverges" and result.divergent == 1 and result.subject == "code under test"
    first = result.divergences[0]  # the first pairing where a writer's rank modulo the replication differs
    assert first["input"] == {"heads": 2, "prefill_tp": 2, "decode_tp": 1, "prefill_rank": 1, "decode_rank": 0}
    assert (first["field"], first["model"]["dst_head_start"], first["upstream"]["dst_head_start"]) == (
        "dst_head_start", 1, 0)
    assert first["difference"] == "dst_head_start: model 1, upstream 0"
    assert cli.main(["sglang", "--from", str(planted.root), "--target", "compute_head_slice_params"]) == 1


def test_planted_layout_change_diverges(sglang_src):
    """A writer's bytes without the K/V factor (`* 2` made `* 1`): the smallest slot diverges on writer_bytes."""
    target = select_targets("sglang", "compute_staging_layout")[0]
    (mutant,) = [m for m in target_mutants(target, sglang_src) if m.operator == "constant" and m.original == "2"
                 and m.replacement == "1"]
    with mutated(mutant):
        result = run_target(target, sglang_src, RunOptions(max_examples=10))
    assert result.status == "diverges"
    first = result.divergences[0]
    assert first["field"] == "writer_bytes[0]" and first["input"]["heads"] == 1
    assert first["model"]["writer_bytes"] == [2 * x for x in first["upstream"]["writer_bytes"]]


def test_budget_conforms_page_size_one_included(sglang_src):
    """Settled: at page size 1 upstream charges (and allocates) the SWA pool the whole length; the model now does."""
    result = _run("_prealloc_required_tokens", sglang_src, n=150)
    assert result.status == "conforms" and result.divergent == 0 and result.compared == 7 + 150  # pinned first
    assert result.note == "model variant fixed"


def test_budget_before_the_page_rounding_follows_its_variant():
    """0.5.17 charges raw tokens (before af7c62e): it conforms with `pre_af7c62e`, and diverges with `fixed`."""
    from dataclasses import replace

    old = resolve_source("sglang", version="0.5.17")
    target = select_targets("sglang", "_prealloc_required_tokens")[0]
    assert target.variant_name("0.5.17") == "pre_af7c62e" and target.variant_name("0.5.18") == "fixed"
    assert run_target(target, old, RunOptions(max_examples=30)).status == "conforms"
    wrong = run_target(replace(target, releases=((None, "fixed"),)), old, RunOptions(max_examples=30))
    assert wrong.status == "diverges" and wrong.divergences[0]["field"] in ("full_tokens", "swa_tokens")


def test_planted_budget_change_diverges_with_a_shrunk_input(sglang_src, tmp_path):
    """The SWA tail rounded to the page after the window start, not before it (floor made ceiling)."""
    planted = planted_tree(sglang_src, tmp_path, "sglang/srt/disaggregation/decode.py",
                       "window_start = (window_start // page_size) * page_size",
                       "window_start = -(-window_start // page_size) * page_size")
    result = _run("_prealloc_required_tokens", planted)
    assert result.status == "diverges" and result.divergent == 1
    first = result.divergences[0]
    assert first["input"]["pool"] == "swa" and first["input"]["page_size"] > 1
    assert first["field"] in ("swa_tokens", "swa_tail_len")
