"""Benchmarks for the kv-offload model (figures for the closing note, not a test).

    python benchmarks/bench_kv_offload.py [--quick]

Prints: examples/s of each kv-offload manager property, distinct states/s of `explore` on growing
configurations (LRU and ARC), seconds to the #35846 counterexample (explore and Hypothesis), the lockstep
steps/s against vLLM 0.33.0's real `CPUOffloadingManager` and of the 0.29.0-vs-0.30.0 rename comparison
(needs those wheels; fetched once into ~/.cache/kvsim), and the simulation's events/s.
"""

from __future__ import annotations

import argparse
import platform
import time

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.app.simulate import simulate_model
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.runner import run_property
from kvsim.models.kv_offload import DESCRIPTOR

MAX_STATES = 200_000  # a bound per configuration (3 requests, 2 slots under ARC has over a million states)
CONFIGS = {
    "default (2 requests, 2 slots)": {},
    "3 requests, 2 slots": {"requests": 3},
    "3 requests, 3 slots, 3 keys each": {"requests": 3, "num_chunks": 3, "prompt_len": 3},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer examples and configurations")
    args = ap.parse_args()
    reg = catalog.load()
    print(f"python {platform.python_version()} on {platform.machine()}")

    n = 200 if args.quick else 1000
    print(f"\n== properties ({n} examples, seed 0, fixed variant)")
    for prop in reg.properties_of("kv-offload"):
        if prop.kind != "data" or prop.home.endswith(".mapping"):
            continue
        r = run_property(prop, "fixed", max_examples=n, seed=0, use_examples=False)
        print(f"{prop.name:45s} {r.examples / r.seconds:8,.0f} examples/s ({r.status})")

    print("\n== explore (distinct states per second)")
    for name, params in list(CONFIGS.items())[: 2 if args.quick else None]:
        for policy in ("lru", "arc"):
            r = explore(DESCRIPTOR.build_system("fixed", {**params, "cache_policy": policy}),
                                                ExploreOptions(max_states=MAX_STATES))
            print(f"{name:34s} {policy}  {r.states:9,d} states {r.transitions:10,d} transitions "
                  f"{r.seconds:7.2f} s {r.states_per_second:9,.0f} states/s")

    print("\n== seconds to the #35846 counterexample")
    result = reproduce(reg.bug("vllm-35846-already-stored-evicted"))
    print(f"explore (pre_already_stored_fix): {result.seconds:.3f} s, {result.examples} states, "
          f"path {result.counterexample['trace']}")
    r = run_property(reg.property("kv-offload", "prepare_store_never_evicts_an_input_key"), "pre_already_stored_fix",
                     max_examples=2000, seed=0, use_examples=False)
    print(f"Hypothesis (prepare_store_never_evicts_an_input_key): {r.seconds:.3f} s, {r.examples} examples ({r.status})")

    print("\n== lockstep against the real manager")
    from kvsim.conform.source import resolve_source
    from kvsim.conform.targets import RunOptions
    from kvsim.conform.vllm import offload

    m = 100 if args.quick else 300
    for label, fn, version in (("CPUOffloadingManager 0.33.0 vs model", offload.run_lockstep, "0.33.0"),
                               ("rename: 0.29.0 vs 0.30.0", offload.run_rename, "0.30.0")):
        res = fn(resolve_source("vllm", version=version), RunOptions(max_examples=m))
        print(f"{label:38s} {res.status:9s} {res.compared:7,d} steps {res.seconds:6.2f} s "
              f"{res.compared / res.seconds:8,.0f} steps/s")

    print("\n== simulation (events per second)")
    for requests in (200, 1000) if not args.quick else (200,):
        for policy in ("lru", "arc"):
            start = time.perf_counter()
            s = simulate_model(DESCRIPTOR, "fixed", 0, {"requests": requests, "num_chunks": 48, "cache_policy": policy})
            seconds = time.perf_counter() - start
            print(f"{requests:5d} requests {policy}: {s.events:6,d} events {seconds:6.2f} s "
                  f"{s.events / seconds:8,.0f} events/s, hit rate {s.summary['hit_rate']}")


if __name__ == "__main__":
    main()
