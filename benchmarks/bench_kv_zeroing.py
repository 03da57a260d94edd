"""Benchmark the kv-zeroing model and its kernel properties.

    python benchmarks/bench_kv_zeroing.py [--examples N] [--mib M]

Prints: examples per second of every kernel property of kv-zeroing (the
differential checks of `kvsim.gpu_oracle`, run by the engine's runner on the
fixed variant) on every available backend (the ASan figure includes starting
its child interpreter); seconds for Hypothesis to find and shrink the bug
report's counterexample (no pinned examples, five seeds); zeroing throughput
of the CPU-compiled CUDA C kernel and of the torch CPU backend on one buffer
of M MiB (default 256), in place, best of four passes, next to a plain numpy
memset of the same spans.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from kvsim.app.catalog import load
from kvsim.engine.runner import run_property
from kvsim.gpu_oracle.kernels.zero_kv_blocks import backends as zeroing
from kvsim.gpu_oracle.runtime import discovery
from kvsim.models.kv_zeroing import DESCRIPTOR, FIXED
from kvsim.models.kv_zeroing.geometry import Arena
from kvsim.models.kv_zeroing.layouts import dense_layout
from kvsim.models.kv_zeroing.zeroer import plan_segments, zero_blocks

BUG = "vllm-d6af803-packed-zeroing-stride"


def differential_rates(examples: int) -> None:
    kernel_properties = [p for p in load().properties_of(DESCRIPTOR.name) if p.is_kernel]
    print(f"kernel properties of {DESCRIPTOR.name} on {FIXED.name}, {examples} examples, seed 0")
    if not kernel_properties:
        print("  none registered")
    for backend in discovery.backends():
        name = backend["name"]
        if not backend["available"]:
            print(f"  {name:14s} skipped: {backend['reason']}")
            continue
        for prop in (p for p in kernel_properties if name in p.backends):
            run_property(prop, FIXED, max_examples=5, seed=1, backend=name)  # build and warm up
            result = run_property(prop, FIXED, max_examples=examples, seed=0, backend=name)
            print(f"  {name:14s} {prop.name:40s} {result.status:6s} {result.examples:5d} examples in "
                  f"{result.seconds:6.2f} s = {result.examples / max(result.seconds, 1e-9):7.0f} examples/s")


def bug_search() -> None:
    registry = load()
    bug = registry.bug(BUG)
    prop = registry.property(bug.model, bug.property)
    variant = registry.model(bug.model).variant(bug.variant)  # the name, resolved once to its flag record
    times = []
    print(f"bug {BUG}: {bug.property} on {variant.name}, pinned examples off, max {bug.max_examples} examples")
    for seed in range(5):
        result = run_property(prop, variant, max_examples=bug.max_examples, seed=seed, use_examples=False)
        times.append(result.seconds)
        print(f"  seed {seed}: {result.status} after {result.examples:3d} examples (search + shrink) in "
              f"{result.seconds:.3f} s")
    print(f"  median {statistics.median(times):.3f} s, max {max(times):.3f} s; minimal case: "
          f"{result.counterexample['case'] if result.counterexample else None}")


def throughput(mib: int) -> None:
    # A dense cache of 64 KiB blocks (16 tokens x 8 heads x 128 x fp32), every block zeroed in one launch.
    blocks = mib * 2**20 // 65_536
    geometry = dense_layout(num_blocks=blocks, kernel_block_size=16, heads=8, head_size=128, element_size=4,
                            kv="none")
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, FIXED, arena=arena)
    ids = list(range(blocks))
    nbytes = geometry.allocations[0]
    memory = np.ones(arena.size, dtype=np.uint8)
    launch = zeroing.prepare(memory, table, ids)
    print(f"zeroing throughput: {nbytes / 2**20:.0f} MiB, {blocks} blocks of 64 KiB, chunk width "
          f"{launch.chunk_width}, best of 4 passes (the first faults the pages in)")
    runners = {"numpy memset (reference)": lambda m: zero_blocks(m, table, ids)}
    for name in ("cpu-shim", "torch-cpu"):
        if discovery.available(name):
            runners[f"{name}"] = lambda m, name=name: zeroing.BACKENDS[name](m, launch, arena)
    for name, run in runners.items():
        best = float("inf")
        for _ in range(4):  # the first pass faults the pages in
            memory[:] = 1
            start = time.perf_counter()
            run(memory)
            best = min(best, time.perf_counter() - start)
        base = arena.bases[0]
        assert not memory[base:base + nbytes].any(), f"{name} left bytes set"
        print(f"  {name:26s} {best * 1e3:8.1f} ms  {nbytes / best / 1e9:6.2f} GB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    differential_rates(args.examples)
    bug_search()
    throughput(args.mib)


if __name__ == "__main__":
    main()
