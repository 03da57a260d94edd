"""`kvsim show BUG_ID | --from FILE`: draw a counterexample, a sequence chart or the shrunk input."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...engine.errors import ConfigError
from .. import catalog
from ..argtypes import integer, positive_int
from .common import SUITE_MAX_SECONDS, VIEW, disarm, max_seconds_option, view

NAME = "show"
HELP = "draw a counterexample: a sequence chart, or the shrunk input"


def arguments(sh: argparse.ArgumentParser) -> None:
    what = sh.add_mutually_exclusive_group(required=True)
    what.add_argument("bug_id", nargs="?", help="a bug report (kvsim list): its counterexample, reproduced")
    what.add_argument("--from", dest="from_file", metavar="FILE", help="a saved counterexample (check or explore "
                      "--save, or their --json output) or a simulation trace")
    sh.add_argument("--out", metavar="FILE", help="write the drawing to FILE (.svg or .png) (default: text on stdout)")
    sh.add_argument("--seed", type=integer("--seed"), default=0, help="Hypothesis seed of the reproduction (default: 0)")
    sh.add_argument("--steps", type=positive_int("--steps"), default=40,
                    help="a trace: draw this many steps, ending at the first violation (default: 40)")
    max_seconds_option(sh, SUITE_MAX_SECONDS)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..show import sources

    if args.out is not None:
        from ..site import CHARTS_MISSING, can_draw

        if not can_draw():
            raise ConfigError("--out", "matplotlib installed to draw the chart (pip install 'kvsim[charts]'); "
                                       "without --out the chart is printed as text", args.out, CHARTS_MISSING)
        from ..show.draw import draw, output_format

        output_format(args.out)  # a wrong suffix is refused before anything runs
    reg = catalog.load()
    if args.from_file is not None:
        drawing = sources.of_file(args.from_file, reg, steps=args.steps)
    else:
        bug = reg.bug(args.bug_id)
        drawing = sources.of_bug(reg, bug, seed=args.seed)
        if drawing is None:
            return {"bug": bug.id, "counterexample": None,
                    VIEW: {"check": bug.check, "variant": bug.variant, "status": bug.status}}
    disarm()
    if args.out is not None:
        draw(drawing, args.out)
    return {**drawing.to_json(), "out": args.out, VIEW: {"tty": sys.stdout.isatty()}}


def render(doc: dict[str, Any]) -> str:
    from ..show.chart import from_json
    from ..show.text import render_text

    text = view(doc)
    if "kind" not in doc:  # a bug report whose check does not fail: nothing to draw
        return f"{doc['bug']}: no counterexample: {text['check']} does not fail on {text['variant']} " \
               f"(status: {text['status']})"
    out = doc["out"]
    if out is None or text["tty"]:
        return render_text(from_json(doc)) + (f"\nwritten to {out}" if out else "")
    return f"written to {out}"


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if "kind" not in doc else 0
