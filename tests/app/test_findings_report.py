"""`kvsim repro ID --report`: the Markdown bug reports, and docs/findings/ as the generator writes it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from kvsim.app import catalog
from kvsim.app.report_md import report
from kvsim.engine.registry import HARMS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ["## Summary", "## Affected releases", "## Upstream code", "## Minimal counterexample",
            "## Violated invariant", "## Consequence", "## Fix", "## Reproduce"]


def _generator():
    spec = importlib.util.spec_from_file_location("generate_findings", os.path.join(ROOT, "scripts",
                                                                                    "generate_findings.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reg():
    return catalog.load()


@pytest.fixture(scope="module")
def lost_req(reg):
    return report(reg.bug("sglang-05c7ebf-staging-lost-req-success"))


def test_report_has_every_section_in_order(lost_req):
    _, text = lost_req
    at = [text.index(s) for s in SECTIONS]
    assert at == sorted(at)


def test_counterexample_is_numbered_steps_naming_the_lost_message(lost_req):
    result, text = lost_req
    steps = re.findall(r"^(\d+)\. (.+)$", text.split("## Minimal counterexample")[1].split("## ")[0], re.M)
    assert [int(n) for n, _ in steps] == list(range(1, len(result.counterexample["trace"]) + 1))
    drops = [line for _, line in steps if line.startswith("DROP:")]
    assert len(drops) == 1 and "STAGING_REQ room 0 chunk 0" in drops[0]
    assert any("decode → prefill writer 0: STAGING_RSP" in line for _, line in steps)
    assert result.message in text


def test_report_names_upstream_files_verdicts_harm_and_commands(reg, lost_req):
    bug = reg.bug("sglang-05c7ebf-staging-lost-req-success")
    _, text = lost_req
    for site in bug.upstream_files:
        assert f"`{site.path}`" in text and all(f"`{f}`" in text for f in site.functions)
    assert "| 0.5.23 | **present**" in text
    assert bug.harm in text and bug.harm in HARMS
    assert "`success_commits_prefill_kv`:" in text
    assert f"kvsim repro {bug.id}" in text and "--param faults=drop_req" in text and f"kvsim replay {bug.id}.json" in text
    assert "No fix variant is modelled" in text


def test_a_seed_bug_report_runs_its_fix_variant(reg):
    result, text = report(reg.bug("sglang-05c7ebf-staging-no-deadline"))
    fix = text.split("## Fix")[1]
    assert "variant `fixed`" in fix and "`completion_deadline`" in fix
    assert f"holds in the {result.fixed_examples:,} states searched, the violation is gone" in fix
    assert "a hang: no done state is reachable" in text


def test_a_hypothesis_reports_fix_says_what_it_checked(reg):
    result, text = report(reg.bug("sglang-pr35281-mori-abort-dropped"))
    fix = text.split("## Fix")[1]
    assert (f"holds on {result.fixed_examples:,} cases (the {result.examples:,} the search tried, the shrunk "
            f"counterexample among them, then the pinned ones and 100 generated), the violation is gone") in fix


def test_a_hypothesis_report_shows_the_shrunk_case(reg):
    _, text = report(reg.bug("sglang-pr35281-mori-wide-draft-layout"))
    assert "```json" in text and '"draft_layers"' in text
    assert "kvsim check pd-protocol --variant fixed --property layout_selects_main_kv_any_draft" in text


def test_saved_counterexample_from_the_report_command_replays(reg, tmp_path):
    _, text = report(reg.bug("sglang-05c7ebf-staging-dup-ready"))
    explore_line = next(l for l in text.splitlines() if l.startswith("kvsim explore"))
    kvsim = [os.path.join(os.path.dirname(sys.executable), "kvsim")]
    args = explore_line.split()[1:]
    args[-1] = str(tmp_path / "ce.json")
    subprocess.run(kvsim + args, check=False, capture_output=True)
    done = subprocess.run(kvsim + ["replay", str(tmp_path / "ce.json")], capture_output=True, text=True)
    assert done.returncode == 0 and "suffix_rows_match_prefill fails here" in done.stdout


def test_cli_writes_the_report_to_out(tmp_path):
    kvsim = os.path.join(os.path.dirname(sys.executable), "kvsim")
    out = tmp_path / "r.md"
    done = subprocess.run([kvsim, "repro", "sglang-05c7ebf-staging-lost-watermark", "--report", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# sglang-05c7ebf-staging-lost-watermark\n")


def test_committed_findings_are_what_the_generator_writes_now():
    gen = _generator()
    want = gen.generate()
    assert set(want) == {f"{b.id}.md" for b in gen.present_in()} and len(want) >= 5
    folder = os.path.join(ROOT, "docs", "findings")
    have = {n for n in os.listdir(folder) if n.endswith(".md")}
    assert set(gen.WRITTEN_BY_HAND) <= have and not set(gen.WRITTEN_BY_HAND) & set(want)
    assert have - set(gen.WRITTEN_BY_HAND) == set(want)
    for name, text in want.items():
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            assert fh.read() == text, f"docs/findings/{name} is stale: run scripts/generate_findings.py"


# -- pd-staging's findings against SGLang 0.5.23: function names, verdicts, the modelled fix --------------------

def _defined(path):
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        names |= {f"{cls.name}.{m.name}" for m in cls.body if isinstance(m, ast.FunctionDef)}
    return names


def test_pd_staging_reports_name_functions_that_exist_in_0_5_23(reg):
    from kvsim.conform.source import resolve_source

    src = resolve_source("sglang", version="0.5.23")
    checked = 0
    for bug in (b for b in reg.bugs.values() if b.model == "pd-staging"):
        for site in bug.upstream_files:
            names = _defined(src.file(site.path.removeprefix("python/")))
            missing = [f for f in site.functions if f not in names]
            assert not missing, f"{bug.id}: {site.path} has no {missing} in 0.5.23"
            checked += len(site.functions)
    assert checked >= 40


def test_repro_shows_the_release_verdicts_and_checks_the_modelled_fix(reg):
    from kvsim.app.repro import baseline_variant, latest_verdict, release_verdicts, reproduce

    stale = reg.bug("sglang-05c7ebf-staging-stale-write-after-release")
    assert release_verdicts(stale) == "05c7ebf present; 0.5.23 fixed in 0.5.21"
    assert latest_verdict(stale) == "0.5.23 fixed in 0.5.21"
    assert latest_verdict(reg.bug("sglang-05c7ebf-staging-prefix-overwrite")) == "-"
    dup = reg.bug("sglang-0523-staging-dup-ready-reenqueue")
    assert baseline_variant(dup) == "proposed_per_dst_retry" and baseline_variant(stale) is None
    assert baseline_variant(reg.bug("sglang-05c7ebf-staging-prefix-overwrite")) == "fixed"
    result = reproduce(dup)
    assert result.reproduced and result.fixed_passes is True and result.ok  # the fix variant removes it
    assert len(result.counterexample["trace"]) == 7


def test_a_finding_with_a_modelled_fix_breaks_when_the_fix_does_not_remove_it(reg):
    from dataclasses import replace

    from kvsim.app.repro import reproduce

    wrong = replace(reg.bug("sglang-0523-staging-dup-ready-reenqueue"), fix_variant="sglang_0_5_23")
    result = reproduce(wrong)
    assert result.reproduced and result.fixed_passes is False and not result.ok


def test_the_0_5_23_findings_are_in_docs_findings_with_their_fix_run(reg):
    folder = os.path.join(ROOT, "docs", "findings")
    for bug_id in ("sglang-0523-staging-dup-ready-reenqueue", "sglang-05c7ebf-staging-resend-after-free",
                   "sglang-35049-staging-stale-write-after-timeout"):
        assert os.path.exists(os.path.join(folder, f"{bug_id}.md")), bug_id
    text = open(os.path.join(folder, "sglang-05c7ebf-staging-resend-after-free.md"), encoding="utf-8").read()
    assert "variant `proposed_per_dst_retry`" in text
    assert "holds in the 414 states searched, the violation is gone" in text
    assert "`MooncakeKVManager.transfer_worker`" in text
    assert "sglang-05c7ebf-staging-stale-write-after-release.md" not in os.listdir(folder)  # fixed in 0.5.23


@pytest.mark.parametrize("bug_id, step", [
    # a message record inside the action: the step compares it with the records in the channel
    ("sglang-pd-common-failed-not-sticky", "5. deliver_prefill(message=TINFO(room=0))"),
    ("sglang-pr35281-stale-work-flips-success", None),
    # a model without `actions.describe`: the system's own action, not its JSON list
    ("flashinfer-4031-nontransactional-replan", "1. plan(request=0)"),
])
def test_report_replays_the_path_through_the_systems_own_actions(reg, bug_id, step):
    result, text = report(reg.bug(bug_id))
    lines = re.findall(r"^\d+\. (.+)$", text.split("## Minimal counterexample")[1].split("## ")[0], re.M)
    assert len(lines) == len(result.counterexample["trace"]) and not any(l.startswith("[") for l in lines)
    assert step is None or step in text
