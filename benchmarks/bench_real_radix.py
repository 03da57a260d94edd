"""Benchmark of SGLang's real radix cache driven in its child (figures for the closing note, not a test).

    python benchmarks/bench_real_radix.py [--rounds N] [--no-vllm]

Prints: the cold start of a child importing SGLang 0.5.23's `radix_cache` (the child's own import time and the wall
time to its first answer; the release and its dependencies are fetched once into ~/.cache/kvsim), then round trips
per second through it for the tree ops (match, insert, lock, unlock, and an evict when the pool runs short) and for
a request's life (prefill, decode, release), each a shared-prefix workload; with vLLM, the same count of round
trips through vLLM 0.33.0's `ManagerDriver` (computed, allocate, free) and the ratio of the two rates.
"""

from __future__ import annotations

import argparse
import time

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import InstalledChild

RADIX = "kvsim.conform.sglang.real_radix:RadixDriver"
MANAGER = "kvsim.conform.vllm.real_manager:ManagerDriver"
PAGE = 4


def prompt(i: int) -> list[int]:
    """64 tokens: one of 8 shared 32-token prefixes, then the request's own 32."""
    return [1000 * (i % 8) + t for t in range(32)] + [10 ** 6 + 100 * i + t for t in range(32)]


def tree_ops(child: InstalledChild, rounds: int) -> tuple[int, float]:
    child.call("build", size=1024, page_size=PAGE)
    calls, started = 0, time.perf_counter()
    for i in range(rounds):
        tokens = prompt(i)
        hit = child.call("match", tokens=tokens)
        child.call("lock", node=hit["node"])
        new = child.call("alloc", n=len(tokens) - hit["prefix_len"])
        calls += 3
        if new is None:
            child.call("unlock", node=hit["node"])
            child.call("evict", num_tokens=256)
            calls += 2
            continue
        done = child.call("insert", tokens=tokens, indices=hit["indices"] + new)
        child.call("unlock", node=hit["node"])
        calls += 2
        if done["prefix_len"] > hit["prefix_len"]:  # the caller frees its duplicate slots
            child.call("free", indices=new[: done["prefix_len"] - hit["prefix_len"]])
            calls += 1
    return calls, time.perf_counter() - started


def request_ops(child: InstalledChild, rounds: int) -> tuple[int, float]:
    child.call("build", size=1024, page_size=PAGE, rows=8, context=128)
    calls, started = 0, time.perf_counter()
    for i in range(rounds):
        name = f"r{i}"
        child.call("prefill", request=name, tokens=prompt(i))
        child.call("decode", request=name, token=7)
        child.call("release", request=name)
        calls += 3
    return calls, time.perf_counter() - started


def manager_ops(child: InstalledChild, rounds: int) -> tuple[int, float]:
    child.call("build", num_blocks=256, block_size=PAGE)
    calls, started = 0, time.perf_counter()
    for i in range(rounds):
        name = f"r{i}"
        hit = child.call("computed", request=name, tokens=prompt(i))
        child.call("allocate", request=name, new_tokens=64 - hit["hit"], computed_tokens=hit["hit"])
        child.call("free", request=name)
        calls += 3
    return calls, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()

    env = prepare("sglang", "0.5.23")
    started = time.perf_counter()
    with InstalledChild(env, RADIX) as child:
        print(f"sglang 0.5.23 child: import {child.import_s:.1f} s, first answer after "
              f"{time.perf_counter() - started:.1f} s")
        calls, took = tree_ops(child, args.rounds)
        tree_rate = calls / took
        print(f"tree ops:    {calls} round trips, {tree_rate:,.0f}/s")
        calls, took = request_ops(child, args.rounds)
        request_rate = calls / took
        print(f"request ops: {calls} round trips, {request_rate:,.0f}/s (prefill, decode, release)")
    if args.no_vllm:
        return
    with InstalledChild(prepare("vllm", "0.33.0"), MANAGER) as child:
        calls, took = manager_ops(child, args.rounds)
        rate = calls / took
        print(f"vllm 0.33.0 ManagerDriver: {calls} round trips, {rate:,.0f}/s (computed, allocate, free); "
              f"sglang/vllm: tree {tree_rate / rate:.2f}, request {request_rate / rate:.2f}")


if __name__ == "__main__":
    main()
