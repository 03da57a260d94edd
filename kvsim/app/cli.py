"""The `kvsim` command line: the dispatcher of the commands (`kvsim.app.commands`, one module each; `kvsim
conform` is `kvsim.conform.cli`'s).

It builds the parser from the command modules, tries the paths a command will write before it runs, runs it under
its budget, prints its document (`--json`) or the text its module renders from that document, and maps bad input
to one line on stderr.

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
from functools import partial
from types import ModuleType
from typing import Any, Callable, Sequence

from .. import __version__
from ..engine.canon import to_jsonable
from ..engine.errors import ConfigError, KvsimError, TraceError
from ..engine.interrupt import INTERRUPT, BudgetExceeded, Interrupted, backstop, stopped_by, stopping_on_signals
from ..conform.cli import add_arguments as conform_arguments
from ..conform.cli import cmd_conform
from . import commands, outputs
from .commands.common import EXIT_INCOMPLETE, EXIT_USAGE, SETUP, one_line, public


# the engine's errors name its fields (`ExploreOptions`, a model's `param NAME`, `faults KIND`, `variant`, ...): the
# flags here
ENGINE_FLAGS = {"max_depth": "--max-depth", "max_states": "--max-states", "max_seconds": "--max-seconds",
                "store": "--store", "checkpoint": "--checkpoint", "resume": "--resume", "workers": "--workers",
                "ray": "--ray", "param": "--param", "faults": "--faults", "variant": "--variant",
                "property": "--property", "backend": "--backend"}


class UsageError(Exception):
    """An argument the parser refused; reported like any other bad input (one line, JSON too)."""


EXPIRED_AGAIN = 0.25  # seconds after a --max-seconds alarm that it fires again, until the command stops
# commands that stop cleanly at the first Ctrl-C or SIGTERM and report what ran (explore and fuzz do it themselves)
STOP_ON_SIGNALS = ("check", "repro", "simulate", "oracle")


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
        if SETUP["depth"]:
            SETUP["held"] = True
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
                SETUP["held"] = False
                break
            except BudgetExceeded:
                continue


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

    for module in commands.BEFORE_CONFORM:
        _command(sub, common, module)
    cf = sub.add_parser("conform", parents=[common],
                        help="run the models' properties against real vLLM / SGLang releases or a working tree")
    conform_arguments(cf)
    for module in commands.AFTER_CONFORM:
        _command(sub, common, module)
    return p


def _command(sub: Any, common: argparse.ArgumentParser, module: ModuleType) -> None:
    module.arguments(sub.add_parser(module.NAME, parents=[common], help=module.HELP))


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


# the exit code of the last command that finished in this process (`entry` reads it); None: none has yet
FINISHED: list[int | None] = [None]
# numpy's BLAS on the calling thread unless the user says otherwise (`entry`): kvsim's numeric models multiply
# matrices of a few to a few hundred rows, where a pool of BLAS threads adds CPU (threads spinning between calls: 0.2 s
# of a 0.9 s MLA report) and no wall time, and the commands that fan out run a worker per CPU, each with its own pool
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "1")


def entry() -> None:
    """The `kvsim` program: `main` on the process's arguments. A Ctrl-C that lands once the command has finished
    (its output printed, its handlers put back, the interpreter shutting down) ends the process at once with the
    command's exit code: before, it was taken as an interrupt of nothing (exit 130) or killed the interpreter in
    its shutdown (rc -2). Before the command finishes, a Ctrl-C is Python's as ever (the commands that stop
    cleanly on it install their own handler)."""

    def late(signum: int, frame: Any) -> None:
        if FINISHED[0] is None:
            raise KeyboardInterrupt
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or the reader went away: nothing more to say
                pass
        os._exit(FINISHED[0])

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, late)
    os.environ.setdefault(*BLAS_THREADS)  # read when numpy is first imported, which no command has done yet
    code = main()
    FINISHED[0] = code  # an error's exit code too
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_json = "--json" in argv
    try:
        args = _parser().parse_args(argv)
        _paths(args)
        # Ctrl-C or SIGTERM: the command stops as at its budget, and reports what ran (`kvsim.engine.interrupt`)
        signals = stopping_on_signals() if args.command in STOP_ON_SIGNALS else nullcontext()
        with _deadline(_alarm_seconds(args)), signals, _quiet_stops():
            code = COMMANDS[args.command](args)
            FINISHED[0] = code  # its output is out: a Ctrl-C from here on ends the `kvsim` process with it
            return code
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
        # a file's field, where the error names one (a counterexample's key); else the file and line
        fields = {"field": exc.key, "expected": exc.expected, "received": exc.received} \
            if isinstance(exc, TraceError) and exc.key is not None else \
            {"field": f"{exc.path}:{exc.line}", "expected": "a usable file", "received": exc.reason} \
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


def _alarm_seconds(args: argparse.Namespace) -> float | None:
    """When SIGALRM ends the command: at --max-seconds, or a little later for a simulation, which stops at
    --max-seconds itself between two events (the alarm is then only the backstop of one endless event)."""
    seconds = getattr(args, "max_seconds", None)
    if seconds is None:
        return None
    # simulate and replay stop at --max-seconds between two events, explore between two states, fuzz workers
    # between two rounds: the alarm is only the backstop of one endless step there. The oracle takes it at
    # --max-seconds itself: a kernel run it lands in is named as not run (it came 10 s late when it waited)
    return seconds + backstop(seconds) if args.command in ("simulate", "replay", "explore", "conform", "fuzz") \
        else seconds


def _fail(wants_json: bool, error: dict[str, Any], line: str) -> int:
    """Bad input: one line on stderr; with --json also {"error": {field, expected, received, message}} on stdout."""
    print(f"kvsim: error: {one_line(line)}", file=sys.stderr)
    if wants_json:
        print(json.dumps({"error": error}, sort_keys=True))
    return EXIT_USAGE


def _emit(args: argparse.Namespace, document: dict[str, Any], render: Callable[[dict[str, Any]], str | None]) -> None:
    """The JSON document (`--json`), or the text the command renders from it (None: the command printed its own
    output, `repro --report`'s Markdown)."""
    if args.json:
        print(json.dumps(to_jsonable(public(document)), sort_keys=True, indent=1))
        return
    text = render(document)
    if text is not None:
        print(text)


def _run(module: ModuleType, args: argparse.Namespace) -> int:
    """One command of `kvsim.app.commands`: its document, printed, and the exit code it gives."""
    document = module.run(args)
    _emit(args, document, module.render)
    return module.exit_code(document)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    **{m.NAME: partial(_run, m) for m in commands.BEFORE_CONFORM}, "conform": cmd_conform,
    **{m.NAME: partial(_run, m) for m in commands.AFTER_CONFORM},
}
