"""The trace's cost: `kvsim simulate` events/s with the trace on and off, against another checkout (not a test).

    python benchmarks/bench_trace.py [--base DIR] [--pairs N] [--rooms N] [--wall]

The workload is the 1,000-room pd-staging run of `benchmarks/bench_sim_vs_simpy.py` (`kvsim simulate
pd-staging --param requests=1000`, variant fixed, seed 0, no faults). "on" is what `kvsim simulate --trace
FILE` does: the run with every step recorded (canonical JSON line, SHA-256 digest) and the file written;
"off" is the same run with the recorder's `record` a no-op (what the model and the engine cost without a
trace). Each figure is one run in a fresh process (this checkout's interpreter, or `--base`'s own
`DIR/.venv/bin/python`, whose editable install is `DIR`), timed in the process as CPU time (`--wall`: wall
time), so runs of the two trees alternate on the same machine: pairs (base, this tree), `--pairs` times for
each mode. Prints min / median / max events/s per tree and mode, and the ratios of the medians; both trees
must give the same digest when their traces agree (a changed digest is reported, not hidden).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(mode: str, rooms: int, wall: bool) -> dict:
    """One run in this process (the child side)."""
    from kvsim.app import catalog
    from kvsim.app.simulate import simulate_model
    from kvsim.engine import trace

    if mode == "off":
        trace.TraceRecorder.record = lambda self, t, event, data=None: None
    spec = catalog.load().model("pd-staging")
    clock = time.perf_counter if wall else time.process_time
    with tempfile.TemporaryDirectory() as folder:
        start = clock()
        result = simulate_model(spec, "fixed", 0, {"requests": rooms})
        if mode == "on":
            result.recorder.write(os.path.join(folder, "trace.jsonl"))
        seconds = clock() - start
    return {"events": result.events, "seconds": seconds, "digest": result.digest}


def child(tree: str, mode: str, rooms: int, wall: bool) -> dict:
    python = sys.executable if tree == ROOT else os.path.join(tree, ".venv", "bin", "python")
    code = (f"import sys, json; sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r}); import bench_trace; "
            f"print(json.dumps(bench_trace.one({mode!r}, {rooms}, {wall})))")
    out = subprocess.run([python, "-c", code], cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="another checkout with its own .venv (e.g. a worktree of the previous commit)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rooms", type=int, default=1000)
    ap.add_argument("--wall", action="store_true", help="wall time instead of the process's CPU time")
    args = ap.parse_args()
    trees = ([os.path.abspath(args.base)] if args.base else []) + [ROOT]
    rates: dict[tuple[str, str], list[float]] = {}
    digests: dict[tuple[str, str], set[str]] = {}
    print(f"pd-staging {args.rooms} rooms, {'wall' if args.wall else 'CPU'} time, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    for i in range(args.pairs):
        for mode in ("on", "off"):
            for tree in trees:
                r = child(tree, mode, args.rooms, args.wall)
                rates.setdefault((tree, mode), []).append(r["events"] / r["seconds"])
                digests.setdefault((tree, mode), set()).add(r["digest"])
                print(f"  pair {i + 1} {mode:3s} {tree}: {r['events']:,} events {r['seconds']:.3f} s "
                      f"{r['events'] / r['seconds']:,.0f} events/s", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}")
    for (tree, mode), values in rates.items():
        print(f"{tree:40s} trace {mode:3s} events/s min {min(values):8,.0f} median {statistics.median(values):8,.0f} "
              f"max {max(values):8,.0f}  digest {'/'.join(d[:16] for d in sorted(digests[tree, mode]))}")
    med = {k: statistics.median(v) for k, v in rates.items()}
    for tree in trees:
        print(f"{tree}: trace on / trace off {med[tree, 'on'] / med[tree, 'off']:.2f}")
    if args.base:
        base = trees[0]
        for mode in ("on", "off"):
            pairs = [new / old for old, new in zip(rates[base, mode], rates[ROOT, mode])]
            print(f"this tree / base, trace {mode}: median of medians {med[ROOT, mode] / med[base, mode]:.2f}, "
                  f"per pair min {min(pairs):.2f} median {statistics.median(pairs):.2f} max {max(pairs):.2f}")


if __name__ == "__main__":
    main()
