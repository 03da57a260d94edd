"""The real command in a subprocess: exit codes, JSON keys, errors without tracebacks."""

import json

import pytest

from clihelp import kvsim, kvsim_json


def test_list_json_keys():
    doc = kvsim_json("list")
    assert {"models", "bugs"} <= set(doc)
    swa = next(m for m in doc["models"] if m["name"] == "swa-budget")
    assert swa["variants"] == ["fixed", "pre_af7c62e"] and "resumed_requests_fit_physical_pages" in swa["properties"]
    bug = next(b for b in doc["bugs"] if b["id"] == "sglang-af7c62e-swa-resume-budget")
    assert set(bug) >= {"id", "model", "variant", "property", "source", "summary", "status"}
    assert bug["status"] == "reproducible"


def test_check_exit_codes_and_keys():
    ok = kvsim_json("check", "swa-budget", "--max-examples", "30")
    assert ok["model"] == "swa-budget" and ok["variant"] == "fixed"
    assert all(set(r) >= {"property", "status", "examples", "seconds", "counterexample"} for r in ok["results"])
    assert {r["status"] for r in ok["results"]} == {"passed"}
    bad = kvsim_json("check", "swa-budget", "--variant", "pre_af7c62e", "--property",
                     "resumed_requests_fit_physical_pages", "--max-examples", "30", expect=1)
    (result,) = bad["results"]
    assert result["status"] == "failed" and result["counterexample"]["case"]["page_size"] == 128


def test_repro_single_bug_table():
    proc = kvsim("repro", "sglang-af7c62e-swa-resume-budget")
    assert proc.returncode == 0, proc.stderr
    assert "sglang-af7c62e-swa-resume-budget" in proc.stdout and "1 of 1 bug reports hold" in proc.stdout


def test_explore_and_graph(tmp_path):
    graph = tmp_path / "g.graphml"
    doc = kvsim_json("explore", "swa-budget", "--graph", str(graph))
    assert {"model", "variant", "states", "transitions", "depth", "seconds", "states_per_second", "bound_hit",
            "violations"} <= set(doc)
    assert doc["violations"] == [] and doc["states"] > 100 and graph.stat().st_size > 0
    bad = kvsim_json("explore", "swa-budget", "--variant", "pre_af7c62e", expect=1)
    assert bad["violations"][0]["property"] == "no_failed_allocation"
    assert bad["violations"][0]["kind"] == "invariant" and bad["violations"][0]["trace"][-1] == ["resume"]
    bounded = kvsim_json("explore", "swa-budget", "--max-depth", "3", expect=3)  # found nothing, proved nothing
    assert bounded["bound_hit"] == "depth" and bounded["complete"] is False and doc["complete"] is True
    text = kvsim("explore", "swa-budget", "--max-depth", "3")
    assert text.returncode == 3 and "INCOMPLETE: the depth bound stopped the search" in text.stdout


def test_simulate_and_replay_round_trip(tmp_path):
    trace = tmp_path / "t.jsonl"
    doc = kvsim_json("simulate", "swa-budget", "--seed", "2", "--param", "requests=40", "--trace", str(trace))
    assert {"model", "variant", "seed", "events", "sim_time", "digest", "summary"} <= set(doc)
    assert doc["summary"]["finished"] == 40 and doc["summary"]["leaked_pages"] == {"full": 0, "swa": 0}
    rep = kvsim_json("replay", str(trace))
    assert rep["trace"] == str(trace) and rep["digest"] == doc["digest"] and rep["matches"] is True
    assert rep["complete"] is True and rep["warnings"] == [] and rep["steps"] > 0


def test_simulate_pre_fix_crashes_and_exits_1():
    doc = kvsim_json("simulate", "swa-budget", "--variant", "pre_af7c62e", "--seed", "0", expect=1)
    assert doc["summary"]["crashed"] and "KV cache is full" in doc["summary"]["crash"]


