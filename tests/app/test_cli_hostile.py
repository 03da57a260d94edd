"""Issue 11, sections 1-4: one test per reported hostile input (bounded work, no false green, traces as
untrusted input, one-line errors in text and JSON).

Most run the command line in process (`kvsim.app.cli.main`); a few run it in a subprocess where the
process boundary is the point (a deeply nested line, a run that must stop by its budget).
"""

from __future__ import annotations

import json
import time

import pytest

from kvsim.app.cli import main
from kvsim.engine.trace import MAX_LINE
from clihelp import kvsim


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, out, err, *needles, json_mode=False):
    assert code == 2, (code, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    if json_mode:
        doc = json.loads(out)
        assert set(doc["error"]) >= {"field", "expected", "received", "message"}
        return doc["error"]
    return lines[0]


# -- 1. every input has bounded work ----------------------------------------------------------------

@pytest.mark.parametrize("argv, field", [
    (["simulate", "pd-protocol", "--param", "chunks=1000000000000000000"], "chunks"),
    (["simulate", "pd-staging", "--param", "ring_units=1000000000000000000"], "ring_units"),
    (["simulate", "pd-staging", "--param", "ring_units=1e18"], "ring_units"),
    (["simulate", "swa-budget", "--param", "prompt_max=1000000000000000000"], "prompt_max"),
    (["explore", "swa-budget", "--param", "prompts=1000000000000000000", "--param", "outputs=1"], "prompts"),
    (["simulate", "swa-budget", "--param", "arrival_rate=0.000001", "--param", "requests=10"], "arrival_rate"),
])
def test_a_parameter_past_its_range_is_refused_before_any_work(capsys, argv, field):
    start = time.perf_counter()
    one_line_error(*run(capsys, *argv), field)
    assert time.perf_counter() - start < 5


def test_every_parameter_of_every_model_has_a_range(capsys):
    code, out, _ = run(capsys, "list", "--json")
    models = json.loads(out)["models"]
    for m in models:
        code, out, _ = run(capsys, "list", m["name"], "--json")
        doc = json.loads(out)["models"][0]
        for p in doc["params"] + doc["sim_params"]:
            if p["type"] == "str":
                continue  # names: a choice list or a spec the model parses (pd-staging's fault kinds)
            assert p["maximum"] is not None and p["minimum"] is not None, (m["name"], p["name"])


def test_a_slow_workload_in_range_ends_at_the_event_budget_incomplete(capsys):
    code, out, _ = run(capsys, "simulate", "swa-budget", "--param", "arrival_rate=0.01", "--param", "requests=100000",
                       "--max-events", "20000", "--json")
    doc = json.loads(out)
    assert code == 3 and doc["complete"] is False and doc["stopped_by"] == "max-events" and doc["events"] == 20000


def test_simulate_stops_at_max_seconds_and_says_so(capsys):
    start = time.perf_counter()
    code, out, _ = run(capsys, "simulate", "pd-protocol", "--param", "requests=10000", "--param", "chunks=1024",
                       "--max-seconds", "1")
    assert time.perf_counter() - start < 10
    assert code in (1, 3) and "INCOMPLETE: the --max-seconds 1 budget stopped the run" in out


def test_check_stops_at_max_seconds_with_what_it_ran(capsys):
    # pd-staging's properties take tens of seconds at 200 examples: the 1 s budget always runs out first
    code, out, _ = run(capsys, "check", "pd-staging", "--max-seconds", "1", "--json")
    doc = json.loads(out)
    assert code == 3 and doc["complete"] is False and doc["stopped_by"] == "max-seconds" and doc["not_run"]
    assert all(r["status"] == "passed" for r in doc["results"])


def test_a_max_seconds_alarm_swallowed_where_it_landed_fires_again():
    # an exception raised in a garbage-collector callback is printed as unraisable and dropped: the budget must
    # still end the command, so the alarm fires again until it gets through (and stops once the command ends)
    import signal
    import time

    from kvsim.app.cli import EXPIRED_AGAIN, BudgetExceeded, _deadline

    swallowed = 0
    start = time.perf_counter()
    with pytest.raises(BudgetExceeded):
        with _deadline(0.05):
            while time.perf_counter() - start < 5:
                try:
                    time.sleep(0.01)
                except BudgetExceeded:
                    swallowed += 1
                    if swallowed == 2:
                        raise
    assert swallowed == 2 and time.perf_counter() - start < 0.05 + 2 * EXPIRED_AGAIN + 1
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_explore_stops_at_max_seconds_incomplete(capsys):
    code, out, _ = run(capsys, "explore", "pd-staging", "--param", "rooms=2", "--max-seconds", "0.3", "--json")
    doc = json.loads(out)
    assert code == 3 and doc["complete"] is False and doc["bound_hit"] == "seconds" and doc["states"] > 0


@pytest.mark.parametrize("command", ["check swa-budget", "repro --all", "explore swa-budget",
                                     "simulate swa-budget", "oracle", "replay x.jsonl"])
def test_every_long_running_command_documents_its_budget(capsys, command):
    with pytest.raises(SystemExit):
        main(command.split()[:1] + ["--help"])
    out = capsys.readouterr().out
    assert "--max-seconds" in out and "default:" in out
    if command.startswith(("simulate", "replay")):
        assert "--max-events" in out


@pytest.mark.parametrize("spec, needle", [
    ("drop=nan", "drop"), ("delay=0.5:inf", "delay"), ("crash=prefill@nan", "crash"),
    ("crash=prefill@-1", "crash"), ("drop=0.1,drop=0.9", "drop"), ("crash=nobody@5", "prefill"),
])
def test_bad_fault_specs_are_one_line_errors(capsys, spec, needle):
    one_line_error(*run(capsys, "simulate", "pd-staging", "--faults", spec), needle)


@pytest.mark.parametrize("param", ["arrival_rate=nan", "step_time=nan", "arrival_rate=inf"])
def test_nan_and_inf_parameters_are_refused(capsys, param):
    one_line_error(*run(capsys, "simulate", "swa-budget", "--param", param), param.split("=")[0])


def test_a_crash_peer_is_checked_for_every_model(capsys):
    one_line_error(*run(capsys, "simulate", "pd-protocol", "--faults", "crash=decode@1"), "prefill")
    one_line_error(*run(capsys, "simulate", "pd-staging", "--faults", "crash=decode@1"), "prefill")


# -- 2. no false green --------------------------------------------------------------------------------

def test_a_bounded_search_that_found_nothing_exits_3(capsys):
    code, out, _ = run(capsys, "explore", "pd-staging", "--variant", "pre_05c7ebf", "--max-depth", "3")
    assert code == 3 and "INCOMPLETE" in out and "depth" in out
    code, out, _ = run(capsys, "explore", "pd-staging", "--variant", "pre_05c7ebf", "--max-depth", "3", "--json")
    assert code == 3 and json.loads(out)["complete"] is False


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(f" {n} " in out for n in ("0", "1", "2", "3"))


# -- 3. traces are untrusted input --------------------------------------------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "run.jsonl"
    assert main(["simulate", "swa-budget", "--param", "requests=30", "--trace", str(path)]) == 0
    return path.read_text().splitlines()


def _write(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _with_header(lines, **changes):
    header = json.loads(lines[0])
    header.update(changes)
    return [json.dumps(header)] + lines[1:]


@pytest.mark.parametrize("changes, needle", [
    ({"model": ["swa-budget"]}, "header field model"),
    ({"params": ["requests"]}, "header field params"),
    ({"seed": [1]}, "header field seed"),
    ({"seed": True}, "header field seed"),
    ({"faults": 3}, "header field faults"),
    ({"variant": 7}, "header field variant"),
    ({"version": 1}, "header field version"),
    ({"params": {"requests": True}}, "requests"),
    ({"params": {"requests": "30"}}, "requests"),
    ({"params": {"requests": 100000, "arrival_rate": 1e-6}}, "arrival_rate"),
    ({"params": {"nobody": 1}}, "nobody"),
    ({"model": "nope"}, "unknown model"),
    ({"variant": "nope"}, "variant"),
    ({"faults": "crash=nobody@1"}, "faults"),
    ({"extra": 1}, "header field \"extra\""),
])
def test_a_bad_header_is_one_line_naming_the_field_before_anything_runs(capsys, tmp_path, recorded, changes, needle):
    path = _write(tmp_path, _with_header(recorded, **changes))
    start = time.perf_counter()
    error = one_line_error(*run(capsys, "replay", path, "--json"), needle, ":1:", json_mode=True)
    assert error["field"].endswith(":1")
    assert time.perf_counter() - start < 5


def test_a_deeply_nested_line_is_an_error_not_a_recursion_error(tmp_path, recorded):
    path = _write(tmp_path, recorded[:2] + ["[" * 200_000 + "]" * 200_000] + recorded[3:])
    proc = kvsim("replay", path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert ":3:" in proc.stderr and "nested too deeply" in proc.stderr
    deep_header = _write(tmp_path, ['{"kvsim_trace": 1, "params": ' + "[" * 200_000 + "]" * 200_000 + "}"])
    proc = kvsim("replay", deep_header, "--json")
    assert proc.returncode == 2 and ":1:" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"]["field"].endswith(":1")


def test_a_huge_line_is_an_error(capsys, tmp_path, recorded):
    path = _write(tmp_path, recorded[:3] + ['{"i": 2, "data": "' + "x" * (MAX_LINE + 10) + '"}'] + recorded[4:])
    one_line_error(*run(capsys, "replay", path), ":4:", "longer than")


def test_replay_reports_a_wrong_line_3_at_once_without_reading_the_rest(capsys, tmp_path, recorded):
    lines = list(recorded)
    row = json.loads(lines[2])
    row["t"] += 1.0
    lines[2] = json.dumps(row)
    # a tail that is not even JSON: a streaming replay stops at line 3 and never reads it
    path = _write(tmp_path, lines[:3] + ["{not json"] * 1000)
    code, out, _ = run(capsys, "replay", path)
    assert code == 1 and ":3: diverged" in out


def test_a_trace_of_another_version_warns_with_both_versions(capsys, tmp_path, recorded):
    from kvsim import __version__

    path = _write(tmp_path, _with_header(recorded, version="0.0.1"))
    code, out, err = run(capsys, "replay", path)
    assert code == 0 and "matches" in out
    assert err.count("\n") == 1 and "warning" in err and "0.0.1" in err and __version__ in err


def test_a_trace_of_another_format_is_an_error(capsys, tmp_path, recorded):
    path = _write(tmp_path, _with_header(recorded, kvsim_trace=2, version="9.0"))
    one_line_error(*run(capsys, "replay", path), "format 2", "9.0")


def test_a_trace_a_budget_stopped_replays(capsys, tmp_path):
    path = str(tmp_path / "inc.jsonl")
    assert main(["simulate", "swa-budget", "--max-events", "300", "--trace", path]) == 3
    code, out, _ = run(capsys, "replay", path)
    assert code == 0 and "matches" in out


# -- 4. errors are one line, in text and JSON --------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["explore", "swa-budget", "--max-dept", "3"],
    ["simulate"],
    ["check", "swa-budget", "--max-examples", "zero"],
    ["bogus"],
    ["simulate", "swa-budget", "--max-seconds", "nan"],
    ["simulate", "swa-budget", "--max-events", "0"],
])
def test_argument_errors_are_one_line_and_json(capsys, argv):
    one_line_error(*run(capsys, *argv))
    one_line_error(*run(capsys, *argv, "--json"), json_mode=True)


@pytest.mark.parametrize("option, value, expected", [
    ("--max-examples", "zero", "an integer"), ("--max-seconds", "nan", "a finite number > 0"),
    ("--max-memory", "-1", "a finite number > 0"), ("--workers", "0", "an integer >= 1")])
def test_a_bad_option_value_names_its_option_once_with_the_value_received(capsys, option, value, expected):
    command = "check" if option == "--max-examples" else "explore"
    err = run(capsys, command, "swa-budget", f"{option}={value}")[2]
    assert err.startswith(f"kvsim: error: {option}: expected {expected}, got {value!r}") and err.count(option) == 1
    code, out, err = run(capsys, command, "swa-budget", f"{option}={value}", "--json")
    error = json.loads(out)["error"]
    assert code == 2 and (error["field"], error["expected"], error["received"]) == (option, expected, value)


@pytest.mark.parametrize("argv", [
    ["simulate", "swa-budget", "--trace", ""],
    ["check", "swa-budget", "--save", ""],
    ["explore", "swa-budget", "--graph", ""],
])
def test_empty_output_paths_are_errors(capsys, argv):
    one_line_error(*run(capsys, *argv, "--json"), json_mode=True)


def test_an_error_echoing_control_characters_stays_one_line(capsys):
    # found by tests/test_fuzz_cli.py: U+001E (and newlines) in an argument split the error line
    line = one_line_error(*run(capsys, "check", "swa-budget", "--faults", "\x1e\nx"))
    assert "\\x1e" in line and "\\n" in line


@pytest.mark.parametrize("argv", [
    ["explore", "swa-budget", "--workers", "200", "--max-memory", "1"],
    ["fuzz", "swa-budget", "--workers", "1000000", "--minutes", "0.01"],
])
def test_more_forked_workers_than_the_memory_bound_holds_are_refused_before_any_fork(capsys, monkeypatch, argv):
    import os

    from kvsim.engine import memory

    monkeypatch.setattr(os, "fork", lambda: pytest.fail("a worker was forked"))
    # this process's size as the bound counts it: fixed, so the bound does not depend on what the test process loaded
    monkeypatch.setattr(memory, "resident_bytes", lambda: 100 * 2 ** 20)
    code, out, err = run(capsys, *argv, "--json")
    error = json.loads(out)["error"]
    assert code == 2 and error["field"] == "--workers" and error["received"] == int(argv[3])
    assert error["expected"].startswith("at most ") and "forked workers: each starts as a copy of this" in err
    bound = int(error["expected"].split()[2])
    assert 0 < bound < int(argv[3])
