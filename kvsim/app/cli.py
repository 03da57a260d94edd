"""The `kvsim` command line.

Exit codes: 0 everything held (or reproduced), 1 a property was violated or a
bug did not reproduce, 2 bad usage or bad input (a one-line message on
stderr, never a traceback), 3 a bound or work budget (`--max-seconds`,
`--max-events`) ended the work before it was complete and nothing was found.
Every command takes `--json` and then prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Sequence

from .. import __version__
from ..engine.canon import canonical_json, to_jsonable
from ..engine.descriptor import ModelDescriptor, RunSpec
from ..engine.errors import ConfigError, KvsimError, TraceError
from ..engine.explore import DEFAULT_MAX_STATES, ExploreOptions, explore
from ..engine.explore.parallel import explore_parallel
from ..engine.interrupt import INTERRUPT, BudgetExceeded, Interrupted, asked, stopped_by, stopping_on_signals
from ..engine.memory import DEFAULT_SHARE, machine
from ..engine.progress import Progress
from ..engine.sim import DEFAULT_MAX_EVENTS, DEFAULT_MAX_SECONDS
from ..conform.cli import add_arguments as conform_arguments
from ..conform.cli import cmd_conform
from . import catalog, counterexample, junit, linecov, outputs
from .argtypes import integer, positive_float, positive_int


EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
# the engine's errors name its fields (`ExploreOptions`, the explorer's workers and checkpoints): said as the flags here
ENGINE_FLAGS = {"max_depth": "--max-depth", "max_states": "--max-states", "max_seconds": "--max-seconds",
                "store": "--store", "checkpoint": "--checkpoint", "resume": "--resume", "workers": "--workers",
                "ray": "--ray"}
VARIANT_HELP = "the model variant: fixed (today's upstream) or a pre-fix variant (kvsim list MODEL) (default: fixed)"


# --max-seconds defaults: the long suites (check, repro, oracle) get an hour, a search or one run ten minutes
SUITE_MAX_SECONDS = 3600.0
RUN_MAX_SECONDS = DEFAULT_MAX_SECONDS
FUZZ_MAX_MINUTES = 10_080  # a week: the longest --minutes of kvsim fuzz


class UsageError(Exception):
    """An argument the parser refused; reported like any other bad input (one line, JSON too)."""


EXPIRED_AGAIN = 0.25  # seconds after a --max-seconds alarm that it fires again, until the command stops
# commands that stop cleanly at the first Ctrl-C or SIGTERM and report what ran (explore and fuzz do it themselves)
STOP_ON_SIGNALS = ("check", "repro", "simulate", "oracle")
# while a command sets its work up ("depth" > 0), an alarm is held ("held"): the work then stops at its first item
_SETUP = {"depth": 0, "held": False}


def _disarm() -> None:
    """The work is done: the output that follows is not cut short by --max-seconds."""
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def _deadline(seconds: float | None):
    """Raise BudgetExceeded in the main thread once `seconds` of wall clock have passed."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    closed: list[bool] = []

    def expire(signum: int, frame: Any) -> None:
        if closed:  # the command is over: an alarm landing in the clean-up below does nothing
            return
        # again shortly, in case this one is swallowed: raised inside a garbage-collector callback (Hypothesis
        # installs one) or a __del__, an exception is only printed as unraisable, and the budget would be lost
        signal.setitimer(signal.ITIMER_REAL, EXPIRED_AGAIN)
        if _SETUP["depth"]:
            _SETUP["held"] = True
        else:
            raise BudgetExceeded()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        while True:  # an alarm landing here must not leave this handler and its re-arming timer behind
            try:
                closed.append(True)
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                _SETUP["held"] = False
                break
            except BudgetExceeded:
                continue


@contextmanager
def _setup():
    """The command's set-up (its catalog, its list of work): a --max-seconds alarm in it is held until it is done,
    and then cuts the work short at its first item (`_each`), which reports what did not run in the command's
    own document."""
    _SETUP["depth"] += 1
    try:
        yield
    finally:
        _SETUP["depth"] -= 1


