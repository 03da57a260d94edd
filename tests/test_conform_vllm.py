"""kvsim conform vllm against the real vllm 0.33.0 wheel (downloaded once into the cache; a failed
download fails these tests with pip's reason)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kvsim.conform import cli
from kvsim.conform.report import run_target
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets
from kvsim.conform.vllm.planner import RELPATH

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
