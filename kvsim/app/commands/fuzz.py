"""`kvsim fuzz MODEL`: a model's properties searched by many workers sharing one example database."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.descriptor import RunSpec
from ...engine.errors import ConfigError
from ...engine.interrupt import INTERRUPT, stopped_by, stopping_on_signals
from ...engine.progress import Progress
from .. import catalog
from ..argtypes import integer, positive_float, positive_int
from .check import reach_lines, unreached, vacuity
from .common import (EXIT_INCOMPLETE, FUZZ_MAX_MINUTES, VIEW, disarm, max_seconds_option, model_option,
                     model_params_option, param_values, short, table, view)

NAME = "fuzz"
HELP = "a model's properties searched by many workers sharing one example database"


def arguments(f: argparse.ArgumentParser) -> None:
    model_option(f, "a model name (kvsim list)")
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
    model_params_option(f)
    max_seconds_option(f, FUZZ_MAX_MINUTES * 60)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from .. import fuzz

    reg = catalog.load()
    model = reg.model(args.model)
    resolved = RunSpec.resolve(model, args.variant, param_values(args, model))
    props = [reg.property(model.name, name) for name in args.property] if args.property \
        else [p for p in reg.properties_of(model.name) if not p.is_kernel]
    kernels = [p.name for p in props if p.is_kernel]
    if kernels:
        raise ConfigError("--property", "a property that is not a kernel check (kvsim oracle runs those)", kernels[0])
    database = args.database or fuzz.default_database(model.name)
    progress = Progress(None, "fuzz")
    with stopping_on_signals():  # Ctrl-C or SIGTERM: the workers end after their current property, and report
        doc = fuzz.fuzz(model.name, resolved.variant.name, [p.name for p in props], dict(resolved.given), database,
                        args.workers, args.seed, args.minutes * 60, ray_address=args.ray, progress=progress,
                        max_examples=args.max_examples, max_seconds=args.max_seconds)
    disarm()
    progress.close()
    return {**doc, VIEW: {"model": model.name, "variant": resolved.variant.name, "database": database,
                          "max_seconds": args.max_seconds}}


def _failed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["results"] if r["status"] != "passed"]


def render(doc: dict[str, Any]) -> str:
    text, failed = view(doc), _failed(doc)
    rows = [[r["property"], r["status"], r["examples"], ",".join(map(str, r["found_by"])) or "-",
             short(r["counterexample"]) if r["counterexample"] else ""] for r in doc["results"]]
    workers = "".join(f"\nworker {w['worker']}: {w['examples']} examples in {w['rounds']} rounds, "
                      f"{w['seconds']:.1f} s ({w['examples_per_second']:,.0f} examples/s)" for w in doc["workers"])
    tail = "".join(f"\n{r['property']}: {r['message']}\n  replay: {r['replay']}" for r in failed)
    tail += reach_lines(doc["results"]) + vacuity(doc, bool(failed))
    if doc["stopped_by"]:
        cause = stopped_by(INTERRUPT) if doc["interrupted"] else f"--max-seconds {text['max_seconds']:g}"
        tail += (f"\nstopped early: {cause} ended the workers before their --minutes; the "
                 "examples above are what they ran" + ("" if failed or unreached(doc) else
                                                        ", and nothing is proved (exit 3)"))
    return (f"{text['model']} [{text['variant']}] database {text['database']}\n"
            + table(["property", "status", "examples", "found by", "counterexample"], rows) + workers + tail)


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if _failed(doc) or unreached(doc) else EXIT_INCOMPLETE if doc["stopped_by"] else 0