@contextmanager
def _quiet_stops():
    """A stop raised where Python can only report it as unraisable (a garbage-collector callback, a `__del__`) is
    not printed: it is no error of the code it landed in, and an alarm fires again until it gets through (a
    Ctrl-C or SIGTERM is a flag, which nothing swallows). Anything else is reported as before."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, (BudgetExceeded, Interrupted)):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--max-dept` is a typo to report, not `--max-depth`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, not argparse's usage block (`--help` has the usage)
        named = re.match(r"argument (\S+): (\1: .*)$", message)  # a type check of ours names its option itself
        raise UsageError(named.group(2) if named else message)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p = _Parser(prog="kvsim", description="Deterministic simulator and property-based verifier for KV-cache "
                                          "state machines of LLM inference engines.",
                epilog="exit codes: 0 everything held or reproduced; 1 a property or invariant was violated, or a "
                       "bug report did not hold; 2 bad usage or bad input (one line on stderr; with --json also "
                       '{"error": {"field", "expected", "received", "message"}} on stdout); 3 a bound or work '
                       "budget (--max-depth, --max-states, --max-seconds, --max-events) ended the work before it "
                       "was complete and nothing was found (not a proof; the output says which bound)")
    p.add_argument("--version", action="version", version=f"kvsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ls = sub.add_parser("list", parents=[common], help="models, variants, properties, bug reports")
    ls.add_argument("model", nargs="?", help="one model: its variants, parameters (type, range, default), properties")

    c = sub.add_parser("check", parents=[common], help="run a model's properties on one variant")
    c.add_argument("model", help="a model name (kvsim list)")
    c.add_argument("--variant", default="fixed", help=VARIANT_HELP)
    c.add_argument("--property", action="append", help="only this property (repeatable)")
    c.add_argument("--max-examples", type=positive_int("--max-examples"), default=200,
                   help="Hypothesis examples per property (default: 200)")
    c.add_argument("--seed", type=integer("--seed"), default=0,
                   help="Hypothesis seed: same seed, same counterexample (default: 0)")
    _model_params(c)
    c.add_argument("--save", metavar="FILE", help="write the first counterexample here (kvsim replay FILE re-runs it)")
    _junit_option(c)
    _max_seconds(c, SUITE_MAX_SECONDS)

    r = sub.add_parser("repro", parents=[common], help="reproduce bug reports from the seeds")
    group = r.add_mutually_exclusive_group(required=True)
    group.add_argument("bug_id", nargs="?", help="one bug report (kvsim list)")
    group.add_argument("--all", action="store_true", help="every bug report of the catalog")
    r.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed (default: 0)")
    r.add_argument("--wide", action="store_true", help="add the source, property and counterexample columns")
    r.add_argument("--report", action="store_true", help="write a Markdown bug report (to stdout, or --out)")
    r.add_argument("--out", metavar="FILE", help="with --report: the file (a folder with --all: FOLDER/ID.md)")
    _junit_option(r)
    _max_seconds(r, SUITE_MAX_SECONDS)

    e = sub.add_parser("explore", parents=[common], help="exhaustive bounded search of a model's transition system")
    e.add_argument("model", help="a model with a transition system (kvsim list)")
    e.add_argument("--variant", default="fixed", help=VARIANT_HELP)
    e.add_argument("--max-depth", type=positive_int("--max-depth"),
                   help="stop expanding at this depth (default: none)")
    e.add_argument("--max-states", type=positive_int("--max-states"), default=DEFAULT_MAX_STATES,
                   help=f"stop after this many distinct states (default: {DEFAULT_MAX_STATES})")
    _model_params(e)
    e.add_argument("--graph", metavar="FILE", help="write the state graph as GraphML")
    e.add_argument("--save", metavar="FILE", help="write the first violation here (kvsim replay FILE re-runs it)")
    e.add_argument("--no-liveness", action="store_true", help="skip the hang search")
    e.add_argument("--store", default="full", choices=("full", "fingerprint"),
                   help="keep every state (full: the graph can be exported) or 64-bit fingerprints in flat arrays "
                        "(fingerprint: tens of bytes a state; paths rebuilt by replay) (default: full)")
    e.add_argument("--no-symmetry", action="store_true",
                   help="explore every state even where the model declares interchangeable rooms, requests or "
                        "writers (default: one representative per orbit)")
    e.add_argument("--workers", type=positive_int("--workers"), default=1,
                   help="search with this many worker processes, the state space partitioned by hash; same results "
                        "as one process (default: 1)")
    e.add_argument("--ray", metavar="ADDRESS",
                   help="run the workers as actors on a Ray cluster at ADDRESS ('local' starts one on this machine; "
                        "needs the ray package) (default: no Ray)")
    e.add_argument("--coverage", action="store_true",
                   help="also measure line coverage of the model's package during the run (needs the coverage "
                        "package; default: off)")
    e.add_argument("--max-memory", type=positive_float("--max-memory"), metavar="GIB",
                   help="stop cleanly when the search's resident memory on a machine (its workers there included) "
                        "passes this many GiB, checked every few thousand states or each level (default: "
                        f"{DEFAULT_SHARE * 100:.0f}%% of each machine's memory, here "
                        f"{DEFAULT_SHARE * machine()[1] / 2 ** 30:.1f})")
    saving = e.add_mutually_exclusive_group()
    saving.add_argument("--checkpoint", metavar="DIR",
                        help="save the search in DIR (a new or empty folder) every --checkpoint-minutes and when "
                             "--max-seconds, --max-memory or --max-states stops it; go on with --resume DIR "
                             "(default: no checkpoint)")
    saving.add_argument("--resume", metavar="DIR",
                        help="go on from the search saved in DIR: the command that saved it, with larger bounds; "
                             "it keeps saving there (every file of a checkpoint is authenticated with your key in "
                             "the kvsim cache folder: one changed, or another's, is refused)")
    e.add_argument("--checkpoint-minutes", type=positive_float("--checkpoint-minutes"), metavar="M",
                   help="with --checkpoint or --resume: minutes between two saves while the search runs (default: 10)")
    _junit_option(e)
    _max_seconds(e, RUN_MAX_SECONDS)

    f = sub.add_parser("fuzz", parents=[common],
                       help="a model's properties searched by many workers sharing one example database")
    f.add_argument("model", help="a model name (kvsim list)")
    f.add_argument("--variant", default="fixed", help=VARIANT_HELP)
    f.add_argument("--property", action="append", help="only this property (repeatable) (default: every property "
                                                       "that is not a kernel check)")
    f.add_argument("--workers", type=positive_int("--workers"), default=2,
                   help="worker processes (or Ray tasks with --ray), each with its own seeds (default: 2)")
    f.add_argument("--ray", metavar="ADDRESS",
                   help="run the workers as tasks on a Ray cluster ('local' starts one here) (default: no Ray)")
    f.add_argument("--minutes", type=positive_float("--minutes", FUZZ_MAX_MINUTES), default=1.0,
                   help=f"how long each worker searches, at most {FUZZ_MAX_MINUTES:,} (a week) (default: 1)")
    f.add_argument("--max-examples", type=positive_int("--max-examples"), metavar="N",
                   help="each worker runs at most N examples of each property, then ends (a budget in examples: "
                        "the same search on any machine) (default: none, --minutes alone)")
    f.add_argument("--seed", type=integer("--seed"), default=0, help="the base seed; worker w, round r runs seed "
                                                                  "base + w*1000003 + r (default: 0)")
    f.add_argument("--database", metavar="DIR|URL",
                   help="the shared example database: a directory, or a redis:// URL (default: "
                        "~/.cache/kvsim/fuzz/MODEL)")
    _model_params(f)
    _max_seconds(f, FUZZ_MAX_MINUTES * 60)

    s = sub.add_parser("simulate", parents=[common], help="timed, seeded simulation with fault injection")
    s.add_argument("model", help="a model with a timed simulation (kvsim list)")
    s.add_argument("--variant", default="fixed", help=VARIANT_HELP)
    s.add_argument("--seed", type=integer("--seed"), default=0, help="the run's one random seed (default: 0)")
    s.add_argument("--faults", default="", metavar="SPEC", help="e.g. drop=0.05,delay=0.1:2.0,crash=peer@30")
    s.add_argument("--trace", metavar="FILE", help="write the JSONL trace here")
    _model_params(s)
    s.add_argument("--self-check", action="store_true", help="run the seed twice and compare the digests")
    _max_events(s)
    _max_seconds(s, RUN_MAX_SECONDS)

    rp = sub.add_parser("replay", parents=[common],
                        help="re-run a simulation trace, or a saved counterexample of check or explore, and verify it")
    rp.add_argument("trace", metavar="FILE", help="a JSONL trace of kvsim simulate, or a counterexample file "
                                                  "(check --save, explore --save, or their --json output)")
    _max_events(rp)
    _max_seconds(rp, RUN_MAX_SECONDS)

    o = sub.add_parser("oracle", parents=[common], help="differential kernel checks on every available backend")
    o.add_argument("--max-examples", type=positive_int("--max-examples"), default=50,
                   help="Hypothesis examples per kernel property and backend (default: 50)")
    o.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed (default: 0)")
    _junit_option(o)
    _max_seconds(o, SUITE_MAX_SECONDS)
    cf = sub.add_parser("conform", parents=[common],
                        help="run the models' properties against real vLLM / SGLang releases or a working tree")
    conform_arguments(cf)
    sh = sub.add_parser("show", parents=[common], help="draw a counterexample: a sequence chart, or the shrunk input")
    what = sh.add_mutually_exclusive_group(required=True)
    what.add_argument("bug_id", nargs="?", help="a bug report (kvsim list): its counterexample, reproduced")
    what.add_argument("--from", dest="from_file", metavar="FILE", help="a saved counterexample (check or explore "
                      "--save, or their --json output) or a simulation trace")
    sh.add_argument("--out", metavar="FILE", help="write the drawing to FILE (.svg or .png) (default: text on stdout)")
    sh.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed of the reproduction (default: 0)")
    sh.add_argument("--steps", type=positive_int("--steps"), default=40,
                    help="a trace: draw this many steps, ending at the first violation (default: 40)")
    _max_seconds(sh, SUITE_MAX_SECONDS)
    rt = sub.add_parser("report", parents=[common], help="write the catalog, bug reports, counterexample charts, "
                                                         "conformance and benchmark results as a static HTML site")
    rt.add_argument("--out", metavar="DIR", required=True, help="the folder to write (index.html in it)")
    rt.add_argument("--conform", metavar="FILE", action="append", default=[],
                    help="output of kvsim conform ... --json to include (repeatable)")
    rt.add_argument("--bench", metavar="FILE", action="append", default=[],
                    help="a benchmark's JSON results to include (repeatable)")
    rt.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed of the reproductions (default: 0)")
    _max_seconds(rt, SUITE_MAX_SECONDS)
    return p


def _max_seconds(p: argparse.ArgumentParser, default: float) -> None:
    p.add_argument("--max-seconds", type=positive_float("--max-seconds"), default=default, metavar="S",
                   help="wall-clock work budget: stop cleanly at it with what was found so far, and say so "
                        "(exit 3 if nothing was found) (default: %(default)s)")


def _max_events(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-events", type=positive_int("--max-events"), default=DEFAULT_MAX_EVENTS, metavar="N",
                   help="simulated events budget: the run stops cleanly after N events, incomplete "
                        "(exit 3 if nothing was found) (default: %(default)s)")


def _junit_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE for CI: one "
                   "testcase per check, a violation as a failure with its counterexample and the kvsim line "
                   "that replays it (stdout is unchanged) (default: none)")


def _model_params(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="model parameter (repeatable); `kvsim list --json` and a wrong name list them")
    p.add_argument("--backend", help="a model with a `backend` parameter (pd-protocol): shorthand for "
                                     "--param backend=NAME; otherwise the kernel backend of the model's kernel "
                                     "properties (torch-cpu, cpu-shim, cpu-shim-asan, torch-cuda, cupy-cuda)")


def _params(args: argparse.Namespace, model: ModelDescriptor | None = None) -> list[str]:
    """`--param` values, with `--backend` as `backend=` where the model has such a parameter (`check` takes it as
    the kernel backend of the others, `_kernel_backend`; elsewhere it is refused for them, never ignored)."""
    takes_backend = model is None or any(s.name == "backend" for s in model.params + model.sim_params)
    if args.backend is not None and not takes_backend and args.command != "check":
        with_backend = ", ".join(m.name for m in catalog.models().models.values()
                                 if any(s.name == "backend" for s in m.params + m.sim_params))
        raise ConfigError("--backend", f"a model with a backend parameter ({with_backend}); model {model.name} has "
                                       "none", args.backend)
    backend = [f"backend={args.backend}"] if args.backend is not None and takes_backend else []
    return list(args.param) + backend


def _kernel_backend(args: argparse.Namespace, model: ModelDescriptor, registry: Any) -> str | None:
    """`--backend` as the kernel backend: only for a model without a `backend` parameter, and one of the
    backends its kernel properties run on."""
    if getattr(args, "backend", None) is None or any(s.name == "backend" for s in model.params):
        return None
    known = list(dict.fromkeys(b for p in registry.properties_of(model.name) if p.is_kernel for b in p.backends))
    if args.backend not in known:
        raise ConfigError("--backend", f"a kernel backend of model {model.name} ({', '.join(known)})" if known
                          else f"no --backend: model {model.name} has no kernel properties", args.backend)
    return args.backend


def _paths(args: argparse.Namespace) -> None:
    """Every path the command will write to, tried before any work (`outputs`): a long search is not lost to
    a path it cannot write at its end."""
    command = args.command
    files = ["save", "graph", "junit"] + (["trace"] if command == "simulate" else [])
    folders = ["checkpoint", "resume"] if command == "explore" else []
    out = getattr(args, "out", None)
    if command == "repro":
        if out is not None and not args.report:
            raise ConfigError("--out", "--report as well", out)
        from .report_md import to_folder

        (folders if out is not None and to_folder(out, args.all) else files).append("out")
    else:
        (folders if command == "report" else files).append("out")
    for flag, check in [(f, outputs.writable_file) for f in files] + [(f, outputs.writable_folder) for f in folders]:
        value = getattr(args, flag, None)
        if value is not None:
            check(f"--{flag}", value)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_json = "--json" in argv
    try:
        args = _parser().parse_args(argv)
        _paths(args)
        # Ctrl-C or SIGTERM: the command stops as at its budget, and reports what ran (`kvsim.engine.interrupt`)
        signals = stopping_on_signals() if args.command in STOP_ON_SIGNALS else nullcontext()
        with _deadline(_alarm_seconds(args)), signals, _quiet_stops():
            return COMMANDS[args.command](args)
    except BrokenPipeError:  # the reader went away (`kvsim ... | head`): nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        value = re.match(r"(--[\w-]+): expected (.+), got '(.*)'$", str(exc))  # an option's value: its field
        error = {"field": value[1], "expected": value[2], "received": value[3]} if value else {
            "field": "arguments", "expected": "a valid kvsim command line (kvsim --help)", "received": " ".join(argv)}
        return _fail(wants_json, {**error, "message": str(exc)}, f"{exc} (kvsim --help)")
    except ConfigError as error:
        exc = error.named(ENGINE_FLAGS)
        return _fail(wants_json, {"field": exc.field, "expected": exc.expected, "received": to_jsonable(exc.received),
                                  "message": str(exc)}, str(exc))
    except KvsimError as exc:
        fields = {"field": f"{exc.path}:{exc.line}", "expected": "a usable file", "received": exc.reason} \
            if isinstance(exc, TraceError) else {"field": "", "expected": "", "received": ""}
        return _fail(wants_json, {**fields, "message": str(exc)}, str(exc))
    except (BudgetExceeded, Interrupted) as exc:  # a command without partial results to show: nothing found
        command = next((a for a in argv if a in COMMANDS), "kvsim")
        stopped = "max-seconds" if isinstance(exc, BudgetExceeded) else INTERRUPT
        cause = "--max-seconds ran out" if stopped == "max-seconds" else f"{stopped_by(stopped)} came"
        message = f"INCOMPLETE: {cause} before {command} finished; nothing was found, and nothing is proved (exit 3)"
        if wants_json:
            print(json.dumps({"command": command, "complete": False, "stopped_by": stopped, "message": message},
                             sort_keys=True))
        else:
            print(message)
        return EXIT_INCOMPLETE
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130


def one_line(text: str) -> str:
    """`text` with every unprintable character (newline, U+001E, U+2028 ... from user input) escaped: one line."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _alarm_seconds(args: argparse.Namespace) -> float | None:
    """When SIGALRM ends the command: at --max-seconds, or a little later for a simulation, which stops at
    --max-seconds itself between two events (the alarm is then only the backstop of one endless event)."""
    seconds = getattr(args, "max_seconds", None)
    if seconds is None:
        return None
    # simulate and replay stop at --max-seconds between two events, explore between two states, oracle between
    # two property runs, fuzz workers between two rounds: the alarm is only the backstop of one endless step there
    return seconds + max(10.0, seconds / 10) if args.command in ("simulate", "replay", "explore", "oracle",
                                                                 "conform", "fuzz") \
        else seconds


