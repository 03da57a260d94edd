"""`kvsim oracle`: the differential kernel checks on every available backend."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.progress import Progress
from .. import catalog, junit
from ..argtypes import integer, positive_int
from .common import EXIT_INCOMPLETE, SETUP, VIEW, disarm, setup, short, stopped_early, suite_options, table, view

NAME = "oracle"
HELP = "differential kernel checks on every available backend"
STATUSES = ("passed", "failed", "error", "skipped")


def arguments(o: argparse.ArgumentParser) -> None:
    o.add_argument("--max-examples", type=positive_int("--max-examples"), default=50,
                   help="Hypothesis examples per kernel property and backend (default: 50)")
    o.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed (default: 0)")
    suite_options(o)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with setup():  # the oracle's modules are imported in it too: an alarm there is held like one in the catalog
        from .. import oracle

        reg, rows = catalog.load(), oracle.backends()
        progress = Progress(None, "oracle")
    if SETUP["held"]:  # an alarm held in the set-up: no run starts (a budget of 0 s), every run is named not run
        disarm()
    doc = oracle.oracle_report(reg, max_examples=args.max_examples, seed=args.seed, progress=progress.note,
                               max_seconds=0.0 if SETUP["held"] else args.max_seconds, rows=rows, on_stop=disarm)
    disarm()
    progress.close()
    doc["totals"] = {s: sum(c["status"] == s for c in doc["checks"]) for s in STATUSES}
    if args.junit:
        junit.write(args.junit, "kvsim oracle", [junit.oracle(doc, args.max_examples, args.seed)])
    return {**doc, VIEW: {"max_seconds": args.max_seconds}}


def _failed(doc: dict[str, Any]) -> bool:
    return any(c["status"] not in ("passed", "skipped") for c in doc["checks"])


def render(doc: dict[str, Any]) -> str:
    backends = table(["backend", "available", "reason"],
                     [[b["name"], "yes" if b["available"] else "no", b["reason"]] for b in doc["backends"]])
    checks = table(["check", "backend", "examples", "status", "message"],
                   [[c["name"], c["backend"], c["examples"], c["status"], short(c.get("message", ""), 60)]
                    for c in doc["checks"]])
    counts = {s: sum(c["status"] == s for c in doc["checks"]) for s in STATUSES}
    total = (f"{len(doc['checks'])} kernel property runs: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['error']} error, {counts['skipped']} skipped (a backend this machine lacks)")
    if doc["not_run"]:
        total += (f"\nINCOMPLETE: {stopped_early(doc['stopped_by'], view(doc)['max_seconds'])}; "
                  f"{len(doc['not_run'])} runs not run (first: {doc['not_run'][0]})"
                  + ("" if _failed(doc) else "; nothing was found, and nothing is proved (exit 3)"))
    return f"{backends}\n\n{checks}\n\n{total}"


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if _failed(doc) else EXIT_INCOMPLETE if doc["not_run"] else 0