@pytest.mark.parametrize("args, needle", [
    (["check", "nope"], "MODEL: expected one of "),
    (["check", "swa-budget", "--variant", "v9"], "--variant: expected one of fixed, pre_af7c62e"),
    (["check", "swa-budget", "--property", "p9"], "--property: expected one of resumed_requests_fit_physical_pages"),
    (["repro", "no-such-bug"], "BUG_ID: expected one of "),
    (["check", "swa-budget", "--max-examples", "0"], "--max-examples: expected an integer >= 1"),
    (["check", "swa-budget", "--seed", "x"], "--seed: expected an integer"),
    (["explore", "swa-budget", "--param", "page_size=0"], "--param page_size: expected an integer (>= 1 and <= 1024), got 0"),
    (["explore", "swa-budget", "--param", "bogus=1"], "--param: expected one of page_size"),
    (["explore", "swa-budget", "--param", "prompts=99,1,1"], "prompts[0] + outputs[0]: expected a request that fits"),
    (["simulate", "swa-budget", "--faults", "drop=0.5"], "--faults: expected fault kinds model swa-budget supports"),
    (["simulate", "swa-budget", "--faults", "drop=x"], "--faults drop: expected a probability"),
    (["simulate", "pd-protocol", "--faults", "timeout=1"],  # no fault kind of the simulator: refused in one line
     "--faults: expected kind=value with kind one of drop, delay, duplicate, reorder, garble, crash, got 'timeout=1'"),
    (["explore", "swa-budget", "--graph", "/nonexistent/dir/g.graphml"], "--graph: expected a writable file path"),
    (["repro"], "one of the arguments bug_id --all is required"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_with_message_and_no_traceback(args, needle):
    proc = kvsim(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_json_errors_exit_2_with_one_line_and_one_json_document():
    proc = kvsim("check", "nope", "--json")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "MODEL" in proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["field"] == "MODEL" and error["received"] == "nope" and "swa-budget" in error["expected"]
    usage = kvsim("explore", "swa-budget", "--max-dept", "3", "--json")  # an argument the parser refuses
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "Traceback" not in usage.stderr
    assert json.loads(usage.stdout)["error"]["field"] == "arguments"


def test_simulate_self_check_runs_the_seed_twice():
    doc = kvsim_json("simulate", "swa-budget", "--seed", "3", "--param", "requests=20", "--self-check")
    assert doc["self_check"] == {"digest": doc["digest"], "matches": True}


def test_progress_is_written_only_to_a_terminal():
    import io

    from kvsim.engine.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        p = Progress(2, "check", stream=stream)
        p.step("first")
        p.close()
    assert "check [1/2] first" in tty.getvalue() and pipe.getvalue() == ""


def test_unknown_names_list_the_valid_ones():
    assert "swa-budget" in kvsim("check", "nope").stderr
    assert "sglang-af7c62e-swa-resume-budget" in kvsim("repro", "no-such-bug").stderr


def test_backend_shorthand_reaches_the_model():
    doc = kvsim_json("simulate", "pd-protocol", "--backend", "mori", "--variant", "pre_35281", "--param",
                     "requests=30", "--faults", "crash=prefill@5", expect=1)
    assert doc["summary"]["backend"] == "mori" and doc["summary"]["violations"][0].startswith("P8")
    bad = kvsim("explore", "pd-protocol", "--backend", "tcp")
    assert bad.returncode == 2 and "--param backend: expected one of mooncake, nixl, mori" in bad.stderr


def test_list_one_model_shows_its_parameters():
    doc = kvsim_json("list", "swa-budget")
    (model,) = doc["models"]
    prompts = next(p for p in model["params"] if p["name"] == "prompts")
    assert prompts["type"] == "ints" and prompts["default"] == [1, 3, 2] and prompts["minimum"] == 1
    assert {p["name"] for p in model["sim_params"]} >= {"requests", "arrival_rate"}
    assert [b["id"] for b in doc["bugs"]] == ["sglang-af7c62e-swa-resume-budget"]
    text = kvsim("list", "swa-budget").stdout
    assert "explore / stateful parameters" in text and "prompts" in text and "1..1024" in text


def test_list_one_model_shows_what_explore_must_reach():
    """The reachability declarations `kvsim explore` reports reached or not, as the system declares them."""
    from kvsim.app.catalog import models
    from kvsim.engine.descriptor import RunSpec
    from kvsim.engine.system import sometimes

    doc = kvsim_json("list", "swa-budget")
    (model,) = doc["models"]
    declared = sometimes(RunSpec.resolve(models().model("swa-budget"), "fixed").system())
    assert [(r["name"], r["of"]) for r in model["sometimes"] if r["of"] != "case"] == [
        (s.name, "step" if s.step else "state") for s in declared]
    assert ("a_fill_ends_mid_page", "case") in [(r["name"], r["of"]) for r in model["sometimes"]]  # kvsim check's
    assert ("a_retracted_request_resumes", "step") in [(r["name"], r["of"]) for r in model["sometimes"]]
    text = kvsim("list", "swa-budget").stdout
    assert "  a_retracted_request_resumes*: " in text and "  a_request_is_retracted: " in text
    # no transition system: what the cases its properties draw must sometimes be (kvsim check reports each)
    zeroing = kvsim_json("list", "kv-zeroing")["models"][0]["sometimes"]
    assert [(r["name"], r["of"]) for r in zeroing] == [
        ("a_block_of_several_kernel_blocks", "case"), ("groups_sharing_an_allocation", "case"),
        ("a_mamba_state", "case"), ("several_blocks_a_call", "case")]
    assert "zeroed_blocks_are_cleared" in zeroing[0]["properties"] and len(zeroing[0]["properties"]) == 5
    text = kvsim("list", "kv-zeroing").stdout
    assert "  a_mamba_state~: a state tensor the zeroer must leave alone (5 properties)" in text


def test_check_counterexample_saves_and_replays(tmp_path):
    saved = tmp_path / "cx.json"
    proc = kvsim("check", "swa-budget", "--variant", "pre_af7c62e", "--property",
                 "resumed_requests_fit_physical_pages", "--max-examples", "30", "--save", str(saved))
    assert proc.returncode == 1 and f"kvsim replay {saved}" in proc.stdout
    doc = kvsim_json("replay", str(saved))
    assert doc["matches"] and doc["command"] == "check" and doc["check"] == "resumed_requests_fit_physical_pages"
    # the --json output of check is a counterexample file too
    out = tmp_path / "check.json"
    out.write_text(kvsim("check", "swa-budget", "--variant", "pre_af7c62e", "--property",
                         "resumed_requests_fit_physical_pages", "--max-examples", "30", "--json").stdout)
    assert kvsim_json("replay", str(out))["matches"]


def test_stateful_failure_prints_a_step_program_and_replays(tmp_path):
    saved = tmp_path / "stateful.json"
    proc = kvsim("check", "swa-budget", "--variant", "pre_af7c62e", "--property", "scheduler_invariants",
                 "--max-examples", "300", "--save", str(saved))
    assert proc.returncode == 1
    assert "state = initial_state()" in proc.stdout and "state = step(state, resume())" in proc.stdout
    assert "check(state)  # no_failed_allocation fails here" in proc.stdout
    doc = kvsim_json("replay", str(saved))
    assert doc["matches"] and doc["program"][-2] == "state = step(state, resume())"


def test_explore_violation_saves_and_replays_and_a_wrong_path_is_caught(tmp_path):
    saved = tmp_path / "path.json"
    proc = kvsim("explore", "swa-budget", "--variant", "pre_af7c62e", "--save", str(saved))
    assert proc.returncode == 1
    doc = kvsim_json("replay", str(saved))
    assert doc["matches"] and doc["steps"] == 10 and "KV cache is full" in doc["message"]
    # the same path on the fixed variant does not end in the violation
    data = json.loads(saved.read_text())
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({**data, "variant": "fixed"}))
    assert kvsim_json("replay", str(fixed), expect=1)["matches"] is False
    # a path with an action that is not enabled is refused at that step
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**data, "trace": [["decode"]] + data["trace"]}))
    doc = kvsim_json("replay", str(broken), expect=1)
    assert doc["matches"] is False and doc["message"].startswith("step 1: action")


