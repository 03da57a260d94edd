"""The explorer at scale: states/s and bytes a state per store, one process against workers and Ray (not a test).

    python benchmarks/bench_explore_scale.py [--max-states N] [--workers N] [--ray] [--only NAME]

For each configuration it runs, in one process and one after another:
  full store, one process              (the peer every ratio is measured against)
  fingerprint store, one process       (bytes a state, collision probability)
  full store, --workers N              (forked processes, state space partitioned by hash)
  fingerprint store, --workers N
  full store on a local Ray cluster    (--ray; N actors)
and prints states, transitions, seconds, states/s, the ratio to the one-process full run, bytes a
state, and whether the run finished. Runs that finish are checked against each other (same state
count, transitions, violated invariants). `--max-states` bounds every run (default 300,000) so a
configuration that does not finish still gives a rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kvsim.app import catalog  # noqa: E402
from kvsim.engine.descriptor import RunSpec  # noqa: E402
from kvsim.engine.explore import explore  # noqa: E402
from kvsim.engine.parallel import explore_parallel  # noqa: E402

CONFIGS = (
    ("swa-budget 6 requests", "swa-budget", "fixed",
     {"prompts": "1,3,2,2,1,3", "outputs": "3,2,2,1,2,1", "full_pages": 6, "swa_pages": 5}),
    ("pd-protocol mooncake 2 rooms", "pd-protocol", "fixed", {"backend": "mooncake", "rooms": 2}),
    ("pd-staging 2 rooms x 2 writers", "pd-staging", "fixed", {"rooms": 2, "writers": 2}),
)


def run(label: str, fn, base: float | None) -> dict:
    start = time.perf_counter()
    r = fn()
    seconds = time.perf_counter() - start
    rate = r.states / seconds
    row = {"run": label, "states": r.states, "transitions": r.transitions, "seconds": round(seconds, 2),
           "states_per_second": round(rate), "ratio": round(rate / base, 2) if base else 1.0,
           "bytes_per_state": r.bytes_per_state, "complete": r.bound_hit is None,
           "violations": sorted(v.property for v in r.violations)}
    print(f"  {label:34s} {r.states:>9,} states {r.transitions:>10,} transitions {seconds:8.1f} s "
          f"{rate:>9,.0f}/s  x{row['ratio']:<5} {r.bytes_per_state or '':>6} B/state "
          f"{'complete' if row['complete'] else 'bound: ' + str(r.bound_hit)}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-states", type=int, default=300_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ray", action="store_true", help="also run on a local Ray cluster")
    ap.add_argument("--only", help="run only configurations whose label contains this")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, max states {args.max_states:,}")
    reg = catalog.models()
    report = []
    for label, model, variant, params in CONFIGS:
        if args.only and args.only not in label:
            continue
        spec = RunSpec.resolve(reg.model(model), variant, [f"{k}={v}" for k, v in params.items()])
        print(label, flush=True)
        bound = {"max_states": args.max_states, "check_liveness": True}
        base = run("full, 1 process", lambda: explore(spec.system(), **bound), None)
        rows = [base]
        rate = base["states_per_second"]
        rows.append(run("fingerprint, 1 process", lambda: explore(spec.system(), store="fingerprint", **bound), rate))
        rows.append(run(f"full, {args.workers} workers",
                        lambda: explore_parallel(spec.system, args.workers, **bound), rate))
        rows.append(run(f"fingerprint, {args.workers} workers",
                        lambda: explore_parallel(spec.system, args.workers, store="fingerprint", **bound), rate))
        if args.ray:
            rows.append(run(f"full, Ray {args.workers} actors",
                            lambda: explore_parallel(spec.system, args.workers, use_ray=True, **bound), rate))
        done = [r for r in rows if r["complete"]]
        if len(done) > 1:
            same = {(r["states"], r["transitions"], tuple(r["violations"])) for r in done}
            print(f"  finished runs agree: {len(same) == 1}")
        report.append({"config": label, "params": params, "runs": rows})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