def _fail(wants_json: bool, error: dict[str, Any], line: str) -> int:
    """Bad input: one line on stderr; with --json also {"error": {field, expected, received, message}} on stdout."""
    print(f"kvsim: error: {one_line(line)}", file=sys.stderr)
    if wants_json:
        print(json.dumps({"error": error}, sort_keys=True))
    return EXIT_USAGE


def _emit(args: argparse.Namespace, document: dict[str, Any], text: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(to_jsonable(document), sort_keys=True, indent=1))
    else:
        print(text())


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- commands ------------------------------------------------------------------------------------

def cmd_list(args: argparse.Namespace) -> int:
    doc = catalog.listing()
    if args.model is not None:  # `kvsim list ''` names no model: refused, as any unknown name is
        catalog.load().model(args.model)
        doc = {"models": [m for m in doc["models"] if m["name"] == args.model],
               "bugs": [b for b in doc["bugs"] if b["model"] == args.model]}

    def text() -> str:
        if args.model is not None:
            return _model_text(doc["models"][0], doc["bugs"])
        models = _table(["model", "variants", "properties", "source"],
                        [[m["name"], ",".join(m["variants"]), len(m["properties"]), m["source"]] for m in doc["models"]])
        props = "\n".join(f"  {m['name']}: {', '.join(m['properties'])}" for m in doc["models"])
        bugs = _table(["bug", "model", "variant", "status"],  # `kvsim list MODEL` adds what must fail
                      [[b["id"], b["model"], b["variant"], b["status"]] for b in doc["bugs"]])
        return f"{models}\n\nproperties:\n{props}\n\n{bugs}"

    _emit(args, doc, text)
    return 0


