"""kvsim's pytest plugin and testing API (`kvsim.testing`): the in-process conform on a project's own code,
the catalog as test items, the worked example `examples/engine_ci` (clean, and with its planted bug), and
the plugin staying inert in a pytest run that does not ask for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kvsim.engine.errors import ConfigError
from kvsim.engine.registry import BugReport
from kvsim.testing import inprocess
from kvsim.testing import verdicts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "engine_ci"
PLANNER = "vllm:plan_mla_context_chunks"


def _plugin_args() -> list[str]:
    """`-p kvsim.testing.plugin` until the `pytest11` entry point is installed (then pytest loads it itself)."""
    installed = any(e.value.startswith("kvsim.testing") for e in metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "kvsim.testing.plugin"]


def _pytest(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENGINE_CI_PLANTED_BUG")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_plugin_args(), *args],
                          capture_output=True, text=True, cwd=cwd, env={**full, **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def toyengine():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import toyengine.mla
        yield toyengine.mla
    finally:
        sys.path.remove(str(EXAMPLE))


# -- the in-process conform ------------------------------------------------------------------------

def test_the_example_planner_conforms_in_process(toyengine):
    result = inprocess.conform(PLANNER, toyengine, max_examples=40)
    assert result.status == "conforms" and result.compared > 0 and result.divergent == 0
    props = {p["property"]: p["status"] for p in result.properties}
    assert props["chunks_fit_the_row_budget"] == "holds" and props["chunk_count_within_alignment_slack"] == "holds"


def test_a_planted_off_by_one_diverges_and_breaks_a_model_property(toyengine, monkeypatch):
    monkeypatch.setenv("ENGINE_CI_PLANTED_BUG", "budget")
    with pytest.raises(inprocess.ConformanceFailure) as failure:
        inprocess.assert_conforms(PLANNER, toyengine, max_examples=40)
    result = failure.value.result
    assert result.status == "diverges" and result.divergent > 0
    assert any(p["property"] == "chunk_count_within_alignment_slack" and p["status"] == "fails"
               for p in result.properties)
    text = str(failure.value)
    assert "plan_mla_context_chunks" in text and "diverges" in text and 'input {"context_lens":' in text
    # the caller's code is the code under test, never "upstream"
    assert "code under test [" in text and "upstream" not in text


def test_a_name_the_caller_does_not_provide_is_an_error_naming_file_and_symbol(toyengine):
    # the planner target also loads the workspace bound; one function alone does not give it
    result = inprocess.conform(PLANNER, toyengine.plan_mla_context_chunks, max_examples=5)
    assert result.status == "error"
    assert "mla_attention.py:align_mla_chunked_context_workspace_size" in result.note and "not provided" in result.note


def test_names_not_provided_load_from_a_tree_as_kvsim_conform_from_path(toyengine, tmp_path, monkeypatch):
    """from_path=: the caller's planner in process, the workspace bound loaded from a tree by the real loader
    (here a vllm-shaped tree whose mla_attention.py is toyengine's file)."""
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    relpath = inprocess.relpath(inprocess.find_target(PLANNER))
    (tmp_path / "tree" / relpath).parent.mkdir(parents=True)
    (tmp_path / "tree" / "vllm" / "__init__.py").write_text("")
    (tmp_path / "tree" / relpath).write_text((EXAMPLE / "toyengine" / "mla.py").read_text())
    result, source = inprocess.run_in_process(PLANNER, toyengine.plan_mla_context_chunks,
                                              from_path=str(tmp_path / "tree"), max_examples=20)
    assert result.status == "conforms" and result.compared > 0, result
    assert source.label.endswith(f"in process over vllm (directory {tmp_path / 'tree'})")
    assert list((tmp_path / "cache" / "loaded").glob("mla_*.py"))  # the bound came through the loader


def test_a_changed_signature_is_an_error(toyengine):
    def align_mla_chunked_context_workspace_size(config, size, extra=0):
        return size

    result = inprocess.conform("vllm:align_mla_chunked_context_workspace_size",
                               align_mla_chunked_context_workspace_size, max_examples=5)
    assert result.status == "error" and "parameters (vllm_config, workspace_size)" in result.note


def test_unknown_and_ambiguous_targets_are_config_errors():
    with pytest.raises(ConfigError, match="target: expected a kvsim conform target"):
        inprocess.find_target("no_such_target")
    with pytest.raises(ConfigError, match="engine: expected one of"):
        inprocess.find_target("nope:plan_mla_context_chunks")
    assert inprocess.find_target("plan_mla_context_chunks").engine == "vllm"


def test_an_adapter_patching_a_provided_function_never_reaches_the_callers_module(toyengine):
    clone = inprocess.isolated(toyengine.plan_mla_context_chunks, {"fits": "stand-in"})
    clone.__globals__["widest_split"] = None  # what an adapter capturing a helper does
    assert clone.__globals__["fits"] == "stand-in"
    assert toyengine.fits is not None and toyengine.widest_split is not None
    assert clone.__code__ is toyengine.plan_mla_context_chunks.__code__


# -- catalog verdicts ------------------------------------------------------------------------------

def test_a_property_failing_as_a_catalogued_finding_is_xfailed_naming_it():
    check = verdicts.Check("property", "swa-budget", "resumed_requests_fit_physical_pages", "pre_af7c62e")
    verdict = verdicts.run(check)
    assert verdict.status == "xfailed" and "sglang-af7c62e-swa-resume-budget" in verdict.text


def test_a_property_that_holds_but_never_draws_what_it_declares_fails(monkeypatch):
    from dataclasses import replace

    from kvsim.app import catalog
    from kvsim.engine.system import REACH_EXAMPLES, Sometimes

    reg, key = catalog.load(), ("kv-zeroing", "segments_stay_inside_allocations")
    never = Sometimes("a_thousand_blocks", lambda case: len(case.block_ids) >= 1000, "a call of 1,000 blocks")
    monkeypatch.setitem(reg.properties, key, replace(reg.properties[key], sometimes=(never,)))
    check = verdicts.Check("property", *key, "fixed")
    assert verdicts.run(check) == verdicts.Verdict("passed")  # the CI profile's 60 examples: a bound, not a failure
    verdict = verdicts.run(check, verdicts.Settings(max_examples=REACH_EXAMPLES))
    assert verdict == verdicts.Verdict("failed", "segments_stay_inside_allocations holds, but no case of the 200 "
                                                 "drawn met a_thousand_blocks: it may hold vacuously")


def test_a_property_failure_that_is_no_catalogued_finding_fails_with_its_counterexample_and_replay():
    # a second property broken by the af7c62e variant: no bug report names it, so it is a plain failure
    check = verdicts.Check("property", "swa-budget", "alloc_calls_match_resumed", "pre_af7c62e")
    verdict = verdicts.run(check, verdicts.Settings(20))
    assert verdict.status == "failed"
    assert "_pre_alloc calls: expected 3 (one per resumed request), got 4" in verdict.text
    assert 'counterexample: {"case": {"page_size": 128' in verdict.text
    assert "replay: kvsim check swa-budget --variant pre_af7c62e --property alloc_calls_match_resumed" in verdict.text


def test_a_failure_is_a_known_finding_by_the_reports_property_or_its_invariant_on_that_variant():
    from kvsim.app import catalog

    registry = catalog.load()
    check = verdicts.Check("property", "swa-budget", "resumed_requests_fit_physical_pages", "pre_af7c62e")
    assert verdicts.known_finding(registry, check, "anything").id == "sglang-af7c62e-swa-resume-budget"
    elsewhere = verdicts.Check("property", "swa-budget", "budgets_stay_nonnegative", "pre_af7c62e")
    assert verdicts.known_finding(registry, elsewhere, "budgets: negative") is None
    stateful = verdicts.Check("property", "pd-protocol", "protocol_invariants", "fixed")
    assert verdicts.known_finding(registry, stateful, "failed_is_sticky: room 0").id == \
        "sglang-pd-common-failed-not-sticky"
    assert verdicts.known_finding(registry, stateful, "success_is_sticky: room 0") is None


def test_under_the_callers_profile_a_failure_is_saved_in_its_example_database():
    from hypothesis import settings
    from hypothesis.database import InMemoryExampleDatabase

    db = InMemoryExampleDatabase()
    before = settings.get_current_profile_name()
    settings.register_profile("kvsim-plugin-test", max_examples=25, derandomize=False, database=db)
    settings.load_profile("kvsim-plugin-test")
    try:
        chosen = verdicts.Settings.from_profile(seed=3)
    finally:
        settings.load_profile(before)
    assert (chosen.max_examples, chosen.derandomize, chosen.database, chosen.seed) == (25, False, db, 3)
    # no pinned example: Hypothesis finds the failure, shrinks it and saves it (a pinned one is never saved)
    check = verdicts.Check("property", "pd-protocol", "control_loop_survives_any_frames", "pre_35281")
    verdict = verdicts.run(check, chosen)
    assert verdict.status == "xfailed" and "sglang-pr35281-malformed-kills-loop" in verdict.text
    assert db.data  # the shrunk counterexample, keyed for this property and variant


def test_a_bug_report_that_does_not_reproduce_fails_with_its_replay():
    bug = BugReport(id="planted-not-a-bug", model="swa-budget", variant="fixed", source="planted",
                    summary="the fixed variant, which has no such bug", property="resumed_requests_fit_physical_pages",
                    max_examples=30)
    verdict = verdicts.bug_verdict(bug)
    assert verdict.status == "failed"
    assert "does not hold" in verdict.text and "reproduced: no" in verdict.text
    assert "replay: kvsim repro planted-not-a-bug --seed 0" in verdict.text


def test_every_catalog_entry_is_one_item_with_the_documented_id():
    found = list(verdicts.checks())
    ids = [f"kvsim::{c.model}::{c.test_name}" for c in found]
    assert len(ids) == len(set(ids))
    assert "kvsim::swa-budget::resumed_requests_fit_physical_pages[fixed]" in ids
    assert "kvsim::swa-budget::sglang-af7c62e-swa-resume-budget[pre_af7c62e]" in ids
    assert "kvsim::kv-zeroing::zero_kv_blocks_differential[fixed-torch-cpu]" in ids
    from kvsim.app import catalog

    registry = catalog.load()
    assert sum(c.kind == "bug" for c in found) == len(registry.bugs)


# -- through pytest ------------------------------------------------------------------------------

def test_the_example_passes_and_catalog_items_run_in_its_report():
    proc = _pytest(["-v", "--kvsim-catalog", "-k", "test_ or resumed_requests_fit or af7c62e"], EXAMPLE)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "tests/test_mla_conforms.py::test_planner_conforms_to_kvsim PASSED" in out
    assert "kvsim::swa-budget::resumed_requests_fit_physical_pages[fixed] PASSED" in out
    assert "kvsim::swa-budget::sglang-af7c62e-swa-resume-budget[pre_af7c62e] PASSED" in out
    assert "kvsim::kv-zeroing" not in out and "budgets_stay_nonnegative" not in out  # deselected by -k
    assert "4 passed, " in out and " deselected" in out


def test_the_examples_planted_bug_fails_its_ci_with_the_counterexample():
    proc = _pytest(["-q"], EXAMPLE, env={"ENGINE_CI_PLANTED_BUG": "budget"})
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    assert "FAILED tests/test_mla_conforms.py::test_planner_conforms_to_kvsim" in out
    assert "1 failed, 1 passed" in out
    assert re.search(r"plan_mla_context_chunks +diverges", out)
    assert 'input {"context_lens":' in out and "first difference: " in out
    assert "property chunk_count_within_alignment_slack: fails" in out


INERT_TEST = """
import sys

def test_nothing_of_kvsim_loaded():
    loaded = sorted(m for m in sys.modules if m.startswith("kvsim.") or m == "torch")
    # the plugin and `import kvsim` (its errors module): no catalog, adapters, models or torch
    assert loaded == ["kvsim.engine", "kvsim.engine.errors", "kvsim.testing", "kvsim.testing.plugin"], loaded
"""


def test_the_plugin_is_inert_unless_asked(tmp_path):
    (tmp_path / "test_plain.py").write_text(INERT_TEST)
    proc = _pytest(["-q"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout and "kvsim" not in proc.stdout.replace("kvsim-", "")


def test_a_bad_max_examples_is_a_usage_error(tmp_path):
    proc = _pytest(["-q", "--kvsim-catalog", "--kvsim-max-examples", "0"], tmp_path)
    assert proc.returncode == 4 and "--kvsim-max-examples: expected an integer >= 1, got 0" in proc.stderr
