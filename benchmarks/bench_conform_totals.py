"""Benchmark whole `kvsim conform ENGINE --json` runs: this tree against a baseline tree, in alternated pairs.

    python benchmarks/bench_conform_totals.py --base /work/wt-cfast-base [--pairs 3] [--engines vllm,sglang]
        [--args "--workers 2"] [--base-args ""] [--base-cache DIR] [--keep DIR] [--json]
    python benchmarks/bench_conform_totals.py --base /work/wt-cfast-base --per-call [--pairs 5]

Each pair runs the baseline's `kvsim conform ENGINE --json` and this tree's, one after the other (the order
alternates from pair to pair, so a load that drifts falls on both sides alike), each with its own interpreter
(`BASE/.venv/bin/python -m kvsim`, this tree's `sys.executable -m kvsim`, each importing its own tree). Per run:
wall seconds, CPU seconds (the run and every process it waited for: kernel and real-import children), the load
average before and after, and each target's `seconds` and status from the JSON. `--base-cache DIR` gives the
baseline a cache of its own (`KVSIM_CACHE_DIR`): this tree writes the bytecode of what a real-import child imports
into its cache, which speeds up a baseline that reads the same cache and does not write it (under
PYTHONDONTWRITEBYTECODE, as on this machine); DIR: a copy of the cache without its `__pycache__` folders. Printed:
per engine and side, min / median / max of wall and CPU, the ratio this tree / baseline of the medians (the figure
to compare; same machine, same session), and the per-target medians side by side. The statuses of both sides are
printed too, so a faster run that checks less is seen (a target "incomplete" or "not run" is not a like-for-like
pair), and whether each pair's reports are the same but for their times (`same reports`). `--keep DIR` keeps every
run's JSON.

`--per-call`: the frame's own cost of one check, in each tree's interpreter, alternated: microseconds of
`capture(fn, seconds=30)` around a function that returns at once (the per-call deadline and answer capture), and of
`EXACT.difference` on two equal answers shaped as compute_head_slice_params's (a record of ten integers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def without_times(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A report's results less what the clock decides (seconds, the slowest call), to compare two runs."""
    return [{k: v for k, v in r.items() if k not in ("seconds", "slowest_call")} for r in doc.get("results", [])]


PER_CALL = """
import json, time
from kvsim.engine.conformance.answers import capture
from kvsim.engine.conformance.compare import EXACT
f = lambda: 1
answer = {"ok": True, "params": {k: i for i, k in enumerate("abcdefghij")}}
other = json.loads(json.dumps(answer))
out = {}
for name, fn in (("capture", lambda: capture(f, seconds=30.0)), ("compare", lambda: EXACT.difference(answer, other))):
    n = 20000
    began = time.perf_counter()
    for _ in range(n):
        fn()
    out[name] = (time.perf_counter() - began) / n * 1e6
print(json.dumps(out))
"""


def per_call(sides: dict[str, tuple[str, Path, list[str], Path | None]], pairs: int) -> int:
    seen: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    for pair in range(pairs):
        for side in (("base", "this") if pair % 2 == 0 else ("this", "base")):
            python, tree, _, _ = sides[side]
            done = subprocess.run([python, "-c", PER_CALL], cwd=tree, capture_output=True, text=True, check=True)
            for name, us in json.loads(done.stdout).items():
                seen[side].setdefault(name, []).append(us)
    print(f"per call, microseconds (min / median / max of {pairs} alternated pairs; load {os.getloadavg()[0]:.1f})")
    for name in seen["base"]:
        b, t = spread(seen["base"][name]), spread(seen["this"][name])
        print(f"  {name:<8} base {b['min']:7.1f} {b['median']:7.1f} {b['max']:7.1f}   this {t['min']:7.1f} "
              f"{t['median']:7.1f} {t['max']:7.1f}   this/base {t['median'] / b['median']:.3f}")
    return 0


def run_once(python: str, tree: Path, engine: str, extra: list[str], cache: Path | None = None) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    env = None if cache is None else {**os.environ, "KVSIM_CACHE_DIR": str(cache)}
    done = subprocess.run([python, "-m", "kvsim", "conform", engine, "--json", *extra], cwd=tree,
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{tree}: kvsim conform {engine} exited {done.returncode} without JSON: "
                         f"{done.stderr[-600:]}")
    targets = {r["target"]: {"seconds": r["seconds"], "status": r["status"], "compared": r["compared"]}
               for r in doc.get("results", [])}
    return {"wall": wall, "cpu": cpu, "exit": done.returncode, "load": [load_before, os.getloadavg()[0]],
            "targets": targets, "doc": doc}


def spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 2), "median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_conform_totals.py")
    parser.add_argument("--base", required=True, type=Path, help="the baseline tree (with its own .venv)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--engines", default="vllm,sglang")
    parser.add_argument("--args", default="", help="extra arguments of this tree's runs (say, --workers 2)")
    parser.add_argument("--base-args", default="", help="extra arguments of the baseline's runs")
    parser.add_argument("--base-cache", type=Path,
                        help="the baseline's own KVSIM_CACHE_DIR: what this tree writes into its cache (the "
                             "bytecode of what a real-import driver imported) then never speeds the baseline up")
    parser.add_argument("--per-call", action="store_true", help="only the per-check cost of the frame (above)")
    parser.add_argument("--keep", type=Path, help="a folder for every run's JSON (ENGINE-SIDE-PAIR.json)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    base_python = str(args.base / ".venv" / "bin" / "python")
    sides = {"base": (base_python, args.base.resolve(), shlex.split(args.base_args), args.base_cache),
             "this": (sys.executable, HERE, shlex.split(args.args), None)}
    if args.per_call:
        return per_call(sides, args.pairs)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for engine in args.engines.split(","):
        runs[engine] = {"base": [], "this": []}
        for pair in range(args.pairs):
            order = ("base", "this") if pair % 2 == 0 else ("this", "base")
            for side in order:
                python, tree, extra, cache = sides[side]
                one = run_once(python, tree, engine, extra, cache)
                runs[engine][side].append(one)
                if args.keep is not None:
                    (args.keep / f"{engine}-{side}-{pair + 1}.json").write_text(json.dumps(one["doc"], indent=1))
                print(f"# {engine} pair {pair + 1} {side}: wall {one['wall']:.1f} s, cpu {one['cpu']:.1f} s, "
                      f"exit {one['exit']}, load {one['load'][0]:.1f}->{one['load'][1]:.1f}", file=sys.stderr)
    summary: dict[str, Any] = {}
    for engine, both in runs.items():
        s = {side: {"wall": spread([r["wall"] for r in rs]), "cpu": spread([r["cpu"] for r in rs]),
                    "load": spread([x for r in rs for x in r["load"]]), "exits": [r["exit"] for r in rs]}
             for side, rs in both.items()}
        s["ratio"] = {k: round(s["this"][k]["median"] / s["base"][k]["median"], 3) for k in ("wall", "cpu")}
        s["same_reports"] = [without_times(b["doc"]) == without_times(t["doc"]) for b, t in zip(both["base"], both["this"])]
        names = list(dict.fromkeys(n for side in both.values() for r in side for n in r["targets"]))
        s["targets"] = {n: {side: {"seconds": spread([r["targets"][n]["seconds"] for r in rs if n in r["targets"]]
                                                       or [0.0])["median"],
                                   "status": sorted({r["targets"][n]["status"] for r in rs if n in r["targets"]}),
                                   "compared": sorted({r["targets"][n]["compared"] for r in rs
                                                       if n in r["targets"]})}
                                for side, rs in both.items()} for n in names}
        summary[engine] = s
    if args.json:
        print(json.dumps({"pairs": args.pairs, "args": args.args, "base_args": args.base_args, "engines": summary},
                         indent=1, default=str))
        return 0
    for engine, s in summary.items():
        print(f"kvsim conform {engine}: {args.pairs} alternated pairs (this tree {args.args or '(no args)'})")
        for side in ("base", "this"):
            w, c, lo = s[side]["wall"], s[side]["cpu"], s[side]["load"]
            print(f"  {side:<5} wall {w['min']:7.1f} {w['median']:7.1f} {w['max']:7.1f} s   cpu {c['min']:7.1f} "
                  f"{c['median']:7.1f} {c['max']:7.1f} s   load {lo['min']:.1f}-{lo['max']:.1f}  exits {s[side]['exits']}")
        print(f"  this/base (medians): wall {s['ratio']['wall']:.3f}  cpu {s['ratio']['cpu']:.3f}   same reports "
              f"(each pair): {s['same_reports']}")
        print(f"  {'target':<42} {'base s':>8} {'this s':>8}  compared base / this  status")
        for name, t in s["targets"].items():
            print(f"  {name:<42} {t['base']['seconds']:8.2f} {t['this']['seconds']:8.2f}  "
                  f"{t['base']['compared']} / {t['this']['compared']}  {t['base']['status']} / {t['this']['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
