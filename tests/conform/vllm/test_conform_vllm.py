"""kvsim conform vllm against the real vllm 0.33.0 wheel (downloaded once into the cache; a failed
download fails these tests with pip's reason)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kvsim.conform import cli
from kvsim.conform.loader import mutated
from kvsim.conform.report import run_target
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets
from kvsim.conform.vllm.planner import RELPATH
from kvsim.engine.conformance.mutants import Mutant

OPTIONS = RunOptions(max_examples=40)


@pytest.fixture(scope="module")
def vllm_src():
    return resolve_source("vllm", version="0.33.0")


def _run(name, source):
    return run_target(select_targets("vllm", name)[0], source, OPTIONS)


def test_planner_conforms_and_model_properties_hold_on_upstream(vllm_src):
    result = _run("plan_mla_context_chunks", vllm_src)
    assert result.status == "conforms", result
    assert result.compared >= 30 and result.divergent == 0
    assert {p["property"] for p in result.properties} >= {"chunks_tile_every_context_row_once",
                                                          "chunk_starts_are_aligned"}
    assert all(p["status"] == "holds" for p in result.properties)
    # the b38e111d seed bug's property holds on the released per-request planner
    assert "chunk_count_within_alignment_slack" in {p["property"] for p in result.properties}


def test_settled_divergences_now_conform(vllm_src):
    """Both were model bugs found by conform and fixed: vllm#51733 dropped the max_num_seqs workspace term
    (MlaVariant.workspace_seq_term), and under DCP without block alignment the splits align to the interleave."""
    workspace = _run("align_mla_chunked_context_workspace_size", vllm_src)
    assert workspace.status == "conforms" and workspace.divergent == 0 and workspace.compared > 0
    arguments = run_target(select_targets("vllm", "mla_chunk_arguments")[0], vllm_src, RunOptions(max_examples=120))
    assert arguments.status == "conforms" and arguments.divergent == 0 and arguments.compared > 0


def _plant(source, definition, old, new):
    """The loader's mutant replacing the one occurrence of `old` in `definition` of the MLA module."""
    text = source.file(RELPATH).read_text()
    assert text.count(old) == 1, f"{old!r}: the plant needs updating"
    start = text.index(old)
    return Mutant(RELPATH, definition, "planted", text.count("\n", 0, start) + 1, start, start + len(old), old, new)


def test_the_builder_target_compares_the_whole_metadata_and_catches_a_planted_field(vllm_src):
    """Every ContextChunk field is compared: a planted continuation_token_end diverges on that field, shrunk to one
    small batch; align_indptr and the DCP fields are compared on the real 0.33.0 builder."""
    target = select_targets("vllm", "mla_chunk_arguments")[0]
    clean = run_target(target, vllm_src, OPTIONS)
    assert clean.status == "conforms" and clean.compared >= 40
    assert {p["property"]: p["status"] for p in clean.properties} == {"indptr_slices_are_16_byte_aligned": "holds"}
    plant = _plant(vllm_src, "build_mla_chunked_context_metadata",
                   "continuation_token_end=query_start_loc[plan.request_start + 1],",
                   "continuation_token_end=query_start_loc[plan.request_end],")
    with mutated(plant):
        result = run_target(target, vllm_src, OPTIONS)
    assert result.status == "diverges" and result.divergent == 1
    found = result.divergences[0]
    assert found["field"].endswith(".continuation_token_end") and found["field"].startswith("chunks[")
    assert len(found["input"]["context_lens"]) <= 2, found["input"]  # shrunk


def test_a_planted_indptr_misalignment_fails_the_alignment_property(vllm_src):
    target = select_targets("vllm", "mla_chunk_arguments")[0]
    with mutated(_plant(vllm_src, "build_mla_chunked_context_metadata", "padding = -boundary_offset % 4",
                        "padding = -boundary_offset % 2")):
        result = run_target(target, vllm_src, OPTIONS)
    props = {p["property"]: p for p in result.properties}
    assert result.status == "diverges" and props["indptr_slices_are_16_byte_aligned"]["status"] == "fails"
    assert props["indptr_slices_are_16_byte_aligned"]["input"]["align_indptr"] is True


