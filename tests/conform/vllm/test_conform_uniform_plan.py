"""The uniform MLA plan of vLLM 0.27.1 (before b38e111d) against the model's pre_b38e111d, on the real release, and
the workspace size of the released builder before and after b38e111d.

The releases are downloaded once into the user cache (a failed download fails these tests with pip's reason).
"""

from __future__ import annotations

import os
import shutil

import pytest

from kvsim.conform.loader import load_definitions
from kvsim.conform.report import run_target
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets
from kvsim.conform.vllm.uniform_plan import RELPATH, SYMBOL, UniformCase, call_upstream, host_torch
from kvsim.properties.mla_chunks.cases import case

pytest.importorskip("torch")

OPTIONS = RunOptions(max_examples=30)


@pytest.fixture(scope="module")
def release():
    return resolve_source("vllm", version="0.27.1")


def _run(source, name="mla_uniform_plan", options=OPTIONS):
    return run_target(select_targets("vllm", name)[0], source, options)


def test_the_released_uniform_plan_is_the_model_field_by_field(release):
    result = _run(release)
    assert result.status == "conforms", result.divergences
    assert result.compared >= 30 + 15 and result.properties == []


def test_the_released_uniform_plan_breaks_the_seed_bugs_properties(release):
    result = _run(release, "mla_uniform_plan_properties")
    assert result.compared >= 30 + 15 and result.divergent == 0, result.divergences
    props = {p["property"]: p["status"] for p in result.properties}
    # the b38e111d seed bug's property, on 0.27.1's own code: [960] + [16] * 7 with W 1024 takes 8 chunks for 2
    assert props["chunk_count_within_alignment_slack"] == "fails"
    assert "expected <= 2, got 8" in next(p["message"] for p in result.properties
                                         if p["property"] == "chunk_count_within_alignment_slack")
    assert props["chunks_have_no_empty_spans"] == "fails" and props["chunks_tile_every_context_row_once"] == "holds"
    assert props["chunk_count_meets_lower_bound"] == "holds"
    assert result.status == "diverges" and "the model's pre_b38e111d fails the same properties" in result.note


def test_pinned_blowup_case_on_the_release(release):
    """Upstream's own numbers for the bug report's batch: 8 columns of 128 rows, the long request alone after the
    first."""
    fn = getattr(load_definitions(release.file(RELPATH), [SYMBOL], extra_globals={"torch": host_torch()},
                                  where=RELPATH, version=release.label), SYMBOL)
    md = call_upstream(fn, UniformCase(case([960] + [16] * 7), 1024), dcp=False)
    assert md.starts[:, 0].tolist() == [0, 128, 256, 384, 512, 640, 768, 896]
    assert md.seq_tot == [240, 128, 128, 128, 128, 128, 128, 64]
    assert md.has_empty_context == [False] + [True] * 7
    assert md.prefill_tokens_with_context == 32


def test_absent_after_the_fix(release):
    result = _run(resolve_source("vllm", version="0.28.0"))
    assert result.status == "not present" and "plan_mla_context_chunks" in result.note


def test_a_planted_change_in_the_released_builder_diverges(release, tmp_path):
    tree = tmp_path / "vllm-planted"
    shutil.copytree(release.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "num_chunks = cdiv(max_context_len, max_context_chunk)"
    assert text.count(line) == 1
    target.unlink()  # hard link: replace the file, never write through to the cache
    target.write_text(text.replace(line, line + " + 1"))
    result = _run(resolve_source("vllm", from_path=str(tree)), options=RunOptions(max_examples=5))
    assert result.status == "diverges" and result.divergent == 1
    found = result.divergences[0]
    assert found["field"] and found["difference"] and found["input"]["context_lens"]


def test_the_released_workspace_size_matches_the_model_before_and_after_the_fix(release):
    """The workspace the uniform plan runs on is the model's pre-b38e111d bound, read off the released builder's
    static method; 0.28.0's is the aligned bound of the fixed model."""
    target = select_targets("vllm", "mla_workspace_size")[0]
    for source, variant in ((release, "pre_b38e111d"), (resolve_source("vllm", version="0.28.0"), "fixed")):
        result = run_target(target, source, OPTIONS)
        assert result.status == "conforms" and result.divergent == 0 and result.compared == 3136, result
        assert result.note == f"model variant {variant}"


def test_a_planted_change_in_the_released_workspace_size_diverges(release, tmp_path):
    tree = tmp_path / "vllm-planted"
    shutil.copytree(release.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "scheduler_config.max_num_seqs * cache_config.block_size,\n        )\n\n        return"
    assert text.count(line) == 1
    target.unlink()
    target.write_text(text.replace(line, line.replace("max_num_seqs *", "max_num_seqs // 2 *")))
    result = run_target(select_targets("vllm", "mla_workspace_size")[0], resolve_source("vllm", from_path=str(tree)),
                        OPTIONS)
    assert result.status == "diverges" and result.divergent == 1
    # the exhaustive sweep stops at its first (smallest) divergent point: the lower bound binds only past the 64 Ki
    # cap (max_num_seqs * block = 131072), for the shortest model
    assert result.divergences[0]["input"] == {"block": 128, "dcp": [1, 1], "max_model_len": 1, "max_num_seqs": 1024}
