"""`kvsim conform ENGINE`: run the model properties and differentials against a real engine release.

Exit codes: 0 every target conforms, 1 a divergence, 2 bad input or a target that cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvsim.app import junit, outputs
from kvsim.engine.errors import ConfigError, KvsimError

from .report import (exit_code, format_results, format_table, parse_versions, release_table, run_all,
                     to_json)
from .releases import bug_rows
from .source import DEFAULT_VERSIONS, ENGINES, resolve_source
from .targets import RunOptions, select_targets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", choices=ENGINES, help="the engine whose code is checked")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--version", help=f"a release from the package index (default: "
                       f"{', '.join(f'{e} {v}' for e, v in DEFAULT_VERSIONS.items())})")
    where.add_argument("--from", dest="from_path", metavar="PATH",
                       help="a wheel, an unpacked source tree or the engine's package directory")
    where.add_argument("--versions", help="comma-separated releases: print the target x release table")
    parser.add_argument("--target", help="run one target (default: all of the engine's)")
    parser.add_argument("--max-examples", type=int, default=200, help="Hypothesis inputs per check (default: 200)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where kernel targets run: the Triton interpreter on the CPU, or natively on a GPU (default: cpu)")
    parser.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE for CI: one "
                        "testcase per target (per release with --versions), a divergence as a failure with the "
                        "kvsim line that reruns it (stdout is unchanged) (default: none)")
    if "--json" not in parser._option_string_actions:  # kvsim's common parent parser may already have it
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def cmd_conform(args: argparse.Namespace) -> int:
    try:
        if args.max_examples < 1:
            raise ConfigError("--max-examples", "an integer >= 1", args.max_examples)
        if args.junit is not None:
            outputs.writable_file("--junit", args.junit)
        options = RunOptions(max_examples=args.max_examples, seed=args.seed, device=args.device)
        chosen = select_targets(args.engine, args.target)
        if args.versions:
            versions, table = release_table(args.engine, parse_versions(args.versions), chosen, options)
            flat = [r for row in table.values() for r in row.values()]
            doc = {"engine": args.engine, "versions": versions,
                   "table": {n: {v: to_json(r) for v, r in row.items()} for n, row in table.items()},
                   "seed_bugs": bug_rows(args.engine, versions, table)}
            if args.junit:
                junit.write(args.junit, "kvsim conform", junit.conform_table(doc, args))
            if args.json:
                print(json.dumps(doc, indent=1))
            else:
                print(format_table(args.engine, versions, table))
            return exit_code(flat, table=True)
        source = resolve_source(args.engine, version=args.version, from_path=args.from_path)
        results = run_all(chosen, source, options)
        doc = {"engine": source.engine, "version": source.version, "origin": source.origin,
               "results": [to_json(r) for r in results]}
        if args.junit:
            junit.write(args.junit, "kvsim conform", [junit.conform(doc, args)])
    except KvsimError as exc:
        print(f"kvsim conform: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(format_results(source, results))
    return exit_code(results, chosen=args.target is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvsim conform", description=__doc__)
    add_arguments(parser)
    return cmd_conform(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
