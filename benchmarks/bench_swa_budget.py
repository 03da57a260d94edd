"""Benchmarks for the engine on the swa-budget model (figures for the closing note, not a test).

    python benchmarks/bench_swa_budget.py [--quick]

Prints: examples/s of each swa-budget data property, distinct states/s of
`explore` on scheduler configurations of growing size, the Hypothesis
adapter's steps/s, and seconds to the bug report's counterexample.
"""

from __future__ import annotations

import argparse
import platform
import time

from kvsim.app import catalog
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.models.swa_budget.variants import VARIANTS
from kvsim.models.swa_budget.scheduler import SchedulerConfig, SwaScheduler

CONFIGS = {
    "default (3 requests)": SchedulerConfig(2, 4, 4, 3, (1, 3, 2), (3, 2, 2)),
    "4 requests": SchedulerConfig(2, 4, 5, 4, (1, 3, 2, 1), (3, 3, 2, 2)),
    "5 requests": SchedulerConfig(2, 4, 6, 5, (1, 3, 2, 1, 2), (3, 3, 2, 2, 3)),
    "6 requests": SchedulerConfig(2, 4, 7, 5, (1, 3, 2, 1, 2, 1), (3, 3, 2, 2, 3, 2)),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer examples and configurations")
    args = ap.parse_args()
    reg = catalog.load()
    print(f"python {platform.python_version()} on {platform.machine()}")

    n = 300 if args.quick else 2000
    print(f"\n== properties ({n} examples, seed 0, fixed variant)")
    for prop in reg.properties_of("swa-budget"):
        if prop.kind != "data":
            continue
        r = run_property(prop, "fixed", max_examples=n, seed=0, use_examples=False)
        print(f"{prop.name:40s} {r.examples / r.seconds:10,.0f} examples/s ({r.status})")

    print("\n== explore (distinct states per second)")
    for name, config in list(CONFIGS.items())[: 2 if args.quick else None]:
        for variant in ("fixed", "pre_af7c62e"):
            r = explore(SwaScheduler(VARIANTS[variant], config))
            print(f"{name:22s} {variant:12s} {r.states:9,d} states {r.transitions:10,d} transitions "
                  f"{r.seconds:7.3f} s {r.states_per_second:10,.0f} states/s  violations: "
                  f"{[v.property for v in r.violations]}")
    for name, config in list(CONFIGS.items())[-1:]:
        r = explore(SwaScheduler(VARIANTS["fixed"], config), ExploreOptions(check_liveness=False))
        print(f"{name:22s} fixed, no liveness pass: {r.states_per_second:10,.0f} states/s")

    print("\n== Hypothesis adapter (scheduler_invariants, fixed)")
    prop = reg.property("swa-budget", "scheduler_invariants")
    r = run_property(prop, "fixed", max_examples=n // 4, seed=0)
    print(f"{r.examples} runs in {r.seconds:.2f} s = {r.examples / r.seconds:,.0f} runs/s ({r.status})")

    print("\n== bug report: seconds to the counterexample")
    for bug in reg.bugs.values():
        if bug.model != "swa-budget":
            continue
        times = []
        for seed in range(5):
            start = time.perf_counter()
            res = reproduce(bug, seed=seed)
            times.append((res.seconds, time.perf_counter() - start, res.examples, res.reproduced))
        for seed, (to_cex, total, examples, ok) in enumerate(times):
            print(f"{bug.id} seed {seed}: counterexample after {examples} examples in {to_cex:.3f} s "
                  f"(with the fixed-variant check: {total:.3f} s) reproduced={ok}")


if __name__ == "__main__":
    main()
