"""Shared by the oracle benchmark scripts: examples/s of kernel properties per backend, and best-of timing."""

from __future__ import annotations

import time
from typing import Callable

import kvsim.gpu_oracle as gpu_oracle
from kvsim.app import catalog, oracle


def check_rates(model: str, examples: int) -> None:
    """Examples per second of every kernel property of `model` on every backend it lists."""
    registry = catalog.load()
    gpu_oracle.register(registry)  # a no-op where the models' properties packages registered them already
    rows = oracle.backends()
    for prop in oracle.kernel_properties(registry):
        if prop.model != model:
            continue
        print(f"{model}:{prop.name}, up to {examples} examples, seed 0")
        for backend in prop.backends:
            oracle.run_kernel_property(prop, backend, max_examples=3, seed=1, rows=rows)  # build and warm up
            start = time.perf_counter()
            result = oracle.run_kernel_property(prop, backend, max_examples=examples, seed=0, rows=rows)
            seconds = time.perf_counter() - start
            if result.status == "skipped":
                print(f"  {backend:14s} skipped: {result.message}")
                continue
            print(f"  {backend:14s} {result.status:6s} {result.examples:5d} examples in {seconds:6.2f} s = "
                  f"{result.examples / seconds:7.1f} examples/s")


def best_of(run: Callable[[], object], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
