"""Benchmarks for the pd-staging transition system (figures for the closing note, not a test).

    python benchmarks/bench_pd_staging.py [--quick]

Prints: distinct states/s and state counts of `explore` for one and two
rooms (one and two writers), simulated events/s of `kvsim simulate
pd-staging` on a 1,000-room workload, and seconds to each pd-staging bug
report's counterexample by `explore` and by Hypothesis (the stateful
property `staging_invariants` with the report's parameters, seeds 0..4).
The SimPy side-by-side is `benchmarks/bench_sim_vs_simpy.py`.
"""

from __future__ import annotations

import argparse
import platform
import time

from kvsim.app import catalog
from kvsim.engine.explore import explore
from kvsim.engine.params import resolve
from kvsim.engine.runner import run_property
from kvsim.app.simulate import simulate_model

CONFIGS = {
    "1 room, W=1 (default)": {},
    "1 room, W=1, L=3, ring 2": {"prompt_len": 3, "ring_units": 2},
    "1 room, W=2": {"writers": 2, "prompt_len": 1},
    "2 rooms, W=1": {"rooms": 2, "prompt_len": 1},
    "2 rooms, W=1, ring 1": {"rooms": 2, "prompt_len": 1, "ring_units": 1, "faults": "drop_ready"},
    "2 rooms, W=2, no faults": {"rooms": 2, "prompt_len": 1, "writers": 2, "faults": "", "timeouts": 0},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the largest configuration, one Hypothesis seed")
    args = ap.parse_args()
    reg = catalog.load()
    spec = reg.model("pd-staging")
    print(f"python {platform.python_version()} on {platform.machine()}")

    print("\n== explore (distinct states per second)")
    for name, given in list(CONFIGS.items())[: -1 if args.quick else None]:
        params = resolve(spec.params, given)
        for variant in spec.variants:
            r = explore(spec.build_system(variant, params))
            print(f"{name:28s} {variant:12s} {r.states:9,d} states {r.transitions:10,d} transitions "
                  f"{r.seconds:7.3f} s {r.states_per_second:9,.0f} states/s  violations: "
                  f"{[v.property for v in r.violations]}")

    print("\n== timed simulation (1,000 rooms, 50 arrivals/s, W=2)")
    for variant, faults in (("fixed", None), ("fixed", "delay=0.05:0.2,duplicate=0.01"), ("pre_05c7ebf", None)):
        sim = simulate_model(spec, variant, 0, {"requests": 1000, "arrival_rate": 50.0}, faults)
        print(f"{variant:12s} faults={faults or '-':32s} {sim.events:7,d} events {sim.seconds:6.2f} s "
              f"{sim.events / sim.seconds:9,.0f} events/s  outcomes {sim.summary['outcomes']}")

    print("\n== seconds to each bug report's counterexample")
    prop = reg.property("pd-staging", "staging_invariants")
    seeds = range(1 if args.quick else 5)
    for bug in reg.bugs.values():
        if bug.model != "pd-staging" or bug.invariant is None:
            continue
        params = resolve(spec.params, dict(bug.params))
        start = time.perf_counter()
        r = explore(spec.build_system(bug.variant, params))
        hit = next((v for v in r.violations if v.property == bug.invariant), None)
        ex = f"{time.perf_counter() - start:7.3f} s, {r.states:6,d} states, {len(hit.trace) if hit else '-'} steps"
        hyp = []
        if bug.invariant == "every_room_concludes":
            seeds_here: range = range(0)
            hyp.append("n/a (a hang: liveness is explore's; the state machine checks invariants)")
        else:
            seeds_here = seeds
        for seed in seeds_here:
            h = run_property(prop, bug.variant, max_examples=2000, seed=seed, params=dict(bug.params))
            found = h.status == "failed" and (h.counterexample or {}).get("invariant") == bug.invariant
            other = h.status == "failed" and not found
            miss = " (held, as expected)" if bug.status == "not reproducible" else " (not found)"
            hyp.append(f"{h.seconds:.2f}s" + ("" if found else " (other: " + h.counterexample["invariant"] + ")"
                                              if other else miss))
        print(f"{bug.id:52s} {bug.status:16s} explore {ex}; Hypothesis {', '.join(hyp)}")


if __name__ == "__main__":
    main()
