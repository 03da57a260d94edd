"""`kvsim explore MODEL`: the exhaustive bounded search of a model's transition system."""

from __future__ import annotations

import argparse
from typing import Any

from ... import __version__
from ...engine.canon import canonical_json
from ...engine.descriptor import ModelDescriptor, RunSpec
from ...engine.errors import ConfigError
from ...engine.explore import DEFAULT_MAX_STATES, UNREACHED, Coverage, ExploreOptions, explore
from ...engine.interrupt import INTERRUPT, stopped_by, stopping_on_signals
from ...engine.memory import DEFAULT_SHARE, machine
from ...engine.explore.parallel import explore_parallel
from ...engine.progress import Progress
from .. import catalog, counterexample, junit, linecov
from ..argtypes import positive_float, positive_int
from .common import (EXIT_INCOMPLETE, RUN_MAX_SECONDS, VIEW, disarm, junit_option, max_seconds_option,
                     model_option, model_params_option, param_values, short, view)

NAME = "explore"
HELP = "exhaustive bounded search of a model's transition system"


def arguments(e: argparse.ArgumentParser) -> None:
    model_option(e, "a model with a transition system (kvsim list)")
    e.add_argument("--max-depth", type=positive_int("--max-depth"),
                   help="stop expanding at this depth (default: none)")
    e.add_argument("--max-states", type=positive_int("--max-states"), default=DEFAULT_MAX_STATES,
                   help=f"stop after this many distinct states (default: {DEFAULT_MAX_STATES})")
    model_params_option(e)
    e.add_argument("--graph", metavar="FILE", help="write the state graph as GraphML")
    e.add_argument("--save", metavar="FILE", help="write the first violation here (kvsim replay FILE re-runs it)")
    e.add_argument("--no-liveness", action="store_true", help="skip the hang search")
    e.add_argument("--store", default="full", choices=("full", "fingerprint"),
                   help="keep every state (full: the graph can be exported) or 64-bit fingerprints in flat arrays "
                        "(fingerprint: tens of bytes a state; paths rebuilt by replay) (default: full)")
    e.add_argument("--no-symmetry", action="store_true",
                   help="explore every state even where the model declares interchangeable rooms, requests or "
                        "writers (default: one representative per orbit)")
    e.add_argument("--workers", type=positive_int("--workers"), default=1,
                   help="search with this many worker processes, the state space partitioned by hash; same results "
                        "as one process (default: 1)")
    e.add_argument("--ray", metavar="ADDRESS",
                   help="run the workers as actors on a Ray cluster at ADDRESS ('local' starts one on this machine; "
                        "needs the ray package) (default: no Ray)")
    e.add_argument("--coverage", action="store_true",
                   help="also measure line coverage of the model's package during the run (needs the coverage "
                        "package; default: off)")
    e.add_argument("--max-memory", type=positive_float("--max-memory"), metavar="GIB",
                   help="stop cleanly when the search's resident memory on a machine (its workers there included) "
                        "passes this many GiB, checked every few thousand states or each level (default: "
                        f"{DEFAULT_SHARE * 100:.0f}%% of each machine's memory, here "
                        f"{DEFAULT_SHARE * machine()[1] / 2 ** 30:.1f})")
    saving = e.add_mutually_exclusive_group()
    saving.add_argument("--checkpoint", metavar="DIR",
                        help="save the search in DIR (a new or empty folder) every --checkpoint-minutes and when "
                             "--max-seconds, --max-memory or --max-states stops it; go on with --resume DIR "
                             "(default: no checkpoint)")
    saving.add_argument("--resume", metavar="DIR",
                        help="go on from the search saved in DIR: the command that saved it, with larger bounds; "
                             "it keeps saving there (every file of a checkpoint is authenticated with your key in "
                             "the kvsim cache folder: one changed, or another's, is refused)")
    e.add_argument("--checkpoint-minutes", type=positive_float("--checkpoint-minutes"), metavar="M",
                   help="with --checkpoint or --resume: minutes between two saves while the search runs (default: 10)")
    junit_option(e)
    max_seconds_option(e, RUN_MAX_SECONDS)


