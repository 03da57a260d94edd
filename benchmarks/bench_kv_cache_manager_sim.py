"""Benchmark of kv-cache-manager's two timed simulations (figures for the closing note, not a test).

    python benchmarks/bench_kv_cache_manager_sim.py [--quick]

Prints, per workload size: the simulator's events/s and the model actions/s (each action one transition of the
system) of `kvsim simulate kv-cache-manager-pd` (the P/D hand-off over `ProducerSchedulerSystem`) and, on the same
machine for a ratio, of `kvsim simulate kv-cache-manager` (the prefix-sharing workload over `CacheManagerSystem`).
Both systems' state holds every request of the workload, so a step's cost grows with it.
"""

from __future__ import annotations

import argparse
import platform

from kvsim.app.simulate import simulate_model
from kvsim.models.kv_cache_manager import DESCRIPTOR, PD_DESCRIPTOR


def run(spec, variant: str, params: dict) -> tuple[float, float, dict]:
    r = simulate_model(spec, variant, 0, params, keep_steps=False)
    return r.events / r.seconds, len(r.driver.actions) / r.seconds, r.summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the smaller workloads only")
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}")
    sizes = (100, 200) if args.quick else (100, 200, 1000)
    print(f"{'model':22s} {'requests':>8s} {'events/s':>10s} {'actions/s':>10s}  outcome")
    for n in sizes:
        rates = {}
        for spec in (PD_DESCRIPTOR, DESCRIPTOR):
            events, actions, s = run(spec, "fixed", {"requests": n})
            rates[spec.name] = actions
            print(f"{spec.name:22s} {n:8d} {events:10,.0f} {actions:10,.0f}  violations {len(s['violations'])}")
        ratio = rates[PD_DESCRIPTOR.name] / rates[DESCRIPTOR.name]
        print(f"{'':31s} pd / kv-cache-manager actions/s: {ratio:.2f}")
    events, actions, s = run(PD_DESCRIPTOR, "pre_50297", {})
    print(f"kv-cache-manager-pd pre_50297 seed 0: {events:,.0f} events/s, {actions:,.0f} actions/s, "
          f"violation at {s['violation_time']:.2f} s")


if __name__ == "__main__":
    main()
