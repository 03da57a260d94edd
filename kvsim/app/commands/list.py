"""`kvsim list [MODEL]`: the catalog, or one model's variants, parameters, properties and bug reports."""

from __future__ import annotations

import argparse
from typing import Any

from .. import catalog
from .common import VIEW, table, view

NAME = "list"
HELP = "models, variants, properties, bug reports"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="one model: its variants, parameters (type, range, default), properties")


def run(args: argparse.Namespace) -> dict[str, Any]:
    doc = catalog.listing()
    if args.model is not None:  # `kvsim list ''` names no model: refused, as any unknown name is
        catalog.load().model(args.model)
        doc = {"models": [m for m in doc["models"] if m["name"] == args.model],
               "bugs": [b for b in doc["bugs"] if b["model"] == args.model]}
    return {**doc, VIEW: {"model": args.model}}


def render(doc: dict[str, Any]) -> str:
    if view(doc)["model"] is not None:
        return model_text(doc["models"][0], doc["bugs"])
    models = table(["model", "variants", "properties", "source"],
                   [[m["name"], ",".join(m["variants"]), len(m["properties"]), m["source"]] for m in doc["models"]])
    props = "\n".join(f"  {m['name']}: {', '.join(m['properties'])}" for m in doc["models"])
    bugs = table(["bug", "model", "variant", "status"],  # `kvsim list MODEL` adds what must fail
                 [[b["id"], b["model"], b["variant"], b["status"]] for b in doc["bugs"]])
    return f"{models}\n\nproperties:\n{props}\n\n{bugs}"


def exit_code(doc: dict[str, Any]) -> int:
    return 0


def model_text(m: dict[str, Any], bugs: list[dict[str, Any]]) -> str:
    def params(rows: list[dict[str, Any]]) -> str:
        if not rows:
            return "  (none)"
        return table(["parameter", "type", "default", "range", "meaning"],
                     [[p["name"], p["type"], _value(p["default"]), _range(p), p["doc"]] for p in rows])

    lines = [f"{m['name']}: {m['summary']}", f"source: {m['source']}", f"variants: {', '.join(m['variants'])}",
             "", "explore / stateful parameters (--param NAME=VALUE):", params(m["params"]),
             "", "simulate parameters (--param NAME=VALUE):", params(m["sim_params"]),
             "", "properties: " + ", ".join(m["properties"]),
             "", "reachability (kvsim explore reports each reached or not; * asked of steps; ~ asked of the cases "
                 "properties draw, by kvsim check):",
             _reach(m["sometimes"]),
             "", "bug reports:", table(["bug", "variant", "must fail", "status", "upstream releases"],
                                       [[b["id"], b["variant"], b["check"], b["status"], _verdicts(b)] for b in bugs])]
    return "\n".join(lines)


def _reach(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "  (none)"
    mark = {"state": "", "step": "*", "case": "~"}
    return "\n".join(f"  {r['name']}{mark[r['of']]}: {r['doc']}"
                     + (f" ({len(r['properties'])} properties)" if r["of"] == "case" else "") for r in rows)


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
