"""`--junit FILE` of check, repro, explore, oracle and conform: every file is validated against the Jenkins
`junit-10.xsd` that CI systems read, loaded from pytest's sdist (the pytest release installed here), fetched
once with `pip download` into the kvsim cache (a failed download fails the test, with pip's reason)."""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from kvsim.app import catalog, cli, junit, oracle
from kvsim.app.repro import ReproResult
from kvsim.conform import cli as conform_cli
from kvsim.conform import source as source_module
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import targets
from kvsim.engine.descriptor import RunSpec

XSD = "testing/example_scripts/junit-10.xsd"  # in pytest's sdist; pytest's own junitxml tests use it


def schema_path() -> Path:
    """junit-10.xsd out of the sdist of the installed pytest release, cached under the kvsim cache."""
    folder = source_module.cache_root() / "schemas" / f"pytest-{pytest.__version__}"
    xsd = folder / "junit-10.xsd"
    if xsd.is_file():
        return xsd
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="download.", dir=folder))  # parallel workers never share a file
    spec = f"pytest=={pytest.__version__}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(work), spec]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=source_module.DOWNLOAD_TIMEOUT_S)
    sdists = sorted(work.glob(f"pytest-{pytest.__version__}.tar.gz"))
    if done.returncode != 0 or not sdists:
        pytest.fail(f"downloading the {spec} sdist with pip failed (exit {done.returncode}): "
                    f"{' '.join((done.stderr or done.stdout).split()[-60:]) or 'no sdist was produced'}")
    with tarfile.open(sdists[0]) as archive:
        member = next((m for m in archive.getmembers() if m.name.endswith("/" + XSD)), None)
        if member is None:
            pytest.fail(f"{sdists[0].name} has no {XSD}")
        data = archive.extractfile(member).read()
    tmp = work / xsd.name
    tmp.write_bytes(data)
    tmp.rename(xsd)  # atomically: a second run finds the whole file or none
    shutil.rmtree(work, ignore_errors=True)
    return xsd


@pytest.fixture(scope="module")
def schema():
    return xmlschema.XMLSchema(str(schema_path()))


def _read(schema, path: Path) -> ET.Element:
    """The file, valid against junit-10.xsd (the validator's reason otherwise), as a tree."""
    schema.validate(str(path))
    return ET.parse(path).getroot()


def _cases(root: ET.Element) -> dict[str, ET.Element]:
    return {f"{c.get('classname')}::{c.get('name')}": c for c in root.iter("testcase")}


def _outcome(case: ET.Element) -> str:
    return next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")


def _counts(root: ET.Element) -> dict[str, int]:
    suite = root.find("testsuite")
    return {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}


