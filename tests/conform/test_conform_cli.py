"""`kvsim conform`'s command line: bad input is one error line before any work, a tree holding no target's
file is no false green, `--changed` selects the targets that read the changed files, and `--target` runs in the
order given."""

from __future__ import annotations

import json

import pytest


def _kvsim(capsys, *argv):
    from kvsim.app.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, field", [
    (["--version", ""], "--version"), (["--versions", "0.33.0,,0.32.0"], "--versions"),
    (["--target", "nope"], "--target"), (["--target", "a,,b"], "--target"),
    (["--junit", "/dev/full"], "--junit"), (["--from", "/nonexistent"], "--from"),
    (["--call-timeout", "0"], "--call-timeout"), (["--max-seconds", "1e18"], "--max-seconds"),
    (["--diff-base", "HEAD"], "--diff-base")])
def test_bad_input_is_one_error_line_and_a_json_document_before_any_work(capsys, argv, field):
    code, out, err = _kvsim(capsys, "conform", "vllm", *argv, "--json")
    assert code == 2 and err.startswith(f"kvsim: error: {field}: expected ") and err.count("\n") == 1
    assert json.loads(out)["error"]["field"] == field


def test_a_tree_without_any_target_file_is_no_false_green(tmp_path, capsys):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    junit = tmp_path / "out.xml"
    code, _, err = _kvsim(capsys, "conform", "vllm", "--from", str(tmp_path), "--junit", str(junit))
    assert code == 2 and "holding at least one of the targets' files" in err
    assert junit.read_text().count("<error ") == 1  # CI sees why, not an empty report


def test_changed_files_select_the_targets_that_read_them(tmp_path, capsys):
    from kvsim.conform.targets import changed_targets, select_targets

    chosen = select_targets("vllm")
    picked = changed_targets(chosen, ["python/vllm/model_executor/layers/attention/mla_attention.py"], "vllm")
    assert picked and all("vllm/model_executor/layers/attention/mla_attention.py" in t.files for t in picked)
    assert changed_targets(chosen, ["README.md"], "vllm") == []
    code, out, _ = _kvsim(capsys, "conform", "vllm", "--changed", "README.md", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["results"] == [] and doc["changed"] == ["README.md"]


def test_several_targets_run_in_the_order_given_and_list_their_files(capsys):
    names = ["align_mla_chunked_context_workspace_size", "plan_mla_context_chunks"]
    code, out, _ = _kvsim(capsys, "conform", "vllm", "--target", names[0], "--target", names[1],
                          "--max-examples", "5", "--json")
    doc = json.loads(out)
    assert code == 0 and [r["target"] for r in doc["results"]] == names
    assert all(t["files"] for t in doc["targets"]) and doc["subject"] == "upstream"


@pytest.mark.parametrize("argv, workers", [([], "cpus"), (["--workers", "1"], 1), (["--workers", "3"], 3)])
def test_targets_run_on_as_many_workers_as_cpus_unless_told(capsys, monkeypatch, argv, workers):
    """`--workers` defaults to the CPU count (as `kvsim repro --all`), `--workers 1` runs in the process."""
    from kvsim.conform import cli

    seen = []
    monkeypatch.setattr(cli, "cpu_count", lambda: 5)
    monkeypatch.setattr(cli, "run_all", lambda chosen, source, options, workers, measure: seen.append(workers) or [])
    code, out, _ = _kvsim(capsys, "conform", "vllm", "--target", "plan_mla_context_chunks", *argv, "--json")
    assert code == 0 and seen == [5 if workers == "cpus" else workers]
