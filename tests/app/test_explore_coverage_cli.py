"""`kvsim explore --coverage`: line coverage of the model's package, and its refusal without the package."""

from __future__ import annotations

import pytest

from clihelp import kvsim, kvsim_json
from kvsim.app import linecov
from kvsim.engine.errors import ConfigError


def test_explore_reports_actions_invariants_and_line_coverage():
    doc = kvsim_json("explore", "swa-budget", "--coverage")
    assert sum(doc["coverage"]["actions"].values()) == doc["transitions"]
    assert set(doc["coverage"]["invariants"].values()) == {doc["states"]}
    lines = doc["line_coverage"]
    assert lines["package"] == "kvsim.models.swa_budget"
    files = lines["files"]
    # explore runs the scheduler, never the timed simulation: the sim's handlers stay unrun
    assert files["kvsim.models.swa_budget.sim"]["missed"] > 0
    assert files["kvsim.models.swa_budget.scheduler"]["percent"] > files["kvsim.models.swa_budget.sim"]["percent"]
    assert 0 < lines["percent"] < 100


@pytest.mark.parametrize("workers", [("--workers", "2"), ("--workers", "2", "--ray", "local")],
                         ids=["forked", "ray"])
def test_workers_measure_the_lines_one_process_runs(workers):
    # each worker measures the model's lines it runs, and the coordinator counts them with its own
    run = ("explore", "pd-staging", "--variant", "pre_05c7ebf", "--store", "fingerprint", "--coverage")
    one, spread = kvsim_json(*run, expect=1), kvsim_json(*run, *workers, expect=1)
    assert spread["states"] == one["states"]
    assert spread["line_coverage"] == one["line_coverage"]
    assert 0 < one["line_coverage"]["percent"] < 100


def test_module_level_lines_count_as_run(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("X = 1\n\ndef f(a):\n    if a:\n        return 1\n    return 2\n")
    assert linecov.function_body_lines(str(src)) == {4, 5, 6}


def test_coverage_without_the_package_is_one_line(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "coverage", None)
    with pytest.raises(ConfigError) as info:
        linecov.run_with_coverage("kvsim.models.swa_budget", lambda: None)
    assert "--coverage" in str(info.value) and "pip install coverage" in str(info.value)


def test_text_output_names_the_counts():
    proc = kvsim("explore", "swa-budget", "--coverage")
    assert proc.returncode == 0, proc.stderr
    assert "actions taken: arrive" in proc.stdout and "line coverage of kvsim.models.swa_budget" in proc.stdout