def test_the_workspace_bound_ignores_an_interleave_without_dcp(vllm_src):
    """`decode_context_parallel_size > 1` made `>= 1`: a world of 1 with an interleave (prefill context parallelism)
    then aligns to lcm(block, interleave); the model keeps the block."""
    target = select_targets("vllm", "align_mla_chunked_context_workspace_size")[0]
    with mutated(_plant(vllm_src, "align_mla_chunked_context_workspace_size",
                        "if parallel_config.decode_context_parallel_size > 1:",
                        "if parallel_config.decode_context_parallel_size >= 1:")):
        result = run_target(target, vllm_src, RunOptions(max_examples=200))  # a quick target: 200 calls, ~1 s
    assert result.status == "diverges"
    world, interleave = result.divergences[0]["input"]["dcp"]
    assert world == 1 and interleave > 1


def test_the_planner_refuses_what_upstream_asserts_on(vllm_src):
    """Free planner arguments with a split alignment of 0: upstream's assertion is the model's refusal; planted
    away (`> 0` -> `>= 0`), upstream plans (or divides by zero) where the model refuses."""
    target = select_targets("vllm", "plan_mla_context_chunks")[0]
    with mutated(_plant(vllm_src, "plan_mla_context_chunks", "assert split_alignment > 0",
                        "assert split_alignment >= 0")):
        result = run_target(target, vllm_src, RunOptions(max_examples=200))  # one in twelve draws a bad alignment
    assert result.status == "diverges"
    found = result.divergences[0]
    assert found["input"]["split_alignment"] == 0 and "refuses" in str(found["model"])


def test_planted_off_by_one_makes_conformance_fail(vllm_src, tmp_path, capsys):
    tree = tmp_path / "vllm-planted"
    shutil.copytree(vllm_src.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "if rows + request_rows > row_budget:"
    assert text.count(line) == 1
    target.unlink()  # hard link: replace the file, never write through to the cache
    target.write_text(text.replace(line, "if rows + request_rows >= row_budget:"))
    code = cli.main(["vllm", "--from", str(tree), "--target", "plan_mla_context_chunks", "--max-examples", "40",
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    (result,) = out["results"]
    assert result["status"] == "diverges" and result["divergent"] > 0
    assert (vllm_src.root / RELPATH).read_text() == text  # the cached release is untouched


def test_removed_definition_is_exit_2_naming_file_and_symbol(vllm_src, tmp_path, capsys):
    tree = tmp_path / "vllm-renamed"
    shutil.copytree(vllm_src.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    target.unlink()
    target.write_text(text.replace("def plan_mla_context_chunks(", "def plan_mla_context_chunks_v2("))
    assert cli.main(["vllm", "--from", str(tree), "--target", "plan_mla_context_chunks"]) == 2
    assert f"{RELPATH}:plan_mla_context_chunks: absent" in capsys.readouterr().out


def test_changed_signature_is_exit_2(vllm_src, tmp_path, capsys):
    tree = tmp_path / "vllm-sig"
    shutil.copytree(vllm_src.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    target.unlink()
    target.write_text(text.replace("    split_alignment: int,\n    padded_rows:", "    alignment: int,\n    padded_rows:")
                      .replace("split_alignment", "alignment"))
    assert cli.main(["vllm", "--from", str(tree), "--target", "plan_mla_context_chunks"]) == 2
    out = capsys.readouterr().out
    assert "plan_mla_context_chunks" in out and "signature changed" in out


def test_release_table_marks_the_uniform_release_not_present(capsys):
    code = cli.main(["vllm", "--versions", "0.27.1,0.33.0", "--target", "plan_mla_context_chunks",
                     "--max-examples", "20"])
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("plan_mla_context_chunks"))
    assert row.split()[1:] == ["not", "present", "conforms"]
    assert code == 0


def test_bad_input_is_exit_2(capsys):
    assert cli.main(["vllm", "--target", "no_such_target"]) == 2
    assert cli.main(["vllm", "--from", "/nonexistent"]) == 2
    assert "--from" in capsys.readouterr().err
