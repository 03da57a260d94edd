"""Issue 11, section 5: our own fuzzer of the command line and of trace files.

Hypothesis generates command lines (every subcommand; real and random model names; parameter values
huge, negative, NaN, inf, boolean, empty, non-ASCII; fault specs; flags) and hostile trace files
(mutated real traces, bad headers, deep nesting, long lines). Each runs through the real entry point
and must: exit 0, 1, 2 or 3; never print a traceback; print exactly one line on stderr for exit 2;
print one JSON document on stdout with --json; stay within its time budget. Most runs are in process
(`kvsim.app.cli.main`, fast); a few run `python -m kvsim` in a subprocess under a memory limit
(`resource.setrlimit`) and a timeout.

Budget: the `ci` profile runs 40 command lines and 20 trace files, derandomized (well under a
minute); KVSIM_PROFILE=dev runs ten times more with fresh randomness. `KVSIM_FUZZ_REPORT=FILE`
appends the count of distinct inputs tried to FILE.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.app.cli import main
from kvsim.engine.trace import MAX_LINE
from clihelp import ROOT

DEV = os.environ.get("KVSIM_PROFILE") == "dev"
SCALE = 10 if DEV else 1
MEMORY_LIMIT = 2 << 30  # bytes of address space for a subprocess run
SECONDS = 4.0  # the --max-seconds every generated command line carries (when its command takes one)
SLACK = 20.0  # start-up, catalog loading, and the simulate/replay backstop alarm

COMMANDS = ("list", "check", "repro", "explore", "simulate", "replay", "oracle")
MODELS = ("swa-budget", "pd-staging", "pd-protocol", "mla-chunks", "kv-zeroing", "kv-offload", "mla-backends",
          "pipelined-transfer")
PARAM_NAMES = ("requests", "chunks", "rooms", "page_size", "prompt_max", "output_max", "arrival_rate", "step_time",
               "ring_units", "prompts", "outputs", "writers", "faults", "backend", "staging", "chunk_time",
               "prompt_len", "fault_budget", "max_failures", "sliding_window", "full_pages", "swa_pages")
NASTY_VALUES = ("0", "1", "2", "-1", "3", "1e18", "1000000000000000000", "-1000000000000000000", "nan", "inf",
                "-inf", "true", "True", "", " ", "1.5", "0.000001", "é", "١٢", "\u00a0", "1,2,3", "1,,2", "0x10",
                "1_000", "mooncake", "nixl", "drop_ready", "9" * 5000)
FAULTS = ("", "drop=0.1", "drop=nan", "delay=0.5:inf", "delay=0.5:", "crash=prefill@5", "crash=nobody@5",
          "crash=prefill@-1", "crash=prefill@1e300", "drop=0.1,drop=0.9", "garble=1", "reorder=2", "duplicate=0.5",
          "timeout=1", "crash=@", "=,=", "drop=0.1,", "é=1")

INPUTS: set[str] = set()  # distinct inputs tried in this session
FOUND: list[str] = []


def _report() -> None:
    target = os.environ.get("KVSIM_FUZZ_REPORT")
    if target:
        with open(target, "a") as fh:
            fh.write(json.dumps({"distinct_inputs": len(INPUTS), "found": FOUND}) + "\n")


def run_in_process(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help / --version
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_subprocess(argv: list[str], timeout: float = 60) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvsim", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, preexec_fn=_limit_memory, env={**os.environ, "PYTHONHASHSEED": "0"})
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start


def check_outcome(argv: list[str], code: int, out: str, err: str, seconds: float, limit: float) -> None:
    INPUTS.add("\0".join(argv))
    assert code in (0, 1, 2, 3), (argv, code, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out, (argv, err[-3000:])
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), (argv, err[-2000:])
    if "--json" in argv and "--help" not in argv and "--version" not in argv:
        json.loads(out)  # one JSON document on stdout, even for an error
    assert seconds < limit, (argv, seconds)


# -- command lines -------------------------------------------------------------------------------------

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
model = st.one_of(st.sampled_from(MODELS), text)
value = st.one_of(st.sampled_from(NASTY_VALUES), text, st.integers().map(str), st.floats().map(repr))
param = st.builds(lambda n, v: ["--param", f"{n}={v}"], st.one_of(st.sampled_from(PARAM_NAMES), text), value)
flag = st.one_of(
    st.just(["--json"]),
    param,
    st.builds(lambda v: ["--variant", v], st.one_of(st.sampled_from(("fixed", "pre_05c7ebf", "pre_af7c62e")), text)),
    st.builds(lambda v: ["--faults", v], st.one_of(st.sampled_from(FAULTS), text)),
    st.builds(lambda v: ["--seed", v], st.one_of(st.sampled_from(("0", "-1", "1e3", "x", "")), st.integers().map(str))),
    st.builds(lambda v: ["--max-depth", v], st.sampled_from(("1", "2", "0", "-3", "nan", "9" * 30))),
    st.builds(lambda v: ["--max-states", v], st.sampled_from(("1", "50", "0", "abc"))),
    st.builds(lambda v: ["--max-events", v], st.sampled_from(("1", "1000", "0", "-1", "1e9"))),
    st.builds(lambda v: ["--max-examples", v], st.sampled_from(("1", "2", "0", "-5"))),
    st.builds(lambda v: ["--backend", v], st.one_of(st.sampled_from(("torch-cpu", "mooncake", "nixl")), text)),
    st.builds(lambda v: ["--property", v], text),
    st.sampled_from((["--self-check"], ["--no-liveness"], ["--all"], ["--help"], ["--max-dept", "2"], ["--"])),
)


@st.composite
def command_lines(draw):
    command = draw(st.one_of(st.sampled_from(COMMANDS), text))
    positional = []
    if command in ("check", "explore", "simulate") or (command == "list" and draw(st.booleans())):
        positional = [draw(model)]
    elif command == "repro":
        positional = [draw(st.one_of(st.sampled_from(("swa-af7c62e", "pd-staging-05c7ebf")), text))]
    elif command == "replay":
        positional = [draw(st.sampled_from(("/nonexistent.jsonl", "/dev/null", "/", str(ROOT / "README.md"))))]
    flags = draw(st.lists(flag, max_size=5))
    argv = [command, *positional, *[part for f in flags for part in f]]
    if command in ("check", "repro", "explore", "simulate", "replay", "oracle"):
        argv += ["--max-seconds", str(SECONDS)]  # the budget under test: a command line ends in time
    if command == "check" and "--max-examples" not in argv:
        argv += ["--max-examples", "3"]
    return argv


@settings(max_examples=40 * SCALE, derandomize=not DEV, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(command_lines())
def test_fuzz_command_lines(argv):
    code, out, err, seconds = run_in_process(argv)
    check_outcome(argv, code, out, err, seconds, SECONDS + SLACK)


# -- trace files ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    traces = {}
    for name, extra in (("swa-budget", ["--param", "requests=20"]), ("pd-protocol", ["--param", "requests=5"]),
                        ("pd-staging", ["--param", "requests=5"])):
        path = folder / f"{name}.jsonl"
        assert main(["simulate", name, "--trace", str(path), *extra]) in (0, 1)
        traces[name] = path.read_bytes().splitlines()
    return traces


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                           max_leaves=6)
HEADER_FIELDS = ("kvsim_trace", "model", "variant", "seed", "params", "faults", "version", "extra")


@st.composite
def mutations(draw):
    kind = draw(st.sampled_from(("header", "param", "delete", "duplicate", "byte", "deep", "long", "truncate",
                                 "swap", "binary", "end")))
    return kind, draw(st.integers(min_value=0, max_value=10_000)), draw(JSON_VALUES), draw(
        st.sampled_from(HEADER_FIELDS)), draw(st.sampled_from(PARAM_NAMES + ("requests",) * 4))


def mutate(lines: list[bytes], kind: str, n: int, value, field: str, param_name: str) -> bytes:
    lines = list(lines)
    i = 1 + n % max(1, len(lines) - 1)
    if kind == "header":
        header = json.loads(lines[0])
        header[field] = value
        lines[0] = json.dumps(header).encode()
    elif kind == "param":
        header = json.loads(lines[0])
        header["params"][param_name] = value if n % 3 else [1e18, True, -1, "x", float("nan"), 10 ** 30][n % 6]
        lines[0] = json.dumps(header).encode()
    elif kind == "delete":
        del lines[i % len(lines)]
    elif kind == "duplicate":
        lines.insert(i % len(lines), lines[i % len(lines)])
    elif kind == "byte":
        line = bytearray(lines[i % len(lines)])
        if line:
            line[n % len(line)] = (line[n % len(line)] + 1 + n % 90) % 128
        lines[i % len(lines)] = bytes(line)
    elif kind == "deep":
        depth = 1000 + n * 20
        lines[i % len(lines)] = b"[" * depth + b"]" * depth
    elif kind == "long":
        lines[i % len(lines)] = b'{"i": 0, "data": "' + b"x" * (MAX_LINE + n) + b'"}'
    elif kind == "truncate":
        data = b"\n".join(lines)
        return data[: n * 7 % max(1, len(data))]
    elif kind == "swap":
        j = (i + 1) % len(lines)
        lines[i % len(lines)], lines[j] = lines[j], lines[i % len(lines)]
    elif kind == "binary":
        lines[i % len(lines)] += bytes([0x80 + n % 128])
    elif kind == "end":
        end = json.loads(lines[-1])
        end[["steps", "digest", "incomplete", "events", "end"][n % 5]] = value
        lines[-1] = json.dumps(end).encode()
    return b"\n".join(lines) + b"\n"


@settings(max_examples=20 * SCALE, derandomize=not DEV, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from(("swa-budget", "pd-protocol", "pd-staging")), mutations(), st.booleans())
def test_fuzz_trace_files(real_traces, tmp_path_factory, model_name, mutation, as_json):
    data = mutate(real_traces[model_name], *mutation)
    path = tmp_path_factory.mktemp("t") / "t.jsonl"
    path.write_bytes(data)
    argv = ["replay", str(path), "--max-seconds", str(SECONDS)] + (["--json"] if as_json else [])
    code, out, err, seconds = run_in_process(argv)
    INPUTS.add(f"trace:{model_name}:{mutation[0]}:{mutation[1]}:{json.dumps(mutation[2:], default=str)}")
    check_outcome(argv, code, out, err, seconds, SECONDS + SLACK)


# -- a few in a subprocess, under a memory limit ------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["simulate", "pd-protocol", "--param", "chunks=1000000000000000000", "--json"],
    ["simulate", "pd-staging", "--param", "ring_units=1e18"],
    ["explore", "swa-budget", "--param", "prompts=1e18", "--param", "outputs=1"],
    ["simulate", "swa-budget", "--param", "arrival_rate=0.01", "--param", "requests=100000", "--param",
     "step_time=0.001", "--max-seconds", "3", "--json"],
])
def test_subprocess_under_a_memory_limit(argv):
    code, out, err, seconds = run_subprocess(argv)
    check_outcome(argv, code, out, err, seconds, 60)


def test_subprocess_deep_trace_under_a_memory_limit(real_traces, tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(real_traces["swa-budget"][0] + b"\n" + b"[" * 200_000 + b"]" * 200_000 + b"\n")
    argv = ["replay", str(path), "--json"]
    code, out, err, seconds = run_subprocess(argv)
    check_outcome(argv, code, out, err, seconds, 60)
    assert code == 2


def test_zz_count_of_inputs_tried():
    """Runs last in this file: the fuzzer tried distinct inputs (and reports how many). Under xdist this worker may
    have run none of the file's other tests (they went to the other worker): it then tries each model's listing
    itself, so the count measures this worker's inputs instead of failing on how the tests were dealt."""
    if len(INPUTS) < 10:
        for argv in [["list"], ["list", "--json"]] + [["list", m] for m in MODELS]:
            code, out, err, seconds = run_in_process(argv)
            check_outcome(argv, code, out, err, seconds, 60)
    _report()
    assert len(INPUTS) >= 10
