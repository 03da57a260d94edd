"""`kvsim simulate MODEL`: one timed, seeded simulation with fault injection."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.descriptor import RunSpec
from ...engine.errors import ConfigError
from ...engine.interrupt import INTERRUPT, stopped_by
from .. import catalog
from ..argtypes import integer
from .common import (EXIT_INCOMPLETE, RUN_MAX_SECONDS, VIEW, max_events_option, max_seconds_option, model_option,
                     model_params_option, param_values, short, view)

NAME = "simulate"
HELP = "timed, seeded simulation with fault injection"


def arguments(s: argparse.ArgumentParser) -> None:
    model_option(s, "a model with a timed simulation (kvsim list)")
    s.add_argument("--seed", type=integer("--seed"), default=0, help="the run's one random seed (default: 0)")
    s.add_argument("--faults", default="", metavar="SPEC", help="e.g. drop=0.05,delay=0.1:2.0,crash=peer@30")
    s.add_argument("--trace", metavar="FILE", help="write the JSONL trace here")
    model_params_option(s)
    s.add_argument("--self-check", action="store_true", help="run the seed twice and compare the digests")
    max_events_option(s)
    max_seconds_option(s, RUN_MAX_SECONDS)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..simulate import simulate_model

    spec = catalog.models().model(args.model)
    resolved = RunSpec.resolve(spec, args.variant, param_values(args, spec), spec.sim_params)
    budget = {"max_events": args.max_events, "max_seconds": args.max_seconds}
    result = simulate_model(spec, resolved.variant, args.seed, dict(resolved.params), args.faults or None, **budget)
    if args.trace:
        try:
            result.recorder.write(args.trace)
        except OSError as exc:
            raise ConfigError("--trace", "a writable file path", args.trace, exc.strerror or "") from None
    doc = result.to_json()
    _name_reports(spec.name, doc["summary"])
    if args.self_check and result.stopped_by == INTERRUPT:  # asked to stop: the second run is not made
        doc["self_check"] = {"digest": None, "matches": None}
    elif args.self_check:
        again = simulate_model(spec, resolved.variant, args.seed, dict(resolved.params), args.faults or None,
                               max_events=result.events if result.stopped_by else args.max_events)
        doc["self_check"] = {"digest": again.digest, "matches": again.digest == result.digest}
    return {**doc, VIEW: {"sim_time": result.sim_time, "seconds": result.seconds, "trace": args.trace,
                          "max_events": args.max_events, "max_seconds": args.max_seconds}}


def _name_reports(model: str, summary: dict[str, Any]) -> None:
    """Each room the simulation named a mechanism for gets the catalog report of that mechanism (`report`)."""
    named = summary.get("named")
    if named:
        reports = {b.mechanism: b.id for b in catalog.load().bugs.values() if b.model == model and b.mechanism}
        summary["named"] = [{**entry, "report": reports.get(entry["mechanism"])} for entry in named]


NAMED_SHOWN = 8  # rooms listed under "named" in the text view (all of them under --json)


def _named_lines(named: list[dict[str, Any]]) -> list[str]:
    lines = [f"  named: {len(named)} room{'s' if len(named) != 1 else ''} (the catalog report each one's "
             "evidence shows)"]
    for entry in named[:NAMED_SHOWN]:
        report = entry.get("report") or "no catalogued mechanism"
        lines.append(f"    room {entry['room']} {entry['invariant']}: {report} ({entry['evidence']})")
    if len(named) > NAMED_SHOWN:
        lines.append(f"    (+{len(named) - NAMED_SHOWN} more: --json lists every room)")
    return lines


def _failed(doc: dict[str, Any]) -> bool:
    deterministic = doc.get("self_check", {}).get("matches") is not False
    return bool(doc["summary"].get("violations")) or not deterministic


def render(doc: dict[str, Any]) -> str:
    text, stopped = view(doc), doc["stopped_by"]
    lines = [f"{doc['model']} [{doc['variant']}] seed {doc['seed']}: {doc['events']} events, simulated "
             f"{text['sim_time']:.3f} s in {text['seconds']:.3f} s", f"digest {doc['digest']}"]
    if "self_check" in doc and doc["self_check"]["digest"] is None:
        lines.append("self-check: not run (interrupted)")
    elif "self_check" in doc:
        lines.append(f"self-check: second run digest {doc['self_check']['digest']} "
                     f"{'matches' if doc['self_check']['matches'] else 'DIFFERS'}")
    lines += [f"  {k}: {short(v)}" for k, v in doc["summary"].items() if k != "named"]
    if doc["summary"].get("named"):
        lines += _named_lines(doc["summary"]["named"])
    if text["trace"]:
        lines.append(f"trace written to {text['trace']}")
    if stopped:
        bound = {"max-events": f"the --max-events {text['max_events']} budget",
                 "max-seconds": f"the --max-seconds {text['max_seconds']:g} budget",
                 INTERRUPT: stopped_by(INTERRUPT)}[stopped]
        lines.append(f"INCOMPLETE: {bound} stopped the run after {doc['events']} events with work "
                     "left; the summary covers what ran" + ("" if _failed(doc) else
                                                            "; nothing was found, and nothing is proved (exit 3)"))
    return "\n".join(lines)


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if _failed(doc) else EXIT_INCOMPLETE if doc["stopped_by"] else 0
