"""`kvsim replay FILE`: re-run a simulation trace, or a saved counterexample of check or explore, and verify it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...engine.interrupt import BudgetExceeded
from .. import catalog, counterexample
from .common import (EXIT_INCOMPLETE, RUN_MAX_SECONDS, VIEW, disarm, max_events_option, max_seconds_option, one_line,
                     short, view)

NAME = "replay"
HELP = "re-run a simulation trace, or a saved counterexample of check or explore, and verify it"


def arguments(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("trace", metavar="FILE", help="a JSONL trace of kvsim simulate, or a counterexample file "
                                                  "(check --save, explore --save, or their --json output)")
    max_events_option(rp)
    max_seconds_option(rp, RUN_MAX_SECONDS)


def run(args: argparse.Namespace) -> dict[str, Any]:
    doc = counterexample.sniff(args.trace)
    if doc is not None:
        return _replay_counterexample(args, doc)
    from ..simulate import replay_file

    result = replay_file(args.trace, catalog.models().models, max_events=args.max_events,
                         max_seconds=args.max_seconds)
    for warning in result.warnings:
        print(f"kvsim: warning: {one_line(warning)}", file=sys.stderr)
    return {**result.to_json(), VIEW: {"file": args.trace, "counterexample": False}}


def _replay_counterexample(args: argparse.Namespace, doc: dict[str, Any]) -> dict[str, Any]:
    reg = catalog.load() if doc.get("command") == "check" else catalog.models()
    found = counterexample.validated(args.trace, doc, reg)  # bad input is refused before anything runs
    try:
        result = counterexample.replay_validated(args.trace, found)
    except BudgetExceeded:  # the re-run (a Hypothesis run, the hang search from a path's end) did not end in time
        disarm()
        result = counterexample.CounterexampleReplay(
            args.trace, found.command, found.run.model.name, found.run.variant.name, found.check, False,
            f"INCOMPLETE: --max-seconds {args.max_seconds:g} ran out before the re-run ended; nothing is proved "
            "(exit 3)", stopped_by="max-seconds")
    return {**result.to_json(), VIEW: {"file": args.trace, "counterexample": True}}


def render(doc: dict[str, Any]) -> str:
    text = view(doc)
    if text["counterexample"]:
        head = (f"{text['file']}: {doc['command']} counterexample of {doc['model']} [{doc['variant']}] "
                f"{doc['check']}: " + ("reproduced" if doc["matches"] else "not finished" if doc["stopped_by"]
                                       else "NOT reproduced"))
        program = "".join(f"\n  {line}" for line in doc["program"])
        return f"{head}\n  {doc['message']}{program}"
    if doc["matches"] and not doc["complete"]:
        return (f"{text['file']}: {doc['steps']} steps replayed and matched, then INCOMPLETE: the "
                f"{doc['stopped_by']} budget stopped the re-run before the trace's end (exit 3)")
    if doc["matches"]:
        return f"{text['file']}: {doc['steps']} steps replayed, digest {doc['digest']} matches"
    return (f"{text['file']}:{doc['line']}: diverged\n  trace has: {short(doc['got'], 200)}\n"
            f"  re-run gives: {short(doc['expected'], 200)}")


def exit_code(doc: dict[str, Any]) -> int:
    if view(doc)["counterexample"]:
        return 0 if doc["matches"] else EXIT_INCOMPLETE if doc["stopped_by"] else 1
    return 1 if not doc["matches"] else EXIT_INCOMPLETE if not doc["complete"] else 0
