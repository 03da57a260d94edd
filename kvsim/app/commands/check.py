"""`kvsim check MODEL`: a model's properties on one variant."""

from __future__ import annotations

import argparse
from typing import Any

from ...engine.descriptor import ModelDescriptor, RunSpec
from ...engine.errors import ConfigError
from ...engine.progress import Progress
from ...engine.system import REACH_EXAMPLES, UNREACHED
from .. import catalog, counterexample, junit
from ..argtypes import integer, positive_int
from .common import (EXIT_INCOMPLETE, VIEW, disarm, each, model_option, model_params_option, param_values, setup, short,
                     stopped_early, suite_options, table, view)

NAME = "check"
HELP = "run a model's properties on one variant"


def arguments(p: argparse.ArgumentParser) -> None:
    model_option(p, "a model name (kvsim list)")
    p.add_argument("--property", action="append", help="only this property (repeatable)")
    p.add_argument("--max-examples", type=positive_int("--max-examples"), default=REACH_EXAMPLES,
                   help=f"Hypothesis examples per property (default: {REACH_EXAMPLES}; with fewer, a `sometimes` no "
                        "drawn case met is not a failure)")
    p.add_argument("--seed", type=integer("--seed"), default=0,
                   help="Hypothesis seed: same seed, same counterexample (default: 0)")
    model_params_option(p)
    p.add_argument("--save", metavar="FILE", help="write the first counterexample here (kvsim replay FILE re-runs it)")
    suite_options(p)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with setup():
        reg = catalog.load()
        model = reg.model(args.model)
        # model, variant and parameters are resolved here, once; only what the user set travels on
        spec = RunSpec.resolve(model, args.variant, param_values(args, model))
        backend = kernel_backend(args, model, reg)
        props = [reg.property(model.name, name) for name in args.property] if args.property \
            else [p for p in reg.properties_of(model.name) if backend is None or p.is_kernel]  # --backend: kernels
    progress = Progress(len(props), "check")
    results, not_run, stopped = each(props, lambda p: p.name, lambda p: check_one(p, spec, args, backend), progress)
    disarm()
    progress.close()
    doc = {"model": model.name, "variant": spec.variant.name, "seed": args.seed, "max_examples": args.max_examples,
           "params": spec.given, "backend": backend, "results": [r.to_json() for r in results],
           "complete": stopped is None, "stopped_by": stopped, "not_run": not_run}
    if args.junit:
        junit.write(args.junit, "kvsim check", [junit.check(doc)])
    failed = [r for r in results if r.status not in ("passed", "skipped")]
    if args.save and failed:
        counterexample.write(args.save, counterexample.check_document(spec, failed[0], args.seed, args.max_examples,
                                                                      backend))
    return {**doc, VIEW: {"seconds": [r.seconds for r in results], "save": args.save,
                          "max_seconds": args.max_seconds}}


def _failed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["results"] if r["status"] not in ("passed", "skipped")]


def render(doc: dict[str, Any]) -> str:
    text, failed = view(doc), _failed(doc)
    rows = [[r["property"], r["status"], r["examples"], f"{seconds:.3f}",
             short(r["counterexample"]) if r["counterexample"] else short(r["message"], 60)
             if r["status"] == "skipped" else ""] for r, seconds in zip(doc["results"], text["seconds"])]
    tail = ""
    for r in failed:
        tail += f"\n{r['property']}: {r['message']}"
        program = (r["counterexample"] or {}).get("program") if isinstance(r["counterexample"], dict) else None
        if program:
            tail += "\n  " + "\n  ".join(program)
        tail += f"\n  replay: {r['replay']}"
    if text["save"] and failed:
        tail += f"\ncounterexample saved to {text['save']} (kvsim replay {text['save']})"
    tail += reach_lines(doc["results"])
    if doc["stopped_by"]:
        tail += (f"\nINCOMPLETE: {stopped_early(doc['stopped_by'], text['max_seconds'])}; not run: "
                 f"{', '.join(doc['not_run'])}" + ("" if failed or unreached(doc) else
                                                   "; nothing was found, and nothing is proved (exit 3)"))
    tail += vacuity(doc, bool(failed))
    return f"{doc['model']} [{doc['variant']}]\n" + table(["property", "status", "examples", "seconds",
                                                           "counterexample"], rows) + tail


