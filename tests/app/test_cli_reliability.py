"""Issue 34: the remaining bad inputs, signals that lost results, checkpoints that could run code, and a report
without matplotlib. One test (or one parametrized test) per reported behaviour.

Most run the command line in process (`kvsim.app.cli.main`); the signal tests send SIGINT or SIGTERM to a real
`kvsim` subprocess and bound the wait for it, and the matplotlib tests hide the package in a subprocess.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from clihelp import ROOT
from kvsim.app import cli
from kvsim.app.commands import check as check_command
from kvsim.engine.explore.checkpoint import CURRENT, KEY_FILE
from kvsim.engine.interrupt import BudgetExceeded

# the keys of each command's complete --json document: a cut-off run prints the same ones
CHECK_KEYS = {"model", "variant", "seed", "max_examples", "params", "backend", "results", "complete", "stopped_by",
              "not_run"}
REPRO_KEYS = {"seed", "bugs", "complete", "stopped_by", "not_run", "errors"}
SIMULATE_KEYS = {"model", "variant", "seed", "events", "sim_time", "seconds", "digest", "complete", "stopped_by",
                 "summary"}
ORACLE_KEYS = {"backends", "checks", "complete", "not_run", "stopped_by", "totals"}


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, out, err, *needles):
    assert code == 2, (code, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- kvsim report and show without matplotlib --------------------------------------------------------------------

HIDDEN = """
import sys
sys.modules["matplotlib"] = None  # as if the charts extra were not installed
from kvsim.app import catalog, cli
reg = catalog.load()
for bug in list(reg.bugs):  # two quick reports: one explored, one found by Hypothesis
    if bug not in ("sglang-05c7ebf-staging-prefix-overwrite", "flashinfer-4051-merge-empty-nan"):
        del reg.bugs[bug]
sys.exit(cli.main(sys.argv[1:]))
"""


def _without_matplotlib(*argv):
    return subprocess.run([sys.executable, "-c", HIDDEN, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_report_without_matplotlib_writes_the_site_without_charts_and_says_so(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"workers": 1, "states_per_second": 9.0}]}))
    proc = _without_matplotlib("report", "--out", str(tmp_path / "site"), "--bench", str(bench), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["charts"] == [] and "pip install 'kvsim[charts]'" in doc["without_charts"]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "matplotlib is not installed (pip install &#x27;kvsim[charts]&#x27;)" in index  # as HTML escapes it
    page = (tmp_path / "site" / "bugs" / "sglang-05c7ebf-staging-prefix-overwrite.html").read_text()
    assert "matplotlib is not installed" in page and "<img" not in page and "state" in page  # the chart as text
    text = _without_matplotlib("report", "--out", str(tmp_path / "again"))
    assert text.returncode == 0 and "no charts: matplotlib is not installed" in text.stdout


def test_show_out_without_matplotlib_is_one_line_naming_the_extra(tmp_path):
    proc = _without_matplotlib("show", "sglang-05c7ebf-staging-prefix-overwrite", "--out", str(tmp_path / "c.svg"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "pip install 'kvsim[charts]'" in proc.stderr
    text = _without_matplotlib("show", "sglang-05c7ebf-staging-prefix-overwrite")  # as text, it needs none
    assert text.returncode == 0 and "Traceback" not in text.stderr


# -- counterexample files are untrusted input --------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A stateful check counterexample, a data-property one and an explored path, as `--save` writes them."""
    folder = tmp_path_factory.mktemp("cx")
    files = {"stateful": folder / "stateful.json", "case": folder / "case.json", "path": folder / "path.json"}
    assert cli.main(["check", "swa-budget", "--variant", "pre_af7c62e", "--property", "scheduler_invariants",
                     "--max-examples", "300", "--save", str(files["stateful"])]) == 1
    assert cli.main(["check", "swa-budget", "--variant", "pre_af7c62e", "--property",
                     "resumed_requests_fit_physical_pages", "--max-examples", "30", "--save", str(files["case"])]) == 1
    assert cli.main(["explore", "pd-staging", "--variant", "pre_05c7ebf", "--save", str(files["path"])]) == 1
    return {name: json.loads(path.read_text()) for name, path in files.items()}


