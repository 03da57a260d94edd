"""Shared by the oracle benchmark scripts: examples/s of checks per backend, and best-of timing."""

from __future__ import annotations

import time
from typing import Callable, Iterable

import kvsim.gpu_oracle as gpu_oracle
from kvsim.gpu_oracle.runtime.checks import CHECKS, run_check


def check_rates(families: Iterable[str], examples: int) -> None:
    """Examples per second of every registered check whose name starts with one of `families`."""
    families = tuple(families)
    rows = {b["name"]: b for b in gpu_oracle.backends()}
    for name in [n for n in CHECKS if n.split(".")[0] in families]:
        check = CHECKS[name]
        print(f"{name}, up to {examples} examples, seed 0")
        for backend in check.backends:
            if not rows[backend]["available"]:
                print(f"  {backend:14s} skipped: {rows[backend]['reason']}")
                continue
            run_check(check, backend, max_examples=3, seed=1)  # build and warm up
            start = time.perf_counter()
            outcome = run_check(check, backend, max_examples=examples, seed=0)
            seconds = time.perf_counter() - start
            print(f"  {backend:14s} {outcome.status:6s} {outcome.examples:5d} examples in {seconds:6.2f} s = "
                  f"{outcome.examples / seconds:7.1f} examples/s")


def best_of(run: Callable[[], object], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