def _checkpoint(args: argparse.Namespace, spec: ModelDescriptor, run: RunSpec, system: Any) -> dict[str, Any]:
    """`explore`'s checkpoint options for --checkpoint DIR / --resume DIR (none without them).

    The header names what a resumed search must share with the saved one: the model, variant and
    parameters, the search options that change what it finds, the workers, the kvsim version and code."""
    folder = args.checkpoint or args.resume
    if folder is None:
        if args.checkpoint_minutes is not None:
            raise ConfigError("--checkpoint-minutes", "--checkpoint DIR or --resume DIR beside it",
                              args.checkpoint_minutes)
        return {}
    import importlib

    from ...engine.explore import checkpoint

    header = {"model": spec.name, "--variant": run.variant.name,
              **{f"--param {name}": canonical_json(value) for name, value in run.params.items()},
              "--store": args.store, "--no-symmetry": args.no_symmetry, "--max-depth": args.max_depth,
              "--workers": args.workers if args.workers > 1 or args.ray else 1, "kvsim version": __version__,
              # the engine, every model (they share packages: pd_common) and the model's own package
              "kvsim code": checkpoint.code_digest(checkpoint, importlib.import_module("kvsim.models"),
                                                   importlib.import_module(type(system).__module__))}
    minutes = 10.0 if args.checkpoint_minutes is None else args.checkpoint_minutes
    saves = checkpoint.CheckpointDir(folder, header, every=minutes * 60, on_stop=disarm)
    if args.checkpoint:
        saves.fresh()
    else:
        saves.check()  # a wrong folder or command is refused before any worker starts
    return {"checkpoint": saves, "resume": bool(args.resume)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    reg = catalog.models()
    spec = reg.model(args.model)
    if spec.system is None:
        with_system = ", ".join(m.name for m in reg.models.values() if m.system)
        raise ConfigError("MODEL", f"a model with a transition system ({with_system})", spec.name)
    resolved = RunSpec.resolve(spec, args.variant, param_values(args, spec))
    params = resolved.params
    system = resolved.system()
    progress = Progress(None, "explore")

    if args.graph and args.store != "full":
        raise ConfigError("--graph", "the full store (--store full)", f"--store {args.store}")

    if args.graph and (args.workers > 1 or args.ray):
        raise ConfigError("--graph", "a single-process search (no --workers, no --ray)",
                          f"--workers {args.workers}" if args.workers > 1 else f"--ray {args.ray}")
    bounds = ExploreOptions(max_depth=args.max_depth, max_states=args.max_states, check_liveness=not args.no_liveness,
                            max_seconds=args.max_seconds, store=args.store, symmetry=not args.no_symmetry,
                            max_memory=None if args.max_memory is None else int(args.max_memory * 2 ** 30),
                            memory_share=DEFAULT_SHARE if args.max_memory is None else None,
                            progress=lambda states, depth: progress.note(f"{states} states, depth {depth}"),
                            **_checkpoint(args, spec, resolved, system))
    lines: dict[str, Any] = {}

    def search() -> Any:
        if args.coverage and (args.ray or args.workers > 1):  # each worker measures the lines it runs
            lines["lines"] = linecov.WorkerLines(linecov.model_package(spec))
        if args.ray:
            return explore_parallel(resolved.system, args.workers, bounds, use_ray=True, **lines,
                                    ray_address=None if args.ray == "local" else args.ray)
        if args.workers > 1:
            return explore_parallel(resolved.system, args.workers, bounds, **lines)
        # under --coverage the system is built again inside the measured run, as a partitioned search builds its own
        return explore(resolved.system() if args.coverage else system, bounds)

    lines_run = None
    with stopping_on_signals():  # Ctrl-C or SIGTERM: the search stops as at a bound, and saves where it can
        if args.coverage:
            result, lines_run = linecov.run_with_coverage(linecov.model_package(spec), search)
        else:
            result = search()
    disarm()
    progress.close()
    if args.graph:
        import networkx as nx
        try:
            nx.write_graphml(result.graph(), args.graph)
        except OSError as exc:
            raise ConfigError("--graph", "a writable file path", args.graph, exc.strerror or "") from None
    doc = {**result.to_json(), "params": params}
    if lines_run is not None:
        doc["line_coverage"] = lines_run
    if args.junit:
        liveness = None if args.no_liveness else getattr(system, "liveness", "liveness")
        junit.write(args.junit, "kvsim explore", [junit.explore(doc, args, resolved.given, liveness)])
    if args.save and result.violations:
        counterexample.write(args.save, counterexample.explore_document(resolved, result.violations[0]))
    return {**doc, VIEW: {"variant": args.variant, "seconds": result.seconds,
                          "states_per_second": result.states_per_second, "resume": args.resume,
                          "no_liveness": args.no_liveness, "save": args.save}}


def render(doc: dict[str, Any]) -> str:
    text = view(doc)
    bound_hit, violations, checkpoint = doc["bound_hit"], doc["violations"], doc["checkpoint"]
    head = (f"{doc['model']} [{text['variant']}] {doc['states']} states, {doc['transitions']} transitions, depth "
            f"{doc['depth']}, {text['seconds']:.3f} s ({text['states_per_second']:,.0f} states/s)"
            + (f", bound hit: {bound_hit}" if bound_hit else ""))
    if doc["symmetry"]:
        head += "\nsymmetry: one representative per orbit (--no-symmetry explores every state)"
    if doc["store"] == "fingerprint":
        head += (f"\nfingerprint store: {doc.get('bytes_per_state')} bytes a state; chance of a fingerprint "
                 f"collision in this run {doc.get('collision_probability'):.1e}")
    if "coverage" in doc:
        head += "".join("\n" + line for line in Coverage(**doc["coverage"]).lines())
    if bound_hit:  # the growth tells whether the search was near its end
        head += "\nstates first reached per depth: " + ", ".join(f"{n:,}" for n in doc["states_per_depth"])
    if "line_coverage" in doc:
        head += "".join("\n" + line for line in linecov.coverage_lines(doc["line_coverage"]))
    if doc["resumed"]:
        head += f"\nresumed from the checkpoint in {text['resume']} (the seconds count every run of this search)"
    if checkpoint:
        again = "this command" if text["resume"] else f"this command with --resume {checkpoint} for --checkpoint"
        larger = "" if bound_hit == INTERRUPT else " and a larger bound"
        head += f"\nsearch saved to {checkpoint}: go on with {again}{larger}"
    head += reach_lines(doc["reachability"])
    unreached = [r["name"] for r in doc["reachability"] if r["status"] == UNREACHED]
    if not violations and bound_hit:
        return (head + f"\nINCOMPLETE: {stopped_by(bound_hit)} stopped the search before every reachable "
                       "state was seen; nothing was found, and nothing is proved (exit 3)")
    if not violations and unreached:
        return (head + "\nall invariants hold" + ("" if text["no_liveness"] else "; no hang")
                + f", but {', '.join(unreached)} never {'happens' if len(unreached) == 1 else 'happen'}: the model may be over-constrained and its "
                  "invariants hold vacuously (exit 1)")
    if not violations:
        return head + "\nall invariants hold" + ("" if text["no_liveness"] else "; no hang")
    body = "".join(f"\n{v['kind']} {v['property']}: {v['message']}\n  path ({len(v['trace'])} steps): "
                   f"{' -> '.join(short(a, 40) for a in v['trace'])}" for v in violations)
    if text["save"]:
        body += f"\nfirst violation saved to {text['save']} (kvsim replay {text['save']})"
    return head + body


def reach_lines(reachability: list[dict[str, Any]]) -> str:
    """The reachability declarations: those reached on one line, with their depths (the paths are in --json); one
    line for each that a complete search never reached, or that a bound stopped the search before reaching."""
    reached = [f"{r['name']} at depth {r['depth']}" for r in reachability if r["reached"]]
    text = f"\nreached: {', '.join(reached)} (witness paths: --json)" if reached else ""
    for r in reachability:
        if r["status"] == UNREACHED:
            what = "no step from a reachable state takes it" if r["step"] else "no reachable state satisfies it"
            text += f"\nUNREACHED sometimes {r['name']}: {what} ({r['doc']})"
        elif not r["reached"]:
            text += f"\nsometimes {r['name']}: not reached within the bound"
    return text


def exit_code(doc: dict[str, Any]) -> int:
    if doc["violations"] or any(r["status"] == UNREACHED for r in doc["reachability"]):
        return 1
    return EXIT_INCOMPLETE if doc["bound_hit"] else 0
