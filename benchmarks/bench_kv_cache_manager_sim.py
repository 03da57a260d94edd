"""Benchmark of kv-cache-manager's two timed simulations (figures for the closing note, not a test).

    python benchmarks/bench_kv_cache_manager_sim.py [--quick] [--realistic]

Prints, per workload size: the simulator's events/s and the model actions/s (each action one transition of the
system) of `kvsim simulate kv-cache-manager-pd` (the P/D hand-off over `ProducerSchedulerSystem`) and, on the same
machine for a ratio, of `kvsim simulate kv-cache-manager` (the prefix-sharing workload over `CacheManagerSystem`).
Both systems' state holds every request of the workload, so a step's cost grows with it.

`--realistic` runs instead both simulations at a serving engine's size (1,000 requests of 1,024 prompt and 256
output tokens on 8,192 blocks of 16, the first 150 and 300 events), and SGLang's radix cache's (`kvsim simulate
radix-cache`, the first workload on 8,192 pages of 16, 150 events), where what a step costs per block of the pool
shows: CPU seconds, events and actions per second, and the trace digest (run it on two trees for a before/after:
the digests must agree).
"""

from __future__ import annotations

import argparse
import platform
import time

from kvsim.app.simulate import simulate_model
from kvsim.models.kv_cache_manager import DESCRIPTOR, PD_DESCRIPTOR
from kvsim.models.radix_cache import DESCRIPTOR as RADIX


def run(spec, variant: str, params: dict) -> tuple[float, float, dict]:
    r = simulate_model(spec, variant, 0, params, keep_steps=False)
    return r.events / r.seconds, len(r.driver.actions) / r.seconds, r.summary


REALISTIC = {"requests": 1000, "prompt_len": 1024, "max_tokens": 256, "num_blocks": 8192, "block_size": 16}


def realistic() -> None:
    """`--realistic`: the three simulations at a serving engine's size (module doc)."""
    shared = {**REALISTIC, "families": 16, "shared": 512}
    pages = {k.replace("blocks", "pages").replace("block", "page"): v for k, v in shared.items()}
    for spec, params, events in ((DESCRIPTOR, shared, 150), (PD_DESCRIPTOR, REALISTIC, 300), (RADIX, pages, 150)):
        cpu = time.process_time()
        r = simulate_model(spec, "fixed", 0, params, max_events=events, keep_steps=False)
        cpu = time.process_time() - cpu
        print(f"{spec.name:22s} {r.events} events, {len(r.driver.actions)} actions: {cpu:.2f} s CPU, "
              f"{r.events / cpu:,.0f} events/s, {len(r.driver.actions) / cpu:,.0f} actions/s, digest {r.digest[:16]}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the smaller workloads only")
    ap.add_argument("--realistic", action="store_true", help="instead: the simulations at a serving engine's size")
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}")
    if args.realistic:
        realistic()
        return
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
