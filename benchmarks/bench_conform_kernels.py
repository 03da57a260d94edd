"""Conformance's time by kind of target: checks per second of the kernel, real-import and pure-Python targets.

    python benchmarks/bench_conform_kernels.py [--engines vllm,sglang,flashinfer] [--runs N] [--args "..."] [--json]

Each run is one `kvsim conform ENGINE --json` in a fresh process of this checkout's interpreter (so every child
start-up is paid as a user pays it). Its targets are sorted by kind, read from their declarations
(`kvsim.conform.targets.targets(ENGINE)`, each adapter resolved):
  * `kernel`: a real upstream Triton kernel run by the interpreter in a kernel child (`Differential(kernel=True)`);
  * `real-import`: upstream imported for real in the release's child (`installed="driver"`);
  * `python`: upstream definitions loaded from the release's files and called in this process.
Per engine and kind, over `--runs` runs (min / median / max): the checks (`compared`), the seconds of those
targets (what each target's `seconds` says), their share of the run's target seconds and checks per second; and
the run's own wall and CPU seconds (the run and every child it waited for). This is the issue's figure "the Triton
interpreter takes about 60 % of the time for 1.5 % of the inputs", measured again on the tree it runs in.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_conform_totals import HERE, run_once, spread  # noqa: E402

KINDS = ("kernel", "real-import", "python")


def kinds(engine: str) -> dict[str, str]:
    """Each target of `engine` and its kind, from the declarations."""
    from kvsim.conform.targets import targets

    out = {}
    for target in targets(engine):
        adapter = target.resolve_adapter()
        out[target.name] = ("kernel" if getattr(adapter, "kernel", False)
                            else "real-import" if getattr(adapter, "installed", "") else "python")
    return out


def by_kind(run: dict[str, Any], kind_of: dict[str, str]) -> dict[str, dict[str, float]]:
    """One run's checks and seconds summed per kind (a target the declarations do not name is refused)."""
    sums = {k: {"targets": 0, "checks": 0, "seconds": 0.0} for k in KINDS}
    for name, r in run["targets"].items():
        if name not in kind_of:
            raise SystemExit(f"target {name}: in the report but not among the declarations")
        s = sums[kind_of[name]]
        s["targets"] += 1
        s["checks"] += r["compared"]
        s["seconds"] += r["seconds"]
    total = sum(s["seconds"] for s in sums.values()) or 1.0
    for s in sums.values():
        s["share"] = s["seconds"] / total
        s["per_s"] = s["checks"] / s["seconds"] if s["seconds"] else 0.0
    return sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_conform_kernels.py")
    parser.add_argument("--engines", default="vllm,sglang,flashinfer")
    parser.add_argument("--runs", type=int, default=3, help="runs per engine (1 to 20, default 3)")
    parser.add_argument("--args", default="", help="extra arguments of each run (say, --workers 2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 20:  # each run is a whole `kvsim conform ENGINE`
        parser.error(f"--runs: expected a count from 1 to 20, got {args.runs}")
    summary: dict[str, Any] = {}
    for engine in args.engines.split(","):
        kind_of = kinds(engine)
        runs = []
        for i in range(args.runs):
            one = run_once(sys.executable, HERE, engine, shlex.split(args.args))
            if one["exit"] not in (0, 1):
                raise SystemExit(f"kvsim conform {engine} exited {one['exit']}")
            runs.append((one, by_kind(one, kind_of)))
            print(f"# {engine} run {i + 1}: wall {one['wall']:.1f} s, cpu {one['cpu']:.1f} s, exit {one['exit']}, "
                  f"load {one['load'][0]:.1f}->{one['load'][1]:.1f}", file=sys.stderr)
        summary[engine] = {
            "wall": spread([r["wall"] for r, _ in runs]), "cpu": spread([r["cpu"] for r, _ in runs]),
            "kinds": {k: {"targets": runs[0][1][k]["targets"],
                          "checks": statistics.median(s[k]["checks"] for _, s in runs),
                          "seconds": spread([s[k]["seconds"] for _, s in runs]),
                          "share": spread([s[k]["share"] for _, s in runs]),
                          "checks_per_s": spread([s[k]["per_s"] for _, s in runs])}
                      for k in KINDS if runs[0][1][k]["targets"]}}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; min / median / max of {args.runs} runs")
    for engine, s in summary.items():
        print(f"{engine}: wall {s['wall']['median']} s, cpu {s['cpu']['median']} s (medians)")
        print(f"  {'kind':<12} {'targets':>7} {'checks':>7} {'seconds (min/med/max)':>24} {'share':>6} "
              f"{'checks/s (min/med/max)':>26}")
        for kind, k in s["kinds"].items():
            sec, per = k["seconds"], k["checks_per_s"]
            print(f"  {kind:<12} {k['targets']:>7} {k['checks']:>7.0f} {sec['min']:>8} {sec['median']:>7} "
                  f"{sec['max']:>7} {k['share']['median']:>6.0%} {per['min']:>9} {per['median']:>8} {per['max']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