def _replay_line(text: str) -> list[str]:
    """The `kvsim ...` line of a failure's text, as argv for cli.main."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith("replay: kvsim ")]
    return shlex.split(line.removeprefix("replay: kvsim "))


def _main(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


# -- the schema and the validator ---------------------------------------------------------------------------

def test_the_schema_comes_from_the_pytest_sdist_once(schema, monkeypatch):
    path = schema_path()
    assert path.is_relative_to(source_module.cache_root())
    assert b'<xs:element name="testsuite">' in path.read_bytes()

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran again")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert schema_path() == path  # the cache answers


MINIMAL = ('<testsuites><testsuite name="s" tests="1" failures="0" errors="0" time="{time}">'
           '<testcase name="t" classname="c" {case}/></testsuite></testsuites>')


def test_the_validator_rejects_malformed_documents(schema):
    assert schema.is_valid(MINIMAL.format(time="0.125", case=""))
    for bad in (MINIMAL.format(time="0.1234", case=""),  # a suite time with four decimals (SUREFIRE_TIME)
                MINIMAL.format(time="1", case="").replace(' tests="1"', ""),  # a suite without its count
                MINIMAL.format(time="1", case="").replace('name="t" ', ""),  # a testcase without a name
                MINIMAL.format(time="1", case='outcome="failed"'),  # an attribute the schema does not know
                MINIMAL.format(time="1", case="").replace("<testcase", "<test")):  # an element it does not know
        assert not schema.is_valid(bad), bad


def test_unprintable_text_is_escaped_and_counts_add_up(schema, tmp_path):
    cases = [junit.Case("ok", "kvsim.m.v", 0.5), junit.Case("bad\x00name", "kvsim.m.v", 1.25, "failure",
                                                                 "got \x1b[31m\ud800", "body \x0c", "property"),
             junit.Case("gone", "kvsim.m.v", outcome="skipped", message="backend absent"),
             junit.Case("crash", "kvsim.m.v", outcome="error", message="boom", kind="crash")]
    out = tmp_path / "u.xml"
    junit.write(str(out), "kvsim test", [junit.suite("s", cases, {"params": {"a": [1, 2]}, "none": None})])
    root = _read(schema, out)
    assert root.attrib == {"name": "kvsim test", "tests": "4", "failures": "1", "errors": "1", "time": "1.750"}
    assert _counts(root) == {"tests": 4, "failures": 1, "errors": 1, "skipped": 1}
    failure = root.find(".//failure")
    assert failure.get("message") == "got \\x1b[31m\\ud800" and failure.text == "body \\x0c"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["params"] == '{"a":[1,2]}' and "none" not in props


# -- the five commands ----------------------------------------------------------------------------------------

def test_check_failures_carry_message_counterexample_and_a_replay_that_fails_again(schema, tmp_path, capsys):
    out = tmp_path / "check.xml"
    code, stdout = _main(capsys, "check", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "30",
                         "--json", "--junit", str(out))
    assert code == 1
    doc = json.loads(stdout)  # --json is printed as before
    root = _read(schema, out)
    every = _cases(root)
    cases = {k: c for k, c in every.items() if " sometimes " not in k}  # a testcase per property, then per `sometimes`
    results = {f"kvsim.swa-budget.pre_af7c62e::{r['property']}": r for r in doc["results"]}
    assert set(cases) == set(results) and len(cases) == 7
    failed = {k for k, r in results.items() if r["status"] == "failed"}
    assert failed and {k for k, c in every.items() if _outcome(c) == "failure"} == failed
    goals = sum(len(r["reachability"]) for r in doc["results"])
    bounded = sum(not g["reached"] for r in doc["results"] for g in r["reachability"])  # 30 examples: a bound
    assert goals == len(every) - 7 == 15 and bounded
    assert _counts(root) == {"tests": 7 + goals, "failures": len(failed), "errors": 0, "skipped": bounded}
    stateful = cases["kvsim.swa-budget.pre_af7c62e::scheduler_invariants"].find("failure")
    r = results["kvsim.swa-budget.pre_af7c62e::scheduler_invariants"]
    assert stateful.get("message") == r["message"] and stateful.get("type") == "property"
    assert f"replay: {r['replay']}" in stateful.text and "state = step(state, resume())" in stateful.text
    argv = _replay_line(stateful.text)  # the line a user pastes fails the same way
    code, again = _main(capsys, *argv, "--json")
    assert code == 1 and json.loads(again)["results"][0]["message"] == r["message"]


def test_check_passing_and_skipped_properties_and_text_output(schema, tmp_path, capsys):
    out = tmp_path / "ok.xml"
    code, stdout = _main(capsys, "check", "kv-zeroing", "--max-examples", "5", "--property",
                         "zero_kv_blocks_differential", "--property", "segments_stay_inside_allocations",
                         "--junit", str(out))
    assert code == 0 and "zero_kv_blocks_differential" in stdout  # the text table is printed as before
    root = _read(schema, out)
    cases = _cases(root)
    assert _outcome(cases["kvsim.kv-zeroing.fixed::segments_stay_inside_allocations"]) == "passed"
    skipped = cases["kvsim.kv-zeroing.fixed::zero_kv_blocks_differential"].find("skipped")
    assert "choose --backend" in skipped.get("message")  # a kernel property without --backend
    # the property's `sometimes`: three met in 5 drawn cases (passed), one not (a bound: skipped, not a failure)
    goals = {name.partition(" sometimes ")[2]: _outcome(case) for name, case in cases.items() if " sometimes " in name}
    assert goals == {"a_block_of_several_kernel_blocks": "passed", "groups_sharing_an_allocation": "passed",
                     "a_mamba_state": "passed", "several_blocks_a_call": "skipped"}
    assert _counts(root) == {"tests": 6, "failures": 0, "errors": 0, "skipped": 2}


def test_check_files_are_the_same_for_the_same_seed_but_for_times(tmp_path, capsys):
    texts = []
    for n in range(2):
        out = tmp_path / f"{n}.xml"
        _main(capsys, "check", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "20",
              "--property", "alloc_calls_match_resumed", "--property", "resume_is_fifo_prefix", "--junit", str(out))
        texts.append(re.sub(r' time="[0-9.]+"', "", out.read_text()))
    assert texts[0] == texts[1] and "<failure" in texts[0]


def test_repro_holding_report_passes(schema, tmp_path, capsys):
    out = tmp_path / "repro.xml"
    code, _ = _main(capsys, "repro", "sglang-af7c62e-swa-resume-budget", "--junit", str(out))
    assert code == 0
    root = _read(schema, out)
    (case,) = root.iter("testcase")
    assert (case.get("name"), case.get("classname")) == ("sglang-af7c62e-swa-resume-budget",
                                                         "kvsim.swa-budget.pre_af7c62e")
    assert _outcome(case) == "passed" and "reproduced on pre_af7c62e" in case.find("system-out").text
    code, _ = _main(capsys, "repro", "trtllm-15519-slice-id-crash", "--junit", str(out))  # found by explore
    (case,) = _read(schema, out).iter("testcase")
    assert code == 0 and "counterexample path (" in case.find("system-out").text


def test_repro_report_that_does_not_hold_is_a_failure_with_its_replay(schema, tmp_path):
    reg = catalog.load()
    bug = reg.bug("sglang-af7c62e-swa-resume-budget")
    broken = ReproResult(bug, reproduced=False, fixed_passes=True, examples=176, seconds=0.2,
                         counterexample=None, message="")
    fixed_fails = ReproResult(reg.bug("vllm-35846-already-stored-evicted"), reproduced=True, fixed_passes=False,
                              examples=3, seconds=0.1, counterexample={"case": [1, 2]}, message="evicted key 2")
    out = tmp_path / "r.xml"
    junit.write(str(out), "kvsim repro", [junit.repro([broken, fixed_fails], ["trtllm-15519-slice-id-crash"], 7)])
    root = _read(schema, out)
    assert _counts(root) == {"tests": 3, "failures": 2, "errors": 0, "skipped": 1}
    first, second, third = root.iter("testcase")
    assert first.find("failure").get("message") == ("did not reproduce: resumed_requests_fit_physical_pages "
                                                    "holds on pre_af7c62e (176 examples searched)")
    assert "replay: kvsim repro sglang-af7c62e-swa-resume-budget --seed 7" in first.find("failure").text
    text = second.find("failure").text
    assert "also fails on" in second.find("failure").get("message") and 'case: [1,2]' in text
    assert third.find("skipped").get("message").startswith("not run: --max-seconds")


def test_explore_violation_bound_and_saved_path(schema, tmp_path, capsys):
    out, saved = tmp_path / "explore.xml", tmp_path / "cx.json"
    code, stdout = _main(capsys, "explore", "swa-budget", "--variant", "pre_af7c62e", "--param", "prompts=1,3,2",
                         "--save", str(saved), "--json", "--junit", str(out))
    assert code == 1
    doc = json.loads(stdout)
    root = _read(schema, out)
    cases = _cases(root)
    liveness = RunSpec.resolve(catalog.models().model("swa-budget"), "pre_af7c62e").system().liveness
    names = list(doc["coverage"]["invariants"]) + [liveness] + [f"sometimes {r['name']}" for r in doc["reachability"]]
    assert len(doc["reachability"]) == 3 and sorted(c.get("name") for c in cases.values()) == sorted(names)
    (v,) = doc["violations"]
    failure = cases[f"kvsim.swa-budget.pre_af7c62e::{v['property']}"].find("failure")
    assert failure.get("message") == v["message"] and failure.get("type") == v["kind"]
    assert f"path ({len(v['trace'])} steps)" in failure.text and f"kvsim replay {saved}" in failure.text
    argv = _replay_line(failure.text)
    assert argv[:4] == ["explore", "swa-budget", "--variant", "pre_af7c62e"] and "prompts=1,3,2" in argv
    code, again = _main(capsys, *argv, "--json")
    assert code == 1 and json.loads(again)["violations"][0]["message"] == v["message"]
    assert _counts(root)["failures"] == 1 and _counts(root)["skipped"] == 0

    code, _ = _main(capsys, "explore", "swa-budget", "--max-depth", "3", "--junit", str(out))
    assert code == 3
    root = _read(schema, out)
    assert {_outcome(c) for c in root.iter("testcase")} == {"skipped"}
    assert "the depth bound stopped the search" in root.find(".//skipped").get("message")


def test_oracle_rows_on_torch_cpu_with_a_planted_prefix_variant(schema, tmp_path, capsys, monkeypatch):
    """Only mla-backends' kernel properties, only the torch-cpu backend (the C++ builds take minutes on a cold
    cache); merge_state_differential is run on the merge_nan_4051 variant, where it fails."""
    reg = catalog.load()
    props = [p for p in oracle.kernel_properties(reg) if p.model == "mla-backends"]
    rows = [dict(r, available=False, reason="left out by this test") if r["name"] != "torch-cpu" and r["available"]
            else r for r in oracle.backends()]
    real_run = oracle.run_kernel_property

    def planted(prop, backend, *, variant, **kwargs):
        if prop.name == "merge_state_differential":
            variant = "merge_nan_4051"
        return real_run(prop, backend, variant=variant, **kwargs)

    monkeypatch.setattr(oracle, "kernel_properties", lambda registry: props)
    monkeypatch.setattr(oracle, "backends", lambda: rows)
    monkeypatch.setattr(oracle, "run_kernel_property", planted)
    out = tmp_path / "oracle.xml"
    code, stdout = _main(capsys, "oracle", "--max-examples", "20", "--json", "--junit", str(out))
    assert code == 1
    doc = json.loads(stdout)
    root = _read(schema, out)
    cases = _cases(root)
    assert len(cases) == len(doc["checks"]) == sum(len(p.backends) for p in props)
    assert _counts(root) == {"tests": len(cases), "failures": 1, "errors": 0, "skipped": len(cases) - 2}
    failure = cases["kvsim.mla-backends.fixed::merge_state_differential[torch-cpu]"].find("failure")
    row = next(r for r in doc["checks"] if r["status"] == "failed")
    assert failure.get("message") == row["message"] and f"replay: {row['replay']}" in failure.text
    argv = _replay_line(failure.text)  # the row names the variant it failed on, and the backend
    assert "--backend" in argv and "merge_nan_4051" in argv
    assert _outcome(cases["kvsim.mla-backends.fixed::merge_state_matches_merge_attn_states[torch-cpu]"]) == "passed"
    assert cases["kvsim.mla-backends.fixed::merge_state_differential[cpu-shim]"].find("skipped").get(
        "message") == "left out by this test"


# -- conform ------------------------------------------------------------------------------------------------------

STAGING = "sglang/srt/disaggregation/common/staging_buffer.py"
DECODE = "sglang/srt/disaggregation/decode.py"
PLANT = ("unique_head_idx = local_tp_rank // src_replication", "unique_head_idx = local_tp_rank % src_replication")


def _extract(path: Path, names: set[str]) -> str:
    """The module's imports and the named top-level definitions, read out of the release's file."""
    text = path.read_text()
    keep = [node for node in ast.parse(text).body if isinstance(node, (ast.Import, ast.ImportFrom))
            or getattr(node, "name", None) in names]
    return "\n\n".join(ast.get_source_segment(text, node) for node in keep) + "\n"


@pytest.fixture(scope="module")
def sglang_tree(tmp_path_factory):
    """A tree from sglang 0.5.23 (the cached wheel) with two files: the staging layout functions as released but
    for the head-slice one, planted with the modulo bug, and a decode queue stub that cannot be loaded."""
    release = resolve_source("sglang", version="0.5.23")
    tree = tmp_path_factory.mktemp("sglang-planted")
    (tree / "sglang").mkdir()
    (tree / "sglang" / "__init__.py").write_text("")
    staging = _extract(release.file(STAGING), {"compute_head_slice_params", "compute_staging_layout"})
    assert staging.count(PLANT[0]) == 1
    for relpath, text in ((STAGING, staging.replace(*PLANT)),
                          (DECODE, "class DecodePreallocQueue:\n    pass\n")):
        (tree / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tree / relpath).write_text(text)
    return tree


def test_conform_targets_pass_fail_error_and_skip(schema, sglang_tree, tmp_path, capsys):
    out = tmp_path / "conform.xml"
    code, stdout = _main(capsys, "conform", "sglang", "--from", str(sglang_tree), "--max-examples", "20",
                         "--json", "--junit", str(out))
    assert code == 2  # the decode stub is a target that cannot be loaded
    doc = json.loads(stdout)
    root = _read(schema, out)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {t.name for t in targets("sglang")}
    assert {c.get("classname") for c in cases.values()} == {"kvsim.conform.sglang.local"}
    status = {r["target"]: r["status"] for r in doc["results"]}
    expected = {"conforms": "passed", "diverges": "failure", "error": "error", "not present": "skipped"}
    assert {name: _outcome(c) for name, c in cases.items()} == {n: expected[s] for n, s in status.items()}
    assert status["compute_staging_layout"] == "conforms" and status["_prealloc_required_tokens"] == "error"
    failure = cases["compute_head_slice_params"].find("failure")
    assert failure.get("type") == "divergence" and "code diverges from the model: " in failure.get("message")
    assert "\ninput " in failure.text and "code under test " in failure.text and "first difference: " in failure.text
    argv = _replay_line(failure.text)
    assert argv == ["conform", "sglang", "--from", str(sglang_tree), "--target", "compute_head_slice_params",
                    "--max-examples", "20"]
    assert cli.main(argv) == 1  # the pasted line reruns the one target, which diverges again
    capsys.readouterr()
    error = cases["_prealloc_required_tokens"].find("error")
    note = next(r["note"] for r in doc["results"] if r["target"] == "_prealloc_required_tokens")
    assert error.get("message") == note and "--target _prealloc_required_tokens" in error.text
    assert "absent in" in cases["send_plan"].find("skipped").get("message")


def test_conform_release_table_is_one_suite_per_release(schema, tmp_path, capsys):
    out = tmp_path / "table.xml"
    code, _ = _main(capsys, "conform", "sglang", "--versions", "0.5.23", "--target", "is_watermark_ready",
                    "--junit", str(out))
    assert code == 0
    root = _read(schema, out)
    (suite,) = root.findall("testsuite")
    (case,) = suite.iter("testcase")
    assert suite.get("name") == "kvsim conform sglang 0.5.23"
    assert (case.get("name"), case.get("classname"), _outcome(case)) == ("is_watermark_ready",
                                                                         "kvsim.conform.sglang.0_5_23", "passed")


# -- bad paths ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["missing/x.xml", ".", " ", "x\0.xml"])
def test_a_path_that_cannot_be_written_is_one_error_before_any_work(tmp_path, capsys, where):
    path = str(tmp_path / where) if where.strip() else where
    code, stdout = _main(capsys, "check", "swa-budget", "--json", "--junit", path)
    assert code == 2
    error = json.loads(stdout)["error"]
    assert (error["field"], error["expected"], error["received"]) == ("--junit", "a writable file path", path)
    assert conform_cli.main(["sglang", "--from", str(tmp_path), "--junit", path]) == 2
    assert "--junit: expected a writable file path" in capsys.readouterr().err