def _model_text(m: dict[str, Any], bugs: list[dict[str, Any]]) -> str:
    def params(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return "  (none)"
        return _table(["parameter", "type", "default", "range", "meaning"],
                      [[p["name"], p["type"], _value(p["default"]), _range(p), p["doc"]] for p in rows])

    lines = [f"{m['name']}: {m['summary']}", f"source: {m['source']}", f"variants: {', '.join(m['variants'])}",
             "", "explore / stateful parameters (--param NAME=VALUE):", params(m["params"]),
             "", "simulate parameters (--param NAME=VALUE):", params(m["sim_params"]),
             "", "properties: " + ", ".join(m["properties"]),
             "", "bug reports:", _table(["bug", "variant", "must fail", "status", "upstream releases"],
                                        [[b["id"], b["variant"], b["check"], b["status"], _verdicts(b)] for b in bugs])]
    return "\n".join(lines)


def _verdicts(bug: dict[str, Any]) -> str:
    """`0.5.23 present; 05c7ebf (PR #30545) not reachable`: the report's state per release where it is known."""
    states = {"fixed": "fixed"}
    return "; ".join(f"{v['release']} {states.get(v['state'], v['state'])}"
                     + (f" in {v['fixed_in']}" if v["fixed_in"] else "") for v in bug["verdicts"]) or "-"


def _value(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def _range(p: dict[str, Any]) -> str:
    if p["choices"]:
        return " | ".join(p["choices"])
    lo = "" if p["minimum"] is None else _value(p["minimum"])
    hi = "" if p["maximum"] is None else _value(p["maximum"])
    return f"{lo}..{hi}" if lo or hi else "any"


def _each(items: Sequence[Any], name: Callable[[Any], str], run: Callable[[Any], Any],
          progress: Progress) -> tuple[list[Any], list[str], str | None]:
    """`run(item)` for each item until --max-seconds or an interrupt stops the command: (the results, the names
    of the items not run, "max-seconds" / "interrupt" / None). An item the stop came in is not run: a run that
    saw it may be cut short (a Hypothesis run ends at its next example, a search at its next check)."""
    results: list[Any] = []
    for i, item in enumerate(items):
        try:
            if _SETUP["held"]:
                raise BudgetExceeded()
            if asked():
                raise Interrupted()
            progress.step(name(item))
            result = run(item)
            if asked():
                raise Interrupted()
            results.append(result)
        except (BudgetExceeded, Interrupted) as exc:  # what ran so far is reported, the rest is named as not run
            _disarm()
            return results, [name(x) for x in items[i:]], "max-seconds" if isinstance(exc, BudgetExceeded) \
                else INTERRUPT
    return results, [], None


def _stopped_early(stopped: str, args: argparse.Namespace) -> str:
    """What cut a command short, in words."""
    return f"--max-seconds {args.max_seconds:g} ran out" if stopped == "max-seconds" else \
        f"{stopped_by(stopped)} stopped it"


def cmd_check(args: argparse.Namespace) -> int:
    with _setup():
        reg = catalog.load()
        model = reg.model(args.model)
        # model, variant and parameters are resolved here, once; only what the user set travels on
        run = RunSpec.resolve(model, args.variant, _params(args, model))
        backend = _kernel_backend(args, model, reg)
        props = [reg.property(model.name, name) for name in args.property] if args.property \
            else [p for p in reg.properties_of(model.name) if backend is None or p.is_kernel]  # --backend: kernels
    progress = Progress(len(props), "check")
    results, not_run, stopped = _each(props, lambda p: p.name, lambda p: _check_one(p, run, args, backend), progress)
    _disarm()
    progress.close()
    doc = {"model": model.name, "variant": run.variant.name, "seed": args.seed, "max_examples": args.max_examples,
           "params": run.given, "backend": backend, "results": [r.to_json() for r in results],
           "complete": stopped is None, "stopped_by": stopped, "not_run": not_run}
    if args.junit:
        junit.write(args.junit, "kvsim check", [junit.check(doc)])
    failed = [r for r in results if r.status not in ("passed", "skipped")]
    if args.save and failed:
        counterexample.write(args.save, counterexample.check_document(run, failed[0], args.seed, args.max_examples,
                                                                      backend))

    def text() -> str:
        rows = [[r.property, r.status, r.examples, f"{r.seconds:.3f}",
                 _short(r.counterexample) if r.counterexample else _short(r.message, 60) if r.status == "skipped"
                 else ""] for r in results]
        tail = ""
        for r in failed:
            tail += f"\n{r.property}: {r.message}"
            program = (r.counterexample or {}).get("program") if isinstance(r.counterexample, dict) else None
            if program:
                tail += "\n  " + "\n  ".join(program)
            tail += f"\n  replay: {r.replay}"
        if args.save and failed:
            tail += f"\ncounterexample saved to {args.save} (kvsim replay {args.save})"
        if stopped:
            tail += (f"\nINCOMPLETE: {_stopped_early(stopped, args)}; not run: {', '.join(not_run)}"
                     + ("" if failed else "; nothing was found, and nothing is proved (exit 3)"))
        return f"{model.name} [{run.variant.name}]\n" + _table(["property", "status", "examples", "seconds",
                                                                 "counterexample"], rows) + tail

    _emit(args, doc, text)
    return 1 if failed else EXIT_INCOMPLETE if stopped else 0


def _check_one(prop: Any, run: RunSpec, args: argparse.Namespace, backend: str | None) -> Any:
    from ..engine.runner import PropertyResult, run_property  # Hypothesis is imported only to run properties

    if prop.is_kernel:
        if backend is None:
            return PropertyResult(prop.name, prop.model, run.variant.name, "skipped", 0, 0.0,
                                  message=f"a kernel property: choose --backend ({', '.join(prop.backends)}) "
                                          "or run kvsim oracle")
        if backend not in prop.backends:
            return PropertyResult(prop.name, prop.model, run.variant.name, "skipped", 0, 0.0,
                                  message=f"runs on {', '.join(prop.backends)} only")
        from . import oracle

        return oracle.run_kernel_property(prop, backend, variant=run.variant, max_examples=args.max_examples,
                                          seed=args.seed)
    if backend is not None:
        return PropertyResult(prop.name, prop.model, run.variant.name, "skipped", 0, 0.0,
                              message=f"not a kernel property: --backend {backend} does not apply")
    return run_property(prop, run.variant, max_examples=args.max_examples, seed=args.seed,
                        params=dict(run.given) or None)


def cmd_repro(args: argparse.Namespace) -> int:
    from .repro import latest_verdict, release_verdicts, reproduce

    with _setup():
        reg = catalog.load()
        bugs = list(reg.bugs.values()) if args.all else [reg.bug(args.bug_id)]
    progress = Progress(len(bugs), "repro")
    results, not_run, stopped = _each(bugs, lambda b: b.id, lambda b: reproduce(b, seed=args.seed), progress)
    _disarm()
    progress.close()
    broken = not all(r.ok for r in results)
    if args.junit:
        junit.write(args.junit, "kvsim repro", [junit.repro(results, not_run, args.seed, stopped)])
    reports: Any = None
    if args.report:
        from .report_md import render, write_reports

        if not args.json:
            write_reports(results, args.out, folder=args.all, seed=args.seed)
            return 1 if broken else EXIT_INCOMPLETE if stopped else 0
        # --json: stdout holds the one JSON document, with the reports in it (or the paths they were written to)
        reports = write_reports(results, args.out, folder=args.all, seed=args.seed) if args.out else \
            {r.bug.id: render(r.bug, r, args.seed) for r in results}
    doc = {"seed": args.seed, "bugs": [r.to_json() for r in results], "complete": stopped is None,
           "stopped_by": stopped, "not_run": not_run, **({} if reports is None else {"reports": reports})}

    def text() -> str:
        def row(r: Any) -> list[Any]:
            searched = f"{r.examples} {'examples' if r.bug.property else 'states'}"
            cells = [r.bug.id, r.bug.status, searched, f"{r.seconds:.3f}", "yes" if r.reproduced else "no",
                     {True: "yes", False: "NO", None: "-"}[r.fixed_passes], "holds" if r.ok else "BROKEN"]
            if args.wide:
                cells[2:2] = [r.bug.source, r.bug.check]
                cells.append(release_verdicts(r.bug))
                cells.append(_short(r.counterexample, 80) if r.counterexample else "")
            return cells

        headers = ["bug", "status", "searched", "seconds", "repro", "fixed", "verdict"]
        if args.wide:  # everything; the default fits a 120-column terminal
            headers[2:2] = ["upstream source", "property / invariant"]
            headers += ["upstream releases", "counterexample"]
        ok = sum(r.ok for r in results)
        width = max([len(r.bug.id) for r in results] + [0])
        tail = ""
        if stopped:
            tail = (f"\nINCOMPLETE: {_stopped_early(stopped, args)}; not run: {', '.join(not_run)}"
                    + ("" if broken else "; nothing was found, and nothing is proved (exit 3)"))
        releases = "" if args.wide else "".join(
            f"\n  {r.bug.id:<{width}}  {latest_verdict(r.bug)}" for r in results if r.bug.verdicts)
        if releases:  # below the table, which stays within 120 columns (--wide puts every release in a column)
            releases = "\n\nin the newest upstream release each finding names (--wide: every release):" + releases
        return _table(headers, [row(r) for r in results]) + releases + \
            f"\n\n{ok} of {len(results) + len(not_run)} bug reports hold" + tail

    _emit(args, doc, text)
    return 1 if broken else EXIT_INCOMPLETE if stopped else 0


def _checkpoint(args: argparse.Namespace, spec: ModelDescriptor, run: RunSpec, system: Any) -> dict[str, Any]:
    """`explore`'s checkpoint options for --checkpoint DIR / --resume DIR (none without them).

    The header names what a resumed search must share with the saved one: the model, variant and
    parameters, the search options that change what it finds, the workers, the kvsim version and code."""
    folder = args.checkpoint or args.resume
    if folder is None:
        if args.checkpoint_minutes is not None:
            raise ConfigError("--checkpoint-minutes", "--checkpoint DIR or --resume DIR beside it",
                              args.checkpoint_minutes)
        return {}
    import importlib

    from ..engine.explore import checkpoint

    header = {"model": spec.name, "--variant": run.variant.name,
              **{f"--param {name}": canonical_json(value) for name, value in run.params.items()},
              "--store": args.store, "--no-symmetry": args.no_symmetry, "--max-depth": args.max_depth,
              "--workers": args.workers if args.workers > 1 or args.ray else 1, "kvsim version": __version__,
              # the engine, every model (they share packages: pd_common) and the model's own package
              "kvsim code": checkpoint.code_digest(checkpoint, importlib.import_module("kvsim.models"),
                                                   importlib.import_module(type(system).__module__))}
    minutes = 10.0 if args.checkpoint_minutes is None else args.checkpoint_minutes
    saves = checkpoint.CheckpointDir(folder, header, every=minutes * 60, on_stop=_disarm)
    if args.checkpoint:
        saves.fresh()
    else:
        saves.check()  # a wrong folder or command is refused before any worker starts
    return {"checkpoint": saves, "resume": bool(args.resume)}


def cmd_explore(args: argparse.Namespace) -> int:
    reg = catalog.models()
    spec = reg.model(args.model)
    if spec.system is None:
        with_system = ", ".join(m.name for m in reg.models.values() if m.system)
        raise ConfigError("MODEL", f"a model with a transition system ({with_system})", spec.name)
    run = RunSpec.resolve(spec, args.variant, _params(args, spec))
    params = run.params
    system = run.system()
    progress = Progress(None, "explore")

    if args.graph and args.store != "full":
        raise ConfigError("--graph", "the full store (--store full)", f"--store {args.store}")

    if args.graph and (args.workers > 1 or args.ray):
        raise ConfigError("--graph", "a single-process search (no --workers, no --ray)",
                          f"--workers {args.workers}" if args.workers > 1 else f"--ray {args.ray}")
    bounds = ExploreOptions(max_depth=args.max_depth, max_states=args.max_states, check_liveness=not args.no_liveness,
                            max_seconds=args.max_seconds, store=args.store, symmetry=not args.no_symmetry,
                            max_memory=None if args.max_memory is None else int(args.max_memory * 2 ** 30),
                            memory_share=DEFAULT_SHARE if args.max_memory is None else None,
                            progress=lambda states, depth: progress.note(f"{states} states, depth {depth}"),
                            **_checkpoint(args, spec, run, system))
    lines: dict[str, Any] = {}

    def search() -> Any:
        if args.coverage and (args.ray or args.workers > 1):  # each worker measures the lines it runs
            lines["lines"] = linecov.WorkerLines(linecov.model_package(spec))
        if args.ray:
            return explore_parallel(run.system, args.workers, bounds, use_ray=True, **lines,
                                    ray_address=None if args.ray == "local" else args.ray)
        if args.workers > 1:
            return explore_parallel(run.system, args.workers, bounds, **lines)
        # under --coverage the system is built again inside the measured run, as a partitioned search builds its own
        return explore(run.system() if args.coverage else system, bounds)

    lines_run = None
    with stopping_on_signals():  # Ctrl-C or SIGTERM: the search stops as at a bound, and saves where it can
        if args.coverage:
            result, lines_run = linecov.run_with_coverage(linecov.model_package(spec), search)
        else:
            result = search()
    _disarm()
    progress.close()
    if args.graph:
        import networkx as nx
        try:
            nx.write_graphml(result.graph(), args.graph)
        except OSError as exc:
            raise ConfigError("--graph", "a writable file path", args.graph, exc.strerror or "") from None
    doc = {**result.to_json(), "params": params}
    if lines_run is not None:
        doc["line_coverage"] = lines_run
    if args.junit:
        liveness = None if args.no_liveness else getattr(system, "liveness", "liveness")
        junit.write(args.junit, "kvsim explore", [junit.explore(doc, args, run.given, liveness)])
    if args.save and result.violations:
        counterexample.write(args.save, counterexample.explore_document(run, result.violations[0]))

    def text() -> str:
        head = (f"{spec.name} [{args.variant}] {result.states} states, {result.transitions} transitions, depth "
                f"{result.depth}, {result.seconds:.3f} s ({result.states_per_second:,.0f} states/s)"
                + (f", bound hit: {result.bound_hit}" if result.bound_hit else ""))
        if result.symmetry:
            head += "\nsymmetry: one representative per orbit (--no-symmetry explores every state)"
        if result.store == "fingerprint":
            head += (f"\nfingerprint store: {result.bytes_per_state} bytes a state; chance of a fingerprint "
                     f"collision in this run {result.collision_probability:.1e}")
        if result.coverage is not None:
            head += "".join("\n" + line for line in result.coverage.lines())
        if result.bound_hit:  # the growth tells whether the search was near its end
            head += "\nstates first reached per depth: " + ", ".join(f"{n:,}" for n in result.levels)
        if lines_run is not None:
            head += "".join("\n" + line for line in linecov.coverage_lines(lines_run))
        if result.resumed:
            head += f"\nresumed from the checkpoint in {args.resume} (the seconds count every run of this search)"
        if result.checkpoint:
            again = "this command" if args.resume else f"this command with --resume {result.checkpoint} for --checkpoint"
            larger = "" if result.bound_hit == INTERRUPT else " and a larger bound"
            head += f"\nsearch saved to {result.checkpoint}: go on with {again}{larger}"
        if not result.violations and result.bound_hit:
            return (head + f"\nINCOMPLETE: {stopped_by(result.bound_hit)} stopped the search before every reachable "
                           "state was seen; nothing was found, and nothing is proved (exit 3)")
        if not result.violations:
            return head + "\nall invariants hold" + ("" if args.no_liveness else "; no hang")
        body = "".join(f"\n{v.kind} {v.property}: {v.message}\n  path ({len(v.trace)} steps): "
                       f"{' -> '.join(_short(a, 40) for a in v.trace)}" for v in result.violations)
        if args.save:
            body += f"\nfirst violation saved to {args.save} (kvsim replay {args.save})"
        return head + body

    _emit(args, doc, text)
    if result.violations:
        return 1
    return EXIT_INCOMPLETE if result.bound_hit else 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from .simulate import simulate_model

    spec = catalog.models().model(args.model)
    run = RunSpec.resolve(spec, args.variant, _params(args, spec), spec.sim_params)
    budget = {"max_events": args.max_events, "max_seconds": args.max_seconds}
    result = simulate_model(spec, run.variant, args.seed, dict(run.params), args.faults or None, **budget)
    if args.trace:
        try:
            result.recorder.write(args.trace)
        except OSError as exc:
            raise ConfigError("--trace", "a writable file path", args.trace, exc.strerror or "") from None
    doc = result.to_json()
    deterministic = True
    if args.self_check and result.stopped_by == INTERRUPT:  # asked to stop: the second run is not made
        doc["self_check"] = {"digest": None, "matches": None}
    elif args.self_check:
        again = simulate_model(spec, run.variant, args.seed, dict(run.params), args.faults or None,
                               max_events=result.events if result.stopped_by else args.max_events)
        deterministic = again.digest == result.digest
        doc["self_check"] = {"digest": again.digest, "matches": deterministic}

    def text() -> str:
        lines = [f"{spec.name} [{run.variant.name}] seed {args.seed}: {result.events} events, simulated "
                 f"{result.sim_time:.3f} s in {result.seconds:.3f} s", f"digest {result.digest}"]
        if args.self_check and doc["self_check"]["digest"] is None:
            lines.append("self-check: not run (interrupted)")
        elif args.self_check:
            lines.append(f"self-check: second run digest {doc['self_check']['digest']} "
                         f"{'matches' if deterministic else 'DIFFERS'}")
        lines += [f"  {k}: {_short(v)}" for k, v in result.summary.items()]
        if args.trace:
            lines.append(f"trace written to {args.trace}")
        if result.stopped_by:
            bound = {"max-events": f"the --max-events {args.max_events} budget",
                     "max-seconds": f"the --max-seconds {args.max_seconds:g} budget",
                     INTERRUPT: stopped_by(INTERRUPT)}[result.stopped_by]
            lines.append(f"INCOMPLETE: {bound} stopped the run after {result.events} events with work "
                         "left; the summary covers what ran" + ("" if failed else
                                                                 "; nothing was found, and nothing is proved (exit 3)"))
        return "\n".join(lines)

    failed = bool(result.summary.get("violations")) or not deterministic
    _emit(args, doc, text)
    return 1 if failed else EXIT_INCOMPLETE if result.stopped_by else 0


def cmd_replay(args: argparse.Namespace) -> int:
    doc = counterexample.sniff(args.trace)
    if doc is not None:
        return _replay_counterexample(args, doc)
    from .simulate import replay_file

    result = replay_file(args.trace, catalog.models().models, max_events=args.max_events,
                         max_seconds=args.max_seconds)
    for warning in result.warnings:
        print(f"kvsim: warning: {one_line(warning)}", file=sys.stderr)

    def text() -> str:
        if result.matches and not result.complete:
            return (f"{args.trace}: {result.steps} steps replayed and matched, then INCOMPLETE: the "
                    f"{result.stopped_by} budget stopped the re-run before the trace's end (exit 3)")
        if result.matches:
            return f"{args.trace}: {result.steps} steps replayed, digest {result.digest} matches"
        return (f"{args.trace}:{result.line}: diverged\n  trace has: {_short(result.got, 200)}\n"
                f"  re-run gives: {_short(result.expected, 200)}")

    _emit(args, result.to_json(), text)
    return 1 if not result.matches else EXIT_INCOMPLETE if not result.complete else 0


def cmd_oracle(args: argparse.Namespace) -> int:
    from . import oracle

    with _setup():
        reg, rows = catalog.load(), oracle.backends()
    progress = Progress(None, "oracle")
    if _SETUP["held"]:  # an alarm held in the set-up: no run starts (a budget of 0 s), every run is named not run
        _disarm()
    doc = oracle.oracle_report(reg, max_examples=args.max_examples, seed=args.seed, progress=progress.note,
                               max_seconds=0.0 if _SETUP["held"] else args.max_seconds, rows=rows, on_stop=_disarm)
    _disarm()
    progress.close()

    def text() -> str:
        backends = _table(["backend", "available", "reason"],
                          [[b["name"], "yes" if b["available"] else "no", b["reason"]] for b in doc["backends"]])
        checks = _table(["check", "backend", "examples", "status", "message"],
                        [[c["name"], c["backend"], c["examples"], c["status"], _short(c.get("message", ""), 60)]
                         for c in doc["checks"]])
        counts = {s: sum(c["status"] == s for c in doc["checks"]) for s in ("passed", "failed", "error", "skipped")}
        total = (f"{len(doc['checks'])} kernel property runs: {counts['passed']} passed, {counts['failed']} failed, "
                 f"{counts['error']} error, {counts['skipped']} skipped (a backend this machine lacks)")
        if doc["not_run"]:
            total += (f"\nINCOMPLETE: {_stopped_early(doc['stopped_by'], args)}; {len(doc['not_run'])} runs not "
                      f"run (first: {doc['not_run'][0]})"
                      + ("" if failed else "; nothing was found, and nothing is proved (exit 3)"))
        return f"{backends}\n\n{checks}\n\n{total}"

    doc["totals"] = {s: sum(c["status"] == s for c in doc["checks"]) for s in ("passed", "failed", "error", "skipped")}
    failed = any(c["status"] not in ("passed", "skipped") for c in doc["checks"])
    if args.junit:
        junit.write(args.junit, "kvsim oracle", [junit.oracle(doc, args.max_examples, args.seed)])
    _emit(args, doc, text)
    return 1 if failed else EXIT_INCOMPLETE if doc["not_run"] else 0


def _replay_counterexample(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    reg = catalog.load() if doc.get("command") == "check" else catalog.models()
    found = counterexample.validated(args.trace, doc, reg)  # bad input is refused before anything runs
    try:
        result = counterexample.replay_validated(args.trace, found)
    except BudgetExceeded:  # the re-run (a Hypothesis run, the hang search from a path's end) did not end in time
        _disarm()
        result = counterexample.CounterexampleReplay(
            args.trace, found.command, found.run.model.name, found.run.variant.name, found.check, False,
            f"INCOMPLETE: --max-seconds {args.max_seconds:g} ran out before the re-run ended; nothing is proved "
            "(exit 3)", stopped_by="max-seconds")

    def text() -> str:
        head = (f"{args.trace}: {result.command} counterexample of {result.model} [{result.variant}] "
                f"{result.check}: " + ("reproduced" if result.matches else "not finished" if result.stopped_by
                                        else "NOT reproduced"))
        program = "".join(f"\n  {line}" for line in result.program)
        return f"{head}\n  {result.message}{program}"

    _emit(args, result.to_json(), text)
    return 0 if result.matches else EXIT_INCOMPLETE if result.stopped_by else 1


def cmd_fuzz(args: argparse.Namespace) -> int:
    from . import fuzz

    reg = catalog.load()
    model = reg.model(args.model)
    run = RunSpec.resolve(model, args.variant, _params(args, model))
    props = [reg.property(model.name, name) for name in args.property] if args.property \
        else [p for p in reg.properties_of(model.name) if not p.is_kernel]
    kernels = [p.name for p in props if p.is_kernel]
    if kernels:
        raise ConfigError("--property", "a property that is not a kernel check (kvsim oracle runs those)", kernels[0])
    database = args.database or fuzz.default_database(model.name)
    progress = Progress(None, "fuzz")
    with stopping_on_signals():  # Ctrl-C or SIGTERM: the workers end after their current property, and report
        doc = fuzz.fuzz(model.name, run.variant.name, [p.name for p in props], dict(run.given), database,
                        args.workers, args.seed, args.minutes * 60, ray_address=args.ray, progress=progress,
                        max_examples=args.max_examples, max_seconds=args.max_seconds)
    _disarm()
    progress.close()
    failed = [r for r in doc["results"] if r["status"] != "passed"]

    def text() -> str:
        rows = [[r["property"], r["status"], r["examples"], ",".join(map(str, r["found_by"])) or "-",
                 _short(r["counterexample"]) if r["counterexample"] else ""] for r in doc["results"]]
        workers = "".join(f"\nworker {w['worker']}: {w['examples']} examples in {w['rounds']} rounds, "
                          f"{w['seconds']:.1f} s ({w['examples_per_second']:,.0f} examples/s)" for w in doc["workers"])
        tail = "".join(f"\n{r['property']}: {r['message']}\n  replay: {r['replay']}" for r in failed)
        if doc["stopped_by"]:
            cause = stopped_by(INTERRUPT) if doc["interrupted"] else f"--max-seconds {args.max_seconds:g}"
            tail += (f"\nstopped early: {cause} ended the workers before their --minutes; the "
                     "examples above are what they ran" + ("" if failed else ", and nothing is proved (exit 3)"))
        return (f"{model.name} [{run.variant.name}] database {database}\n"
                + _table(["property", "status", "examples", "found by", "counterexample"], rows) + workers + tail)

    _emit(args, doc, text)
    return 1 if failed else EXIT_INCOMPLETE if doc["stopped_by"] else 0


def cmd_show(args: argparse.Namespace) -> int:
    from .show import sources
    from .show.text import render_text

    if args.out is not None:
        from .site import CHARTS_MISSING, can_draw

        if not can_draw():
            raise ConfigError("--out", "matplotlib installed to draw the chart (pip install 'kvsim[charts]'); "
                                       "without --out the chart is printed as text", args.out, CHARTS_MISSING)
        from .show.draw import draw, output_format

        output_format(args.out)  # a wrong suffix is refused before anything runs
    reg = catalog.load()
    if args.from_file is not None:
        drawing = sources.of_file(args.from_file, reg, steps=args.steps)
    else:
        bug = reg.bug(args.bug_id)
        drawing = sources.of_bug(reg, bug, seed=args.seed)
        if drawing is None:
            _emit(args, {"bug": bug.id, "counterexample": None}, lambda: f"{bug.id}: no counterexample: "
                  f"{bug.check} does not fail on {bug.variant} (status: {bug.status})")
            return 1
    _disarm()
    if args.out is not None:
        draw(drawing, args.out)
    doc = {**drawing.to_json(), "out": args.out}

    def text() -> str:
        if args.out is None or sys.stdout.isatty():
            return render_text(drawing) + (f"\nwritten to {args.out}" if args.out else "")
        return f"written to {args.out}"

    _emit(args, doc, text)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .site import build_site, drawing_function

    with _setup():
        reg = catalog.load()
        drawing_function()  # matplotlib imported in the set-up, where it is installed
    progress = Progress(len(reg.bugs), "report")
    if _SETUP["held"]:  # the alarm came in the set-up: no report is reproduced, each is named as not run
        _disarm()
    result = build_site(args.out, reg, seed=args.seed, conform=args.conform, bench=args.bench,
                        progress=progress.step, on_stop=_disarm, spent=_SETUP["held"])
    _disarm()
    progress.close()
    cut = (f"\nINCOMPLETE: --max-seconds {args.max_seconds:g} ran out; not reproduced: {', '.join(result.not_run)}"
           if result.not_run else "")
    _emit(args, result.to_json(), lambda: f"{args.out}/index.html: {result.bugs} bug reports ({result.holding} "
          f"hold), {len(result.charts)} charts, {len(result.pages)} files, {result.bytes / 1024:.0f} KiB, "
          f"{result.seconds:.1f} s" + (f"\n{result.without_charts}" if result.without_charts else "") + cut)
    return 1 if result.holding != result.bugs else EXIT_INCOMPLETE if result.not_run else 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": cmd_list, "check": cmd_check, "repro": cmd_repro, "explore": cmd_explore,
    "simulate": cmd_simulate, "replay": cmd_replay, "oracle": cmd_oracle, "conform": cmd_conform,
    "fuzz": cmd_fuzz, "show": cmd_show, "report": cmd_report,
}