def reach_lines(results: list[dict[str, Any]]) -> str:
    """The `sometimes` of the data properties that held: how many a drawn case met (the first case of each: --json),
    a line for each that the property's whole default budget never drew, and one line naming those a smaller
    budget did not meet (a bound, not a failure). A property that failed says enough already (--json has them)."""
    goals = [(r["property"], g) for r in results if r["status"] == "passed" for g in r.get("reachability", ())]
    if not goals:
        return ""
    text = f"\nsometimes: {sum(g['reached'] for _, g in goals)} of {len(goals)} met by a drawn case (the first " \
           "of each: --json)"
    for name, g in goals:
        if g["status"] == UNREACHED:
            text += (f"\nUNREACHED sometimes {g['name']} ({name}): no case of {g['drawn']} drawn satisfies it "
                     f"({g['doc']})")
    bounded = [f"{g['name']} ({name})" for name, g in goals if not g["reached"] and g["status"] != UNREACHED]
    if bounded:
        text += (f"\nnot met within fewer than {REACH_EXAMPLES} examples (a bound, not a failure): "
                 f"{', '.join(bounded)}")
    return text


def unreached(doc: dict[str, Any]) -> list[str]:
    """'PROPERTY never draws NAME, ...' for each property with a `sometimes` its whole budget never met (`check`'s
    and `fuzz`'s documents: exit 1)."""
    out = []
    for r in doc["results"]:
        names = [g["name"] for g in r.get("reachability", ()) if g["status"] == UNREACHED]
        if names:
            out.append(f"{r['property']} never draws {', '.join(names)}")
    return out


def vacuity(doc: dict[str, Any], failed: bool) -> str:
    """The closing line where every property held but one never drew what it declares (a failure says more)."""
    never = unreached(doc)
    if failed or not never:
        return ""
    return (f"\nevery property holds, but {'; '.join(never)}: a property whose inputs never reach the corner it is "
            "about may hold vacuously (exit 1)")


def exit_code(doc: dict[str, Any]) -> int:
    return 1 if _failed(doc) or unreached(doc) else EXIT_INCOMPLETE if doc["stopped_by"] else 0


def kernel_backend(args: argparse.Namespace, model: ModelDescriptor, registry: Any) -> str | None:
    """`--backend` as the kernel backend: only for a model without a `backend` parameter, and one of the
    backends its kernel properties run on."""
    if getattr(args, "backend", None) is None or any(s.name == "backend" for s in model.params):
        return None
    known = list(dict.fromkeys(b for p in registry.properties_of(model.name) if p.is_kernel for b in p.backends))
    if args.backend not in known:
        raise ConfigError("--backend", f"a kernel backend of model {model.name} ({', '.join(known)})" if known
                          else f"no --backend: model {model.name} has no kernel properties", args.backend)
    return args.backend


def check_one(prop: Any, spec: RunSpec, args: argparse.Namespace, backend: str | None) -> Any:
    from ...engine.runner import PropertyResult, run_property  # Hypothesis is imported only to run properties

    if prop.is_kernel:
        if backend is None:
            return PropertyResult(prop.name, prop.model, spec.variant.name, "skipped", 0, 0.0,
                                  message=f"a kernel property: choose --backend ({', '.join(prop.backends)}) "
                                          "or run kvsim oracle")
        if backend not in prop.backends:
            return PropertyResult(prop.name, prop.model, spec.variant.name, "skipped", 0, 0.0,
                                  message=f"runs on {', '.join(prop.backends)} only")
        from .. import oracle

        return oracle.run_kernel_property(prop, backend, variant=spec.variant, max_examples=args.max_examples,
                                          seed=args.seed, descriptor=spec.model)
    if backend is not None:
        return PropertyResult(prop.name, prop.model, spec.variant.name, "skipped", 0, 0.0,
                              message=f"not a kernel property: --backend {backend} does not apply")
    return run_property(prop, spec.variant, max_examples=args.max_examples, seed=args.seed,
                        params=dict(spec.given) or None, descriptor=spec.model)
