"""Benchmarks for pipelined-transfer (figures for the closing note, not a test).

    python benchmarks/bench_pipelined_transfer.py [--quick]

Prints: explore distinct states/s and state counts on growing configurations of `fixed` (each run to
completion, so the last line is the largest configuration explored exhaustively here), seconds to each bug
report's counterexample, simulated events/s of the timed simulation, and the worst error of the max-plus
closed form over random single-request workloads.
"""

from __future__ import annotations

import argparse
import random
import time

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.app.simulate import simulate_model
from kvsim.engine.explore import ExploreOptions, explore

ALL_FAULTS = "fail,drop,dup,silent,cancel,shutdown"
CONFIGS = [
    ("1 req, 1 rank, 2 chunks, 3 faults (default)", {}),
    ("1 req, 1 rank, 2 chunks, B, prefix, rx cache, 2 faults", {"boundary": "B", "prefix_hit": 1,
                                                                 "rx_cached_blocks": 1, "fault_budget": 2}),
    ("1 req, 2 ranks, 2 chunks, 3 faults", {"ranks": 2}),
    ("1 req, 1 rank, 3 chunks, all 6 faults", {"prompt_len": 9, "faults": ALL_FAULTS}),
    ("1 req, 2 ranks, 3 chunks, 3 faults", {"ranks": 2, "prompt_len": 9}),
    ("1 req, 2 ranks, 2 chunks, promotion, 3 faults", {"ranks": 2, "promotion": 1}),
    ("2 req, 1 rank, 2 chunks, 3 faults", {"requests": 2}),
    ("2 req, 2 ranks, 2 chunks, no faults (timeouts on)", {"requests": 2, "ranks": 2, "faults": "",
                                                           "fault_budget": 0}),
]
# Two requests multiply: the independent requests interleave freely (no partial-order reduction). The
# requests are interchangeable, so explore stores one state per orbit (`PipelinedTransfer.canonical`);
# these run with and without that reduction (the same verdicts; tests/models/pipelined_transfer/test_pipelined_transfer_symmetry.py).
TWO_REQUESTS = [
    ("2 req, 1 rank, 2 chunks, 3 faults", "fixed", {"requests": 2}),
    ("2 req, shared pool (3 pages), 1 rank, 2 chunks, 3 faults", "fixed", {"requests": 2, "rx_pages": 3}),
    ("2 req, shared pool, gen cancel + 3 faults, drain fix", "proposed_rx_release_after_drain",
     {"requests": 2, "rx_pages": 3, "faults": "gen_cancel,cancel,fail,silent"}),
    ("2 req, 1 rank, 2 chunks, 3 faults, budget 2", "fixed", {"requests": 2, "fault_budget": 2}),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="skip the two largest configurations, fewer workloads")
    args = parser.parse_args()
    reg = catalog.load()
    spec = reg.model("pipelined-transfer")
    print("== explore `fixed` (distinct states per second; every run complete unless marked)")
    for label, params in CONFIGS[:-2] if args.quick else CONFIGS:
        r = explore(spec.build_system("fixed", params), ExploreOptions(max_seconds=600))
        mark = "" if r.bound_hit is None else f" INCOMPLETE ({r.bound_hit})"
        print(f"{label:55s} {r.states:10,d} states {r.transitions:11,d} transitions {r.seconds:8.2f} s "
              f"{r.states_per_second:8,.0f} states/s depth {r.depth}{mark} {sorted(v.property for v in r.violations)}")

    print("\n== two requests with faults: states with and without the symmetry reduction")
    for label, variant, params in TWO_REQUESTS[:-1] if args.quick else TWO_REQUESTS:
        row = []
        for sym in (True, False):
            r = explore(spec.build_system(variant, params), ExploreOptions(max_seconds=600, symmetry=sym))
            mark = "" if r.bound_hit is None else f" INCOMPLETE ({r.bound_hit})"
            row.append(f"{r.states:9,d} states {r.seconds:7.2f} s{mark}")
        print(f"{label:58s} reduced {row[0]} | full {row[1]} {sorted(v.property for v in r.violations)}")

    print("\n== seconds to each bug report's counterexample (variant search, then the fixed/fix-variant check)")
    for bug in reg.bugs.values():
        if bug.model != "pipelined-transfer":
            continue
        start = time.perf_counter()
        res = reproduce(bug)
        print(f"{bug.id:46s} {bug.check:26s} {res.examples:6,d} states {res.seconds:.3f} s to the counterexample "
              f"({len(res.counterexample['trace'])} steps), {time.perf_counter() - start:.3f} s with the fixed check")

    print("\n== timed simulation (events of the pipelined run; the baseline run is included in the seconds)")
    for params, faults in (({"requests": 1000, "arrival_rate": 100.0}, None),
                           ({"requests": 300, "arrival_rate": 300.0, "ranks": 4, "boundary": "B",
                             "chunk_tokens": 1000, "prefix_hit": 500}, "drop=0.01,duplicate=0.01")):
        r = simulate_model(spec, "fixed", 0, params, faults)
        s = r.summary
        print(f"{params} {faults}: {r.events:,d} events in {r.seconds:.3f} s = {r.events / r.seconds:,.0f} events/s;"
              f" completed {s['completed']}, closed form checked on {s['closed_form_checked']}, "
              f"violations {s['violations'][:2]}")

    print("\n== max-plus closed form against the simulation, random single-request workloads")
    rng = random.Random(0)
    worst, n = 0.0, 200 if args.quick else 1000
    for i in range(n):
        prompt = rng.randint(1, 32768)
        params = {"requests": 1, "prompt_len": prompt, "chunk_tokens": rng.randint(max(1, prompt // 16), prompt),
                  "tokens_per_block": rng.choice((16, 32, 64)), "boundary": rng.choice("AB"),
                  "bandwidth_gbs": rng.uniform(1, 100), "latency_us": rng.uniform(0, 100),
                  "compute_us_per_token": rng.uniform(0.01, 2), "context_slowdown": rng.uniform(0, 1),
                  "ranks": rng.randint(1, 8)}
        s = simulate_model(spec, "fixed", i, params).summary
        assert not s["violations"], s["violations"]
        worst = max(worst, s["closed_form_worst_error_s"])
    print(f"{n} workloads: worst |simulated - closed form| = {worst:.3e} s")


if __name__ == "__main__":
    main()
