"""`kvsim conform ENGINE`: the models' properties and differentials on the engine's own code.

Exit codes (as every kvsim command): 0 every target conforms; 1 a divergence (the code under test answered
otherwise than the model, raised, returned a wrong type or did not return); 2 bad input, or code that cannot
be used (a file or definition missing, a signature changed, a source that is not the engine); 3 `--max-seconds`
or an interrupt stopped the run before every target ran, with no divergence found.
Errors are the `kvsim: error: FIELD: expected ..., got ...` line (and the JSON error document with `--json`);
every argument and output path is checked before any work, and a failure before any target runs still writes
the `--junit` file, with one `<error>`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvsim.app import junit, outputs
from kvsim.app.argtypes import integer, non_negative_int, positive_float, positive_int
from kvsim.app.forked import cpu_count
from kvsim.engine.errors import ConfigError, KvsimError
from kvsim.engine.interrupt import stopping_on_signals

from .report import exit_code, format_results, format_table, parse_versions, release_table, run_all, to_json
from .releases import bug_rows
from .source import DEFAULT_VERSIONS, ENGINES, EngineSource, check_version, resolve_source
from .targets import RunOptions, changed_targets, select_targets, split_names

DEFAULT_CALL_TIMEOUT = 30.0
DEFAULT_MAX_SECONDS = 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", choices=ENGINES, help="the engine whose code is checked")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--version", help=f"a release from the package index (default: "
                       f"{', '.join(f'{e} {v}' for e, v in DEFAULT_VERSIONS.items())})")
    where.add_argument("--from", dest="from_path", metavar="PATH",
                       help="a wheel, an unpacked source tree or the engine's package directory (your own "
                            "tree: the reports call it the code under test)")
    where.add_argument("--versions", help="comma-separated releases: print the target x release table")
    parser.add_argument("--target", action="append", metavar="NAME[,NAME...]",
                        help="run these targets (repeatable, or comma-separated) (default: all of the engine's)")
    changed = parser.add_mutually_exclusive_group()
    changed.add_argument("--changed", nargs="+", metavar="FILE",
                         help="run only the targets whose upstream files are among FILE... (paths in the tree)")
    changed.add_argument("--diff-base", metavar="REV",
                         help="with --from a git tree: run only the targets whose upstream files changed since REV")
    parser.add_argument("--max-examples", type=positive_int("--max-examples"), default=200,
                        help="Hypothesis inputs per check (default: 200; kernel targets take at most 40, 200 "
                             "under KVSIM_PROFILE=dev)")
    parser.add_argument("--seed", type=integer("--seed"), default=None, help="random seed (default: derandomized)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where kernel targets run: the Triton interpreter on the CPU, or natively on a GPU "
                             "(default: cpu)")
    parser.add_argument("--call-timeout", type=positive_float("--call-timeout"), default=DEFAULT_CALL_TIMEOUT,
                        metavar="S", help="seconds one call of the code under test may take; a call that does not "
                        "return in time is a divergence with its input (default: %(default)s)")
    parser.add_argument("--max-seconds", type=positive_float("--max-seconds"), default=DEFAULT_MAX_SECONDS,
                        metavar="S", help="the whole run's budget: targets stop between two calls, what ran is "
                        "reported (exit 3 if nothing diverged) (default: %(default)s)")
    parser.add_argument("--workers", type=positive_int("--workers"), default=None, metavar="N",
                        help="run the targets on N forked worker processes (the report keeps the targets' order; "
                             "the targets of one real-import child run on one worker) (default: the CPU count; 1: "
                             "in this process)")
    parser.add_argument("--coverage", action="store_true",
                        help="also report, per target, the lines of the checked upstream definitions the run "
                             "executed (default: off)")
    parser.add_argument("--mutants", nargs="?", const=0, type=non_negative_int("--mutants"), metavar="N",
                        help="measure the checks: run each target against mutants of its checked upstream "
                             "definitions (N: a sample of N per target, spread over the code; none or 0: all) "
                             "and report killed and surviving mutants (default: off)")
    parser.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE for CI: one "
                        "testcase per target (per release with --versions, per target with --mutants), a "
                        "divergence as a failure with the kvsim line that reruns it (default: none)")
    if "--json" not in parser._option_string_actions:  # kvsim's common parent parser may already have it
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def changed_files(args: argparse.Namespace) -> list[str] | None:
    """The files `--changed` names, or those `git diff --name-only REV` lists in the `--from` tree."""
    if args.changed is not None:
        return list(args.changed)
    if args.diff_base is None:
        return None
    if args.from_path is None:
        raise ConfigError("--diff-base", "--from a git working tree as well", args.diff_base)
    tree = Path(args.from_path).expanduser()
    tree = tree if tree.is_dir() else tree.parent
    try:
        done = subprocess.run(["git", "-C", str(tree), "diff", "--name-only", args.diff_base, "--"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError("--diff-base", "a revision of the --from git tree", args.diff_base, hint=str(exc)) from exc
    if done.returncode != 0:
        raise ConfigError("--diff-base", "a revision of the --from git tree", args.diff_base,
                          hint=" ".join(done.stderr.split())[:200])
    return [line for line in done.stdout.splitlines() if line.strip()]


def _present(source: EngineSource, chosen: list[Any]) -> None:
    """No false green: a source holding none of the chosen targets' files is not this engine's code."""
    files = sorted({f for t in chosen for f in t.files})
    if files and not any(source.has(f) for f in files):
        raise ConfigError("--from" if source.version is None or not source.origin.startswith("wheel ") else "--version",
                          f"a {source.engine} source holding at least one of the targets' files ({', '.join(files)})",
                          source.origin)


def cmd_conform(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        return _conform(args, started)
    except KvsimError as exc:
        if args.junit is not None and getattr(exc, "field", None) != "--junit":
            junit.write(args.junit, "kvsim conform", [junit.conform_error(args, str(exc))])
        raise


def _conform(args: argparse.Namespace, started: float) -> int:
    if args.junit is not None:
        outputs.writable_file("--junit", args.junit)
    if args.version is not None:
        check_version(args.version)
    versions = parse_versions(args.versions) if args.versions is not None else None
    split_names(args.target)
    chosen = select_targets(args.engine, args.target)
    source = None if versions is not None else resolve_source(args.engine, version=args.version,
                                                             from_path=args.from_path)
    changed = changed_files(args)
    if changed is not None:
        chosen = changed_targets(chosen, changed, args.engine)
    options = RunOptions(max_examples=args.max_examples, seed=args.seed, device=args.device,
                         call_timeout=args.call_timeout, until=started + args.max_seconds)
    named = bool(args.target)
    if args.mutants is not None:
        from .mutate import cmd_mutants

        if source is None:
            raise ConfigError("--mutants", "one release or tree (--version or --from), not --versions", args.versions)
        return cmd_mutants(args, source, chosen, options)
    if versions is not None:
        with stopping_on_signals():
            versions, table = release_table(args.engine, versions, chosen, options)
        flat = [r for row in table.values() for r in row.values()]
        doc = {"engine": args.engine, "versions": versions,
               "table": {n: {v: to_json(r) for v, r in row.items()} for n, row in table.items()},
               "seed_bugs": bug_rows(args.engine, versions, table), "targets": _listing(chosen)}
        if args.junit:
            junit.write(args.junit, "kvsim conform", junit.conform_table(doc, args))
        _print(args, doc, lambda: format_table(args.engine, versions, table))
        return exit_code(flat, table=True)
    assert source is not None
    if chosen:
        _present(source, chosen)
    with stopping_on_signals():
        workers = cpu_count() if args.workers is None else args.workers
        results = run_all(chosen, source, options, workers=workers, measure=args.coverage)
    doc = {"engine": source.engine, "version": source.version, "origin": source.origin,
           "subject": "upstream" if results and results[0].subject == "upstream" else "code under test",
           "results": [to_json(r) for r in results], "targets": _listing(chosen),
           "changed": changed}
    if args.junit:
        junit.write(args.junit, "kvsim conform", [junit.conform(doc, args)])
    _print(args, doc, lambda: format_results(source, results) if chosen else
           f"kvsim conform {source.engine}: no target's upstream files are among the changed files")
    return exit_code(results, chosen=named)


def _listing(chosen: list[Any]) -> list[dict[str, Any]]:
    return [{"target": t.name, "model": t.model, "files": list(t.files)} for t in chosen]


def _print(args: argparse.Namespace, doc: dict[str, Any], text: Any) -> None:
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(text())


def main(argv: list[str] | None = None) -> int:
    """`python -m kvsim.conform.cli ENGINE ...`: the same as `kvsim conform ENGINE ...`."""
    from kvsim.app.cli import main as kvsim_main

    return kvsim_main(["conform", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
