"""`kvsim report --out DIR`: the catalog, bug reports, charts, conformance and benchmarks as a static HTML site."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.progress import Progress
from .. import catalog
from ..argtypes import integer, positive_int
from ..forked import cpu_count
from .common import (EXIT_INCOMPLETE, SETUP, SUITE_MAX_SECONDS, VIEW, disarm, each_forked, max_seconds_option, setup,
                     view)

NAME = "report"
HELP = ("write the catalog, bug reports, counterexample charts, conformance and benchmark results as a static HTML "
        "site")


def arguments(rt: argparse.ArgumentParser) -> None:
    rt.add_argument("--out", metavar="DIR", required=True, help="the folder to write (index.html in it)")
    rt.add_argument("--conform", metavar="FILE", action="append", default=[],
                    help="output of kvsim conform ... --json to include (repeatable)")
    rt.add_argument("--bench", metavar="FILE", action="append", default=[],
                    help="a benchmark's JSON results to include (repeatable)")
    rt.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed of the reproductions (default: 0)")
    rt.add_argument("--workers", type=positive_int("--workers"), default=None, metavar="N",
                    help="reproduce the bug reports on N forked worker processes, as kvsim repro --all (default: the "
                         "CPU count; 1: in this process)")
    max_seconds_option(rt, SUITE_MAX_SECONDS)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with setup():  # the site's modules are imported in it too: an alarm there is held like one in the catalog
        from ..site import build_site, drawing_function

        reg = catalog.load()
        drawing_function()  # matplotlib imported in the set-up, where it is installed
        progress = Progress(len(reg.bugs), "report")
    workers = min(len(reg.bugs), cpu_count() if args.workers is None else args.workers)

    def batch(bugs: list[Any]) -> tuple[list[Any], str | None]:
        """The reproductions on the forked workers, as `kvsim repro --all` makes them (each handed back as plain
        values and put back together here)."""
        from ..repro import BugRun, ReproResult, generated_first, reproduce

        runs = [BugRun.resolve(b, reg) for b in bugs]
        made, _, stopped, _ = each_forked(runs, lambda r: r.bug.id, lambda r: reproduce(r, seed=args.seed).fields(),
                                          progress, workers, ReproResult.from_fields, first=generated_first)
        return made, stopped

    # an alarm in the set-up (here, or the site's folders and inputs) is held: then no report is reproduced, each
    # is named as not run; one that comes later cuts the report it lands in
    result = build_site(args.out, reg, seed=args.seed, conform=args.conform, bench=args.bench,
                        progress=None if workers > 1 else progress.step, on_stop=disarm, spent=lambda: SETUP["held"],
                        setup=setup, batch=batch if workers > 1 else None)
    disarm()
    progress.close()
    return {**result.to_json(), VIEW: {"out": args.out, "seconds": result.seconds, "max_seconds": args.max_seconds}}


def render(doc: dict[str, Any]) -> str:
    text = view(doc)
    cut = (f"\nINCOMPLETE: --max-seconds {text['max_seconds']:g} ran out; not reproduced: {', '.join(doc['not_run'])}"
           if doc["not_run"] else "")
    return (f"{text['out']}/index.html: {doc['bugs']} bug reports ({doc['holding']} hold), {len(doc['charts'])} "
            f"charts, {len(doc['pages'])} files, {doc['bytes'] / 1024:.0f} KiB, {text['seconds']:.1f} s"
            + (f"\n{doc['without_charts']}" if doc["without_charts"] else "") + cut)


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if doc["holding"] != doc["bugs"] else EXIT_INCOMPLETE if doc["not_run"] else 0