def test_explore_hang_replays(tmp_path):
    out = tmp_path / "explore.json"
    proc = kvsim("explore", "pd-staging", "--variant", "pre_05c7ebf", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    hang = next(v for v in doc["violations"] if v["kind"] == "hang")
    out.write_text(json.dumps({**doc, "violations": [hang]}))
    replayed = kvsim_json("replay", str(out))
    assert replayed["matches"] and "no done state is reachable" in replayed["message"]


def test_check_backend_runs_the_models_kernel_properties():
    doc = kvsim_json("check", "kv-zeroing", "--backend", "cpu-shim", "--max-examples", "10")
    rows = {r["property"]: r["status"] for r in doc["results"]}
    assert rows["zero_kv_blocks_differential"] == "passed" and rows["zero_kv_blocks_sentinel"] == "passed"
    assert rows["zero_kv_blocks_asan_catches_pre_d6af803"] == "skipped"  # an ASan-only property
    assert "zeroing_preserves_other_bytes" not in rows  # --backend selects the kernel properties
    plain = kvsim_json("check", "kv-zeroing", "--property", "zero_kv_blocks_sentinel", "--max-examples", "5")
    assert plain["results"][0]["status"] == "skipped" and "--backend" in plain["results"][0]["message"]


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from kvsim.app.cli import _parser

    missing = []
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            text = action.help or ""
            shows_default = action.default in (None, False, [], "") or "default" in text
            if not text or not shows_default:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_oracle_stops_at_its_budget_with_what_ran():
    # wherever the budget stopped it (before the first run on a busy machine, or after several), the document is a
    # complete run's, and what ran and what did not add up to every run
    proc = kvsim("oracle", "--max-examples", "5", "--max-seconds", "1", "--json")
    doc = json.loads(proc.stdout)
    assert set(doc) == {"backends", "checks", "complete", "not_run", "stopped_by", "totals"}
    if doc["complete"]:  # only a machine that runs every kernel property in a second
        assert proc.returncode == 0 and doc["stopped_by"] is None and doc["not_run"] == []
    else:
        assert proc.returncode == 3 and doc["stopped_by"] == "max-seconds" and doc["not_run"]
    assert all(c["status"] in ("passed", "skipped") for c in doc["checks"])
    ran = {f"{c['name']} on {c['backend']}" for c in doc["checks"] if c["status"] != "skipped"}
    assert not ran & set(doc["not_run"]) and doc["totals"]["passed"] == len(ran)


def test_list_shows_each_findings_verdict_per_release():
    doc = kvsim_json("list", "pd-protocol")
    bug = next(b for b in doc["bugs"] if b["id"] == "sglang-pd-common-failed-not-sticky")
    assert any(v["state"] == "fixed" for v in bug["verdicts"])
    ctx = next(b for b in doc["bugs"] if b["id"] == "sglang-pr35281-staging-ctx-race")
    assert any(v["release"] == "0.5.23" and v["state"] == "not reachable" and v["reason"] for v in ctx["verdicts"])
    text = kvsim("list", "pd-protocol").stdout
    assert "upstream releases" in text and "0.5.23 not reachable" in text