def _set(*keys, value):
    def change(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value
    return change


TAMPERED = [  # (the file, its change, the key the error names)
    ("stateful", _set("counterexample", "actions", 1, value=["fly"]), "counterexample.actions[1]"),
    ("stateful", _set("counterexample", "actions", 3, value=["retract", "1"]), "counterexample.actions[3]"),
    ("stateful", _set("counterexample", "actions", 3, value=["retract"]), "counterexample.actions[3]"),
    ("stateful", _set("counterexample", "actions", value="x"), "counterexample.actions"),
    ("stateful", _set("counterexample", value=None), "'counterexample'"),
    ("stateful", _set("counterexample", "invariant", value="nope"), "counterexample.invariant"),
    ("stateful", _set("counterexample", "initial", "full_free", value=99), "counterexample.initial"),
    ("stateful", _set("counterexample", "initial", value={"nothing": 1}), "counterexample.initial"),
    ("stateful", _set("kvsim_counterexample", value=99), "kvsim_counterexample"),
    ("stateful", _set("kvsim_counterexample", value=True), "kvsim_counterexample"),
    ("stateful", _set("model", value="nope"), "'model'"),
    ("stateful", _set("variant", value="nope"), "'variant'"),
    ("stateful", _set("property", value="nope"), "'property'"),
    ("stateful", _set("params", value=[1]), "'params'"),
    ("stateful", _set("params", value={"page_size": "2"}), "params.page_size"),
    ("stateful", _set("params", value={"page_size": 10 ** 9}), "'params'"),
    ("case", _set("seed", value="0"), "'seed'"),
    ("case", _set("max_examples", value=0), "'max_examples'"),
    ("case", _set("backend", value="cpu-shim"), "'backend'"),
    ("case", _set("counterexample", value={"message": "no case"}), "'counterexample'"),
    ("path", _set("invariant", value="nope"), "'invariant'"),
    ("path", _set("kind", value="deadlock"), "'kind'"),
    ("path", _set("trace", value="x"), "'trace'"),
    ("path", _set("trace", 0, value=["batch"]), "trace[0]"),
    ("path", _set("trace", 0, value=7), "trace[0]"),
    ("path", _set("command", value="simulate"), "'command'"),
]


@pytest.mark.parametrize("name, change, key", TAMPERED, ids=[f"{n}-{k}-{i}" for i, (n, _, k) in enumerate(TAMPERED)])
@pytest.mark.parametrize("command", ["replay", "show"])
def test_a_tampered_counterexample_is_bad_input_naming_the_key(saved, tmp_path, capsys, name, change, key, command):
    doc = copy.deepcopy(saved[name])
    change(doc)
    path = tmp_path / "cx.json"
    path.write_text(json.dumps(doc))
    argv = ["replay", str(path)] if command == "replay" else ["show", "--from", str(path)]
    line = one_line_error(*run(capsys, *argv))
    if command == "replay" or key != "counterexample.actions[3]":  # show: a step of the wrong type does not replay
        assert f"counterexample field {key}" in line or f"counterexample field '{key}'" in line, line


@pytest.mark.parametrize("key, value", [("variant", "nope"), ("seed", "0"), ("kind", "deadlock")])
def test_a_tampered_counterexample_under_json_names_the_key_as_the_field(saved, tmp_path, capsys, key, value):
    doc = copy.deepcopy(saved["path" if key == "kind" else "case"])
    doc[key] = value
    path = tmp_path / "cx.json"
    path.write_text(json.dumps(doc))
    code, out, _ = run(capsys, "replay", str(path), "--json")
    error = json.loads(out)["error"]
    assert code == 2 and error["field"] == key and error["received"] == value and error["expected"], error
    assert error["message"].startswith(f"{path}:1: counterexample field '{key}'")


@pytest.mark.parametrize("name", ["stateful", "case", "path"])
def test_an_intact_counterexample_still_replays_and_shows(saved, tmp_path, capsys, name):
    path = tmp_path / "cx.json"
    path.write_text(json.dumps(saved[name]))
    code, out, _ = run(capsys, "replay", str(path), "--json")
    assert code == 0 and json.loads(out)["matches"] is True
    assert run(capsys, "show", "--from", str(path))[0] == 0


def test_a_path_of_the_right_types_that_is_not_enabled_is_not_reproduced_not_bad_input(saved, tmp_path, capsys):
    doc = copy.deepcopy(saved["stateful"])
    doc["counterexample"]["actions"][3] = ["retract", 7]  # a request that is not there: the model says no
    path = tmp_path / "cx.json"
    path.write_text(json.dumps(doc))
    code, out, _ = run(capsys, "replay", str(path), "--json")
    assert code == 1 and json.loads(out)["matches"] is False


# -- checkpoints are authenticated before anything of them is unpickled ------------------------------------------

class Payload:
    """What a hostile checkpoint would carry: unpickling it makes a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _saved_search(folder, *extra):
    assert cli.main(["explore", "swa-budget", "--max-states", "20", "--checkpoint", str(folder), *extra]) == 3
    return folder / (folder / CURRENT).read_text().strip()


def _never_unpickled(monkeypatch, target, everything: bool):
    """Fail the test where `target` is unpickled (and, with `everything`, where anything is)."""
    real = pickle.load

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint that does not verify was unpickled")

    def load(f, *args, **kwargs):
        if everything or os.path.samefile(f.name, target):
            refuse()
        return real(f, *args, **kwargs)

    monkeypatch.setattr(pickle, "load", load)
    if everything:
        monkeypatch.setattr(pickle, "loads", refuse)
        monkeypatch.setattr(pickle, "Unpickler", refuse)


def test_the_checkpoint_key_is_made_private_on_first_use(private_cache, tmp_path, capsys):
    _saved_search(tmp_path / "search")
    key = private_cache / KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    key.chmod(0o644)  # readable by others: what it signs could be anyone's
    line = one_line_error(*run(capsys, "explore", "swa-budget", "--max-states", "40", "--resume",
                               str(tmp_path / "search")))
    assert "checkpoint key" in line and str(key) in line


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("how", ["tampered", "foreign", "plain pickle"])
def test_a_checkpoint_that_does_not_verify_is_refused_before_it_is_unpickled(private_cache, tmp_path, capsys,
                                                                             monkeypatch, how, workers):
    extra = ["--workers", "2"] if workers == 2 else []
    folder = tmp_path / "search"
    if how == "foreign":  # someone else's checkpoint, in a folder we share: made with their key
        monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "someone-else"))
    gen = _saved_search(folder, *extra)
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(private_cache))
    target = gen / ("partition-1.pkl" if workers == 2 else "search.pkl")
    marker = tmp_path / "ran-code"
    if how == "tampered":
        data = bytearray(target.read_bytes())
        data[-3] ^= 1
        target.write_bytes(bytes(data))
    elif how == "plain pickle":  # a checkpoint file as an attacker writes it: no tag at all
        target.write_bytes(pickle.dumps(Payload(str(marker))))
    _never_unpickled(monkeypatch, target, everything=workers == 1)  # workers: the coordinator's part verifies
    line = one_line_error(*run(capsys, "explore", "swa-budget", "--max-states", "40", "--resume", str(folder),
                               *extra), "--resume", "does not verify")
    assert "was unpickled" not in line and not marker.exists()


# -- Ctrl-C and SIGTERM: check, repro, simulate stop cleanly and report what ran -----------------------------------

def _handles_sigterm(pid: int) -> bool:
    """Whether the process has its own SIGTERM handler (kvsim's, once the command started)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            caught = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _interrupted(argv: list[str], sig: int, cwd) -> tuple[int, dict, str]:
    """Run `kvsim ARGV --json`, send `sig` once the command handles signals, and wait for it (at most 120 s)."""
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", *argv, "--json"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # the interpreter starts and kvsim installs its handlers (at most 60 s)
            if _handles_sigterm(proc.pid) or proc.poll() is not None:
                break
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)  # a command that does not stop fails here
    finally:
        proc.kill()
    return proc.returncode, json.loads(out) if out.strip() else {}, err


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to see the handlers")

SIGNALLED = [
    (["check", "pd-staging", "--save", "cx.json", "--junit", "check.xml"], CHECK_KEYS),
    (["repro", "--all", "--junit", "repro.xml"], REPRO_KEYS),
    (["simulate", "pd-protocol", "--param", "requests=10000", "--param", "chunks=1024", "--trace", "t.jsonl"],
     SIMULATE_KEYS),
]


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("argv, keys", SIGNALLED, ids=[a[0] for a, _ in SIGNALLED])
def test_a_signal_stops_the_command_cleanly_with_what_ran(tmp_path, argv, keys, sig):
    code, doc, err = _interrupted(argv, sig, tmp_path)
    assert code == 3, (code, err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert set(doc) == keys and doc["complete"] is False and doc["stopped_by"] == "interrupt"
    if "not_run" in doc:
        assert doc["not_run"]  # what did not run is named
    for name in ("check.xml", "repro.xml"):
        if (tmp_path / name).exists():  # the JUnit file is written, with what did not run as skipped
            skipped = ET.parse(tmp_path / name).getroot().iter("skipped")
            assert all("an interrupt (Ctrl-C or SIGTERM)" in s.get("message") for s in skipped)
    if argv[0] == "simulate":
        assert doc["events"] > 0 and (tmp_path / "t.jsonl").exists()


def test_ctrl_c_at_a_property_stops_check_there(capsys, monkeypatch):
    # the signal arrives as the second property starts: the first is reported, the rest named as not run
    real, calls = check_command.check_one, []

    def second_interrupted(prop, *args):
        calls.append(prop.name)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(prop, *args)

    monkeypatch.setattr(check_command, "check_one", second_interrupted)
    code, out, err = run(capsys, "check", "swa-budget", "--max-examples", "20", "--json")
    doc = json.loads(out)
    assert code == 3 and set(doc) == CHECK_KEYS and doc["stopped_by"] == "interrupt"
    assert [r["property"] for r in doc["results"]] == calls[:1] and doc["not_run"][0] == calls[1]


def test_ctrl_c_that_lands_in_a_garbage_collector_callback_is_not_lost(capsys, monkeypatch):
    # what hung `kvsim check ... --save ... --junit ...`: Hypothesis installs a gc callback, and a KeyboardInterrupt
    # raised inside one is printed and dropped, so the command ran on to its end
    real, calls = check_command.check_one, []

    def in_gc_callback():
        def callback(phase, info):
            gc.callbacks.remove(callback)
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # Python code runs in the callback: the signal's handler runs here

        gc.callbacks.append(callback)
        gc.collect()

    def second_interrupted(prop, *args):
        calls.append(prop.name)
        if len(calls) == 2:
            in_gc_callback()
        return real(prop, *args)

    monkeypatch.setattr(check_command, "check_one", second_interrupted)
    code, out, err = run(capsys, "check", "swa-budget", "--max-examples", "20", "--json")
    assert code == 3 and json.loads(out)["not_run"][0] == calls[1] and "Traceback" not in err


LATE_CTRL_C = """
import atexit, os, signal, sys, time
from kvsim.app import cli

def late():  # the interpreter is shutting down, the command's output is out: then the user's Ctrl-C lands
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)

atexit.register(late)
sys.argv = ["kvsim", "list", "--json"] + sys.argv[1:]
cli.entry()
"""


@pytest.mark.parametrize("extra, code", [([], 0), (["no-such-model"], 2)])
def test_a_ctrl_c_after_the_command_finished_ends_it_with_its_exit_code(extra, code):
    # once in 11 tries a Ctrl-C at the end of `check --save --junit` gave rc -2 (the interpreter's shutdown);
    # here it lands there every time
    proc = subprocess.run([sys.executable, "-c", LATE_CTRL_C, *extra], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == code and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert (json.loads(proc.stdout)["models"] if code == 0 else json.loads(proc.stdout)["error"]), proc.stdout


UNRAISABLE = """
import sys
from kvsim.app import cli
from kvsim.engine.interrupt import BudgetExceeded

class Dropped:
    def __init__(self, exc):
        self.exc = exc

    def __del__(self):  # an exception here can only be reported as unraisable
        raise self.exc

def listed(args):
    Dropped(BudgetExceeded())  # an alarm that landed in a __del__ (it fires again): not printed
    Dropped(ValueError("a real bug"))  # anything else is reported as Python reports it
    return 0

cli.COMMANDS["list"] = listed
sys.exit(cli.main(["list"]))
"""


def test_a_stop_python_can_only_report_as_unraisable_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-c", UNRAISABLE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "BudgetExceeded" not in proc.stderr, proc.stderr
    assert "ValueError: a real bug" in proc.stderr


# -- a budget that runs out: the same document as a complete run ---------------------------------------------------

def test_an_oracle_run_cut_by_the_time_limit_is_named_as_not_run(capsys, monkeypatch):
    # the --max-seconds alarm lands inside a kernel property run (a busy machine): that run and the rest are not run
    from kvsim.app import oracle

    real, calls = oracle.run_kernel_property, []

    def cut_at_the_second(prop, backend, **kwargs):
        result = real(prop, backend, **kwargs)
        if result.status != "skipped":
            calls.append(f"{prop.model}:{prop.name} on {backend}")
            if len(calls) == 2:
                raise BudgetExceeded()
        return result

    monkeypatch.setattr(oracle, "run_kernel_property", cut_at_the_second)
    code, out, _ = run(capsys, "oracle", "--max-examples", "2", "--json")
    doc = json.loads(out)
    assert code == 3 and set(doc) == ORACLE_KEYS and doc["complete"] is False and doc["stopped_by"] == "max-seconds"
    assert doc["not_run"][0] == calls[1] and [f"{c['name']} on {c['backend']}" for c in doc["checks"]
                                              if c["status"] != "skipped"] == calls[:1]


@pytest.mark.parametrize("argv, keys", [(["check", "swa-budget"], CHECK_KEYS), (["repro", "--all"], REPRO_KEYS),
                                        (["oracle"], ORACLE_KEYS)], ids=["check", "repro", "oracle"])
def test_a_budget_that_runs_out_while_the_command_sets_up_still_gives_its_document(capsys, monkeypatch, argv, keys):
    # the alarm fires while the catalog loads (a busy machine, a small --max-seconds): no work starts, and the
    # document names everything as not run, with the keys of a complete run
    from kvsim.app import catalog

    real = catalog.load

    def slow_load():
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        time.sleep(0.1)  # the alarm fires in here
        return real()

    monkeypatch.setattr(catalog, "load", slow_load)
    code, out, _ = run(capsys, *argv, "--max-seconds", "1000", "--json")
    doc = json.loads(out)
    assert code == 3 and set(doc) == keys and doc["stopped_by"] == "max-seconds" and doc["not_run"]


@pytest.mark.parametrize("command, module", [("repro", "repro"), ("report", "site"), ("oracle", "")])
def test_a_budget_that_runs_out_while_the_command_imports_its_work_still_gives_its_document(
        capsys, monkeypatch, tmp_path, command, module):
    # the alarm fires while the command imports the modules of its work (their first import, on a busy machine):
    # it is held like one in the catalog, and the document names every report as not run (it was lost before)
    import builtins

    real = builtins.__import__

    def slow_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == module and level == 2 and (globals or {}).get("__name__") == f"kvsim.app.commands.{command}":
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            time.sleep(0.1)  # the alarm fires in here
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", slow_import)
    argv = {"repro": ["repro", "--all"], "report": ["report", "--out", str(tmp_path / "site")],
            "oracle": ["oracle"]}[command]
    code, out, _ = run(capsys, *argv, "--max-seconds", "1000", "--json")
    doc = json.loads(out)
    assert code == 3 and doc["stopped_by"] == "max-seconds" and doc["not_run"]
    if command == "oracle":  # no kernel run started: what is listed was skipped (a backend this machine lacks)
        assert all(c["status"] == "skipped" for c in doc["checks"])
    else:
        assert len(doc["not_run"]) == len(catalog_ids())  # every report of the catalog


def catalog_ids() -> list[str]:
    from kvsim.app import catalog

    return list(catalog.load().bugs)


def test_a_budget_that_runs_out_while_the_site_makes_its_folders_still_gives_its_document(capsys, monkeypatch,
                                                                                          tmp_path):
    # the catalog is already loaded (a quick set-up): the alarm lands while the site makes its folders, before any
    # report runs (CI lost `report --max-seconds 0.01`'s document there once the import window was closed)
    from kvsim.app import site

    real = site.os.makedirs

    def slow_makedirs(*args, **kwargs):
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        time.sleep(0.1)  # the alarm fires in here
        return real(*args, **kwargs)

    monkeypatch.setattr(site.os, "makedirs", slow_makedirs)
    code, out, _ = run(capsys, "report", "--out", str(tmp_path / "site"), "--max-seconds", "1000", "--json")
    doc = json.loads(out)
    assert code == 3 and doc["stopped_by"] == "max-seconds" and len(doc["not_run"]) == len(catalog_ids())
    assert doc["bugs"] == 0
    assert (tmp_path / "site" / "index.html").is_file()


# -- accepted nonsense ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["list", ""], "MODEL"),
    (["check", "kv-zeroing", "--backend", "nope"], "--backend"),
    (["check", "swa-budget", "--backend", "cpu-shim"], "--backend"),
    (["explore", "swa-budget", "--backend", "nope"], "--backend"),
    (["simulate", "swa-budget", "--backend", "nope"], "--backend"),
    (["fuzz", "swa-budget", "--backend", "nope"], "--backend"),
    (["simulate", "pd-staging", "--faults", "delay=0.5:1e308"], "--faults delay"),
    (["simulate", "pd-staging", "--faults", "crash=prefill@1e300"], "--faults crash"),
    (["simulate", "pd-staging", "--faults", "drop=\uff10.\uff11"], "--faults drop"),
    (["simulate", "swa-budget", "--param", "requests=\uff13"], "--param requests"),
    (["simulate", "swa-budget", "--param", "requests=\u0661\u0662"], "--param requests"),
    (["fuzz", "swa-budget", "--minutes", "1e18"], "--minutes"),
    (["fuzz", "swa-budget", "--minutes", "10081"], "--minutes"),
    (["fuzz", "swa-budget", "--max-seconds", "0"], "--max-seconds"),
    (["fuzz", "swa-budget", "--max-examples", "0"], "--max-examples"),
])
def test_accepted_nonsense_is_refused(capsys, argv, needle):
    one_line_error(*run(capsys, *argv), needle)


def test_fuzz_stops_at_max_seconds_incomplete(tmp_path, capsys):
    code, out, _ = run(capsys, "fuzz", "swa-budget", "--property", "budgets_stay_nonnegative", "--workers", "1",
                       "--minutes", "60", "--max-seconds", "1", "--database", str(tmp_path / "db"), "--json")
    doc = json.loads(out)
    assert code == 3 and doc["complete"] is False and doc["stopped_by"] == "max-seconds" and doc["workers"]


def test_fuzz_max_examples_bounds_each_workers_search(tmp_path, capsys):
    code, out, _ = run(capsys, "fuzz", "swa-budget", "--property", "budgets_stay_nonnegative", "--workers", "1",
                       "--minutes", "60", "--max-examples", "70", "--database", str(tmp_path / "db"), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["complete"] is True and doc["results"][0]["examples"] == 70


# -- output paths ----------------------------------------------------------------------------------------------

def test_a_checkpoint_folder_that_holds_other_files_or_has_no_parent_is_refused(tmp_path, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    one_line_error(*run(capsys, "explore", "swa-budget", "--checkpoint", str(busy)), "--checkpoint", "no checkpoint")
    one_line_error(*run(capsys, "explore", "swa-budget", "--checkpoint", str(tmp_path / "missing" / "ck")),
                   "--checkpoint", "does not exist")
    assert sorted(os.listdir(busy)) == ["notes.txt"] and not (tmp_path / "missing").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's /dev/full")
@pytest.mark.parametrize("argv", [["check", "swa-budget", "--property", "budgets_stay_nonnegative",
                                   "--max-examples", "2"], ["explore", "swa-budget", "--max-states", "20"]])
def test_save_to_a_full_device_is_refused_before_a_passing_run(capsys, monkeypatch, argv):
    monkeypatch.setitem(cli.COMMANDS, argv[0], lambda args: pytest.fail(f"{argv[0]} ran"))
    one_line_error(*run(capsys, *argv, "--save", "/dev/full"), "--save", "/dev/full")



BLAS = """
import os, sys
from kvsim.app import cli

def main():  # what a command would see first: the variable numpy reads at its import, numpy not imported yet
    print(os.environ.get("OPENBLAS_NUM_THREADS"), "numpy" in sys.modules)
    return 0

cli.main = main
cli.entry()
"""


@pytest.mark.parametrize("given, seen", [(None, "1"), ("2", "2")])
def test_numpy_blas_runs_on_one_thread_unless_the_user_says(given, seen):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    proc = subprocess.run([sys.executable, "-c", BLAS], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == [seen, "False"], (proc.stdout, proc.stderr)
