"""`kvsim repro BUG_ID | --all`: reproduce bug reports from the seeds."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.progress import Progress
from .. import catalog, junit
from ..argtypes import integer, positive_int
from ..forked import cpu_count
from .common import (EXIT_INCOMPLETE, VIEW, disarm, each, each_forked, setup, short, stopped_early, suite_options,
                     table, view)

NAME = "repro"
HELP = "reproduce bug reports from the seeds"


def arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("bug_id", nargs="?", help="one bug report (kvsim list)")
    group.add_argument("--all", action="store_true", help="every bug report of the catalog")
    p.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed (default: 0)")
    p.add_argument("--wide", action="store_true", help="add the source, property and counterexample columns")
    p.add_argument("--report", action="store_true", help="write a Markdown bug report (to stdout, or --out)")
    p.add_argument("--out", metavar="FILE", help="with --report: the file (a folder with --all: FOLDER/ID.md)")
    p.add_argument("--workers", type=positive_int("--workers"), default=None, metavar="N",
                   help="with --all: run the reports on N forked worker processes, the output in catalog order "
                        "whatever order they finish in (default: the CPU count; 1: in this process)")
    suite_options(p)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with setup():  # the reproduction's modules are imported in it too: an alarm there is held like one in the catalog
        from ..repro import BugRun, ReproResult, generated_first, latest_verdict, release_verdicts, reproduce

        reg = catalog.load()
        bugs = list(reg.bugs.values()) if args.all else [reg.bug(args.bug_id)]
        progress = Progress(len(bugs), "repro")
        # each report resolved once (its model, property and variants), and the record passed down
        runs = [BugRun.resolve(b, reg) for b in bugs]
    workers = min(len(runs), cpu_count() if args.workers is None else args.workers)
    errors: list[dict[str, str]] = []
    if workers > 1:  # a worker hands back the result's fields, and the report is put back together here
        results, not_run, stopped, errors = each_forked(
            runs, lambda r: r.bug.id, lambda r: reproduce(r, seed=args.seed).fields(), progress, workers,
            lambda r, fields: ReproResult.from_fields(r, fields), first=generated_first)
    else:
        results, not_run, stopped = each(runs, lambda r: r.bug.id, lambda r: reproduce(r, seed=args.seed), progress)
    disarm()
    progress.close()
    if args.junit:
        junit.write(args.junit, "kvsim repro", [junit.repro(results, not_run, args.seed, stopped, errors)])
    reports: Any = None
    printed = False
    if args.report:
        from ..report_md import render as report, write_reports

        if not args.json:
            write_reports(results, args.out, folder=args.all, seed=args.seed)
            printed = True  # the reports are the output
        else:
            # --json: stdout holds the one JSON document, with the reports in it (or the paths they were written to)
            reports = write_reports(results, args.out, folder=args.all, seed=args.seed) if args.out else \
                {r.bug.id: report(r.bug, r, args.seed) for r in results}
    doc = {"seed": args.seed, "bugs": [r.to_json() for r in results], "complete": stopped is None,
           "stopped_by": stopped, "not_run": not_run, "errors": errors,
           **({} if reports is None else {"reports": reports})}
    return {**doc, VIEW: {"printed": printed, "wide": args.wide, "max_seconds": args.max_seconds,
                          "ok": [r.ok for r in results], "seconds": [r.seconds + r.fixed_seconds for r in results],
                          "releases": [release_verdicts(r.bug) for r in results],
                          "latest": [latest_verdict(r.bug) for r in results]}}


def render(doc: dict[str, Any]) -> str | None:
    text = view(doc)
    if text["printed"]:
        return None
    wide, results = text["wide"], doc["bugs"]

    def row(i: int, r: dict[str, Any]) -> list[Any]:
        searched = f"{r['examples'] if r['property'] else r['states']} {'examples' if r['property'] else 'states'}"
        cells = [r["id"], r["status"], searched, f"{text['seconds'][i]:.3f}", "yes" if r["reproduced"] else "no",
                 {True: "yes", False: "NO", None: "-"}[r["fixed_passes"]], "holds" if text["ok"][i] else "BROKEN"]
        if wide:
            cells[2:2] = [r["source"], r["check"]]
            cells.append(text["releases"][i])
            cells.append(short(r["counterexample"], 80) if r["counterexample"] else "")
        return cells

    headers = ["bug", "status", "searched", "seconds", "repro", "fixed", "verdict"]
    if wide:  # everything; the default fits a 120-column terminal
        headers[2:2] = ["upstream source", "property / invariant"]
        headers += ["upstream releases", "counterexample"]
    ok = sum(text["ok"])
    width = max([len(r["id"]) for r in results] + [0])
    tail = ""
    if doc["stopped_by"]:
        tail = (f"\nINCOMPLETE: {stopped_early(doc['stopped_by'], text['max_seconds'])}; not run: "
                f"{', '.join(doc['not_run'])}" + ("" if _broken(doc) else "; nothing was found, and nothing is "
                                                                           "proved (exit 3)"))
    releases = "" if wide else "".join(
        f"\n  {r['id']:<{width}}  {latest}" for r, latest in zip(results, text["latest"]) if r["verdicts"])
    if releases:  # below the table, which stays within 120 columns (--wide puts every release in a column)
        releases = "\n\nin the newest upstream release each finding names (--wide: every release):" + releases
    failed = "".join(f"\nerror: {e['id']}: {e['error']}" for e in doc["errors"])
    return table(headers, [row(i, r) for i, r in enumerate(results)]) + releases + failed + \
        f"\n\n{ok} of {len(results) + len(doc['not_run']) + len(doc['errors'])} bug reports hold" + tail


def _broken(doc: dict[str, Any]) -> bool:
    return not all(view(doc)["ok"]) or bool(doc["errors"])


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if _broken(doc) else EXIT_INCOMPLETE if doc["stopped_by"] else 0
