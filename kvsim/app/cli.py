"""The `kvsim` command line.

Exit codes: 0 everything held (or reproduced), 1 a property was violated or a
bug did not reproduce, 2 bad usage or bad input (a one-line message on
stderr, never a traceback). Every command takes `--json` and then prints one
JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from .. import __version__
from . import catalog
from ..engine.canon import canonical_json, to_jsonable
from ..engine.errors import ConfigError, KvsimError, TraceError
from ..engine.explore import explore
from ..engine.params import resolve
from ..engine.progress import Progress
from .repro import reproduce
from ..engine.runner import run_property
from .simulate import replay_trace, simulate_model
from ..engine.trace import read_trace


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + message and exits 2: keep that, say more
        self.print_usage(sys.stderr)
        self.exit(2, f"kvsim: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p = _Parser(prog="kvsim", description="Deterministic simulator and property-based verifier for KV-cache "
                                          "state machines of LLM inference engines.")
    p.add_argument("--version", action="version", version=f"kvsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", parents=[common], help="models, variants, properties, bug reports")

    c = sub.add_parser("check", parents=[common], help="run a model's properties on one variant")
    c.add_argument("model")
    c.add_argument("--variant", default="fixed")
    c.add_argument("--property", action="append", help="only this property (repeatable)")
    c.add_argument("--max-examples", type=_positive_int("--max-examples"), default=200)
    c.add_argument("--seed", type=_int("--seed"), default=0)
    _model_params(c)

    r = sub.add_parser("repro", parents=[common], help="reproduce bug reports from the seeds")
    group = r.add_mutually_exclusive_group(required=True)
    group.add_argument("bug_id", nargs="?")
    group.add_argument("--all", action="store_true")
    r.add_argument("--seed", type=_int("--seed"), default=0)

    e = sub.add_parser("explore", parents=[common], help="exhaustive bounded search of a model's transition system")
    e.add_argument("model")
    e.add_argument("--variant", default="fixed")
    e.add_argument("--max-depth", type=_positive_int("--max-depth"))
    e.add_argument("--max-states", type=_positive_int("--max-states"), default=1_000_000)
    _model_params(e)
    e.add_argument("--graph", metavar="FILE", help="write the state graph as GraphML")
    e.add_argument("--no-liveness", action="store_true", help="skip the hang search")

    s = sub.add_parser("simulate", parents=[common], help="timed, seeded simulation with fault injection")
    s.add_argument("model")
    s.add_argument("--variant", default="fixed")
    s.add_argument("--seed", type=_int("--seed"), default=0)
    s.add_argument("--faults", default="", metavar="SPEC", help="e.g. drop=0.05,delay=0.1:2.0,crash=peer@30")
    s.add_argument("--trace", metavar="FILE", help="write the JSONL trace here")
    _model_params(s)
    s.add_argument("--self-check", action="store_true", help="run the seed twice and compare the digests")

    rp = sub.add_parser("replay", parents=[common], help="re-run a trace and verify it matches")
    rp.add_argument("trace")

    o = sub.add_parser("oracle", parents=[common], help="differential kernel checks on every available backend")
    o.add_argument("--max-examples", type=_positive_int("--max-examples"), default=50)
    o.add_argument("--seed", type=_int("--seed"), default=0)
    return p


def _model_params(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="model parameter (repeatable); `kvsim list --json` and a wrong name list them")
    p.add_argument("--backend", help="shorthand for --param backend=NAME (PD models)")


def _params(args: argparse.Namespace) -> list[str]:
    return list(args.param) + ([f"backend={args.backend}"] if args.backend is not None else [])


def _int(field: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field}: expected an integer, got {text!r}") from None
    return parse


def _positive_int(field: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _int(field)(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{field}: expected an integer >= 1, got {text!r}")
        return value
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KvsimError as exc:
        print(f"kvsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130


def _emit(args: argparse.Namespace, document: dict[str, Any], text: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(to_jsonable(document), sort_keys=True, indent=1))
    else:
        print(text())


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- commands ------------------------------------------------------------------------------------

def cmd_list(args: argparse.Namespace) -> int:
    doc = catalog.listing()

    def text() -> str:
        models = _table(["model", "variants", "properties", "source"],
                        [[m["name"], ",".join(m["variants"]), len(m["properties"]), m["source"]] for m in doc["models"]])
        props = "\n".join(f"  {m['name']}: {', '.join(m['properties'])}" for m in doc["models"])
        bugs = _table(["bug", "model", "variant", "property", "status"],
                      [[b["id"], b["model"], b["variant"], b["property"], b["status"]] for b in doc["bugs"]])
        return f"{models}\n\nproperties:\n{props}\n\n{bugs}"

    _emit(args, doc, text)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    reg = catalog.load()
    spec = reg.model(args.model)
    spec.check_variant(args.variant)
    props = [reg.property(spec.name, name) for name in args.property] if args.property else reg.properties_of(spec.name)
    given = _params(args)
    # validated against the model, but only what the user set travels on (and into the replay line)
    names = {text.partition("=")[0].strip() for text in given}
    params = {k: v for k, v in resolve(spec.params, given).items() if k in names} or None
    progress = Progress(len(props), "check")
    results = []
    for prop in props:
        progress.step(prop.name)
        results.append(run_property(prop, args.variant, max_examples=args.max_examples, seed=args.seed,
                                    params=params))
    progress.close()
    doc = {"model": spec.name, "variant": args.variant, "seed": args.seed, "results": [r.to_json() for r in results]}

    def text() -> str:
        rows = [[r.property, r.status, r.examples, f"{r.seconds:.3f}",
                 _short(r.counterexample) if r.counterexample else ""] for r in results]
        failed = [r for r in results if r.status != "passed"]
        tail = "".join(f"\n{r.property}: {r.message}\n  replay: {r.replay}" for r in failed)
        return f"{spec.name} [{args.variant}]\n" + _table(["property", "status", "examples", "seconds",
                                                            "counterexample"], rows) + tail

    _emit(args, doc, text)
    return 0 if all(r.status == "passed" for r in results) else 1


def cmd_repro(args: argparse.Namespace) -> int:
    reg = catalog.load()
    bugs = list(reg.bugs.values()) if args.all else [reg.bug(args.bug_id)]
    progress = Progress(len(bugs), "repro")
    results = []
    for bug in bugs:
        progress.step(bug.id)
        results.append(reproduce(bug, seed=args.seed))
    progress.close()
    doc = {"seed": args.seed, "bugs": [r.to_json() for r in results]}

    def text() -> str:
        rows = [[r.bug.id, _short(r.bug.source, 40), r.bug.status, r.bug.property, r.examples, f"{r.seconds:.3f}",
                 "yes" if r.reproduced else "no", {True: "yes", False: "NO", None: "-"}[r.fixed_passes],
                 "holds" if r.ok else "BROKEN", _short(r.counterexample, 50) if r.counterexample else ""]
                for r in results]
        ok = sum(r.ok for r in results)
        return _table(["bug", "upstream source", "status", "property", "examples", "seconds", "reproduced",
                       "fixed passes", "verdict", "counterexample"], rows) + \
            f"\n\n{ok} of {len(results)} bug reports hold"

    _emit(args, doc, text)
    return 0 if all(r.ok for r in results) else 1


def cmd_explore(args: argparse.Namespace) -> int:
    reg = catalog.load()
    spec = reg.model(args.model)
    if spec.system is None:
        raise ConfigError("MODEL", f"a model with a transition system ({', '.join(m.name for m in reg.models.values() if m.system)})", spec.name)
    spec.check_variant(args.variant)
    params = resolve(spec.params, _params(args))
    system = spec.system(args.variant, params)
    progress = Progress(None, "explore")
    result = explore(system, max_depth=args.max_depth, max_states=args.max_states,
                     check_liveness=not args.no_liveness,
                     progress=lambda states, depth: progress.note(f"{states} states, depth {depth}"))
    progress.close()
    if args.graph:
        import networkx as nx
        try:
            nx.write_graphml(result.graph(), args.graph)
        except OSError as exc:
            raise ConfigError("--graph", "a writable file path", args.graph, exc.strerror or "") from None
    doc = {**result.to_json(), "params": params}

    def text() -> str:
        head = (f"{spec.name} [{args.variant}] {result.states} states, {result.transitions} transitions, depth "
                f"{result.depth}, {result.seconds:.3f} s ({result.states_per_second:,.0f} states/s)"
                + (f", bound hit: {result.bound_hit}" if result.bound_hit else ""))
        if not result.violations:
            return head + "\nall invariants hold" + ("" if args.no_liveness else "; no hang")
        body = "".join(f"\n{v.kind} {v.property}: {v.message}\n  path ({len(v.trace)} steps): "
                       f"{' -> '.join(_short(a, 40) for a in v.trace)}" for v in result.violations)
        return head + body

    _emit(args, doc, text)
    return 1 if result.violations else 0


def cmd_simulate(args: argparse.Namespace) -> int:
    spec = catalog.load().model(args.model)
    result = simulate_model(spec, args.variant, args.seed, _params(args), args.faults or None)
    if args.trace:
        try:
            result.recorder.write(args.trace)
        except OSError as exc:
            raise ConfigError("--trace", "a writable file path", args.trace, exc.strerror or "") from None
    doc = result.to_json()
    deterministic = True
    if args.self_check:
        again = simulate_model(spec, args.variant, args.seed, _params(args), args.faults or None)
        deterministic = again.digest == result.digest
        doc["self_check"] = {"digest": again.digest, "matches": deterministic}

    def text() -> str:
        lines = [f"{spec.name} [{args.variant}] seed {args.seed}: {result.events} events, simulated "
                 f"{result.sim_time:.3f} s in {result.seconds:.3f} s", f"digest {result.digest}"]
        if args.self_check:
            lines.append(f"self-check: second run digest {doc['self_check']['digest']} "
                         f"{'matches' if deterministic else 'DIFFERS'}")
        lines += [f"  {k}: {_short(v)}" for k, v in result.summary.items()]
        if args.trace:
            lines.append(f"trace written to {args.trace}")
        return "\n".join(lines)

    _emit(args, doc, text)
    return 1 if result.summary.get("violations") or not deterministic else 0


def cmd_replay(args: argparse.Namespace) -> int:
    trace = read_trace(args.trace)
    reg = catalog.load()
    if trace.header["model"] not in reg.models:
        raise TraceError(trace.path, 1, f"unknown model {trace.header['model']!r} "
                                        f"(known: {', '.join(reg.models)})")
    result = replay_trace(trace, reg.models[trace.header["model"]])

    def text() -> str:
        if result.matches:
            return f"{args.trace}: {result.steps} steps replayed, digest {result.digest} matches"
        return (f"{args.trace}:{result.line}: diverged\n  trace has: {_short(result.got, 200)}\n"
                f"  re-run gives: {_short(result.expected, 200)}")

    _emit(args, result.to_json(), text)
    return 0 if result.matches else 1


def cmd_oracle(args: argparse.Namespace) -> int:
    try:
        import kvsim.gpu_oracle as gpu_oracle
    except ImportError as exc:
        raise ConfigError("gpu_oracle", "an importable oracle package", str(exc)) from None
    progress = Progress(None, "oracle")
    doc = gpu_oracle.oracle_report(max_examples=args.max_examples, seed=args.seed, progress=progress.note)
    progress.close()

    def text() -> str:
        backends = _table(["backend", "available", "reason"],
                          [[b["name"], "yes" if b["available"] else "no", b["reason"]] for b in doc["backends"]])
        checks = _table(["check", "backend", "examples", "status", "message"],
                        [[c["name"], c["backend"], c["examples"], c["status"], _short(c.get("message", ""), 60)]
                         for c in doc["checks"]])
        return f"{backends}\n\n{checks}"

    _emit(args, doc, text)
    return 1 if any(c["status"] == "failed" for c in doc["checks"]) else 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": cmd_list, "check": cmd_check, "repro": cmd_repro, "explore": cmd_explore,
    "simulate": cmd_simulate, "replay": cmd_replay, "oracle": cmd_oracle,
}
