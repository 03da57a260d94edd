"""Benchmark the mla-chunks model (figures for the closing note, not a test).

    python benchmarks/bench_mla_chunks.py [--examples N]

Prints: requests planned per second by `plan_mla_context_chunks` on random batches of
1,000, 10,000 and 100,000 prefills (without and with DCP), and of the metadata builder and
the uniform planner on 1,000; seconds for Hypothesis to find and shrink each bug report's
counterexample (no pinned examples, seed 0); examples per second of the numeric end-to-end
property on `fixed`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvsim.app.catalog import load
from kvsim.engine.runner import run_property
from kvsim.models.mla_chunks.planner import (align_mla_chunked_context_workspace_size, mla_chunk_alignment, plan_mla_context_chunks,
                               plan_uniform_context_chunks, round_down)
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.metadata import build_mla_chunked_context_metadata, query_start_loc_of

MODEL = "mla-chunks"
BLOCK = 64
REQUESTED_WORKSPACE = 64 * 1024


def batch(n: int, seed: int = 0) -> list[int]:
    """Contexts up to 4096 rows, one prefill in four without context."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(1, 4097, size=n)
    ctx[rng.random(n) < 0.25] = 0
    return ctx.tolist()


def best_of(runs: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def planner_throughput() -> None:
    print(f"plan_mla_context_chunks (block {BLOCK}, requested workspace {REQUESTED_WORKSPACE}, best of 3)")
    for label, dcp in (("no DCP", None), ("DCP 2 x 64", DcpConfig(2, 64))):
        w = align_mla_chunked_context_workspace_size(REQUESTED_WORKSPACE, 1, BLOCK, dcp)
        alignment = mla_chunk_alignment(BLOCK, dcp)
        budget = w if dcp is None else w // dcp.world_size
        pad = None if dcp is None else dcp.padded_rows
        for n in (1_000, 10_000, 100_000):
            ctx = batch(n)
            seconds, plans = best_of(3, lambda: plan_mla_context_chunks(ctx, budget, round_down(w, alignment),
                                                                        alignment, pad))
            print(f"  {label:10s} {n:7d} requests: {len(plans):5d} chunks in {seconds * 1e3:8.2f} ms = "
                  f"{n / seconds:12,.0f} requests/s")
    ctx = batch(1_000)
    qsl = query_start_loc_of([4] * len(ctx))
    seconds, md = best_of(3, lambda: build_mla_chunked_context_metadata(ctx, qsl, REQUESTED_WORKSPACE, BLOCK))
    rows = sum(ctx)
    print(f"  build_mla_chunked_context_metadata, 1,000 requests ({rows:,} rows, {len(md.chunks)} chunks): "
          f"{seconds * 1e3:.1f} ms = {1_000 / seconds:,.0f} requests/s ({rows / seconds:,.0f} rows/s)")
    w = max(REQUESTED_WORKSPACE, len(ctx) * BLOCK)  # the old lower bound, max_num_seqs = batch size
    seconds, plan = best_of(3, lambda: plan_uniform_context_chunks(ctx, w, BLOCK))
    print(f"  plan_uniform_context_chunks, 1,000 requests (W {w}): {plan.num_chunks} chunks in "
          f"{seconds * 1e3:.1f} ms = {1_000 / seconds:,.0f} requests/s")


def bug_search() -> None:
    registry = load()
    print("seconds to each bug report's shrunk counterexample (use_examples=False, seed 0)")
    for bug in registry.bugs.values():
        if bug.model != MODEL:
            continue
        result = run_property(registry.property(MODEL, bug.property), bug.variant, max_examples=bug.max_examples,
                              seed=0, use_examples=False)
        case = (result.counterexample or {}).get("case", {})
        print(f"  {bug.id:40s} {result.status:6s} {result.examples:4d} examples {result.seconds:6.3f} s  "
              f"ctx {case.get('context_lens')} block {case.get('block_size')} W {case.get('workspace_size')} "
              f"dcp {case.get('dcp_world_size')}x{case.get('dcp_interleave')}")


def numeric_rate(examples: int) -> None:
    registry = load()
    for name in ("chunked_prefill_matches_full_attention", "context_partial_matches_context_attention",
                 "output_independent_of_workspace_block_and_alignment"):
        result = run_property(registry.property(MODEL, name), "fixed", max_examples=examples, seed=0,
                              use_examples=False)
        print(f"  {name:52s} {result.status:6s} {result.examples:5d} examples in {result.seconds:6.2f} s = "
              f"{result.examples / result.seconds:6.0f} examples/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="examples for the numeric properties")
    args = parser.parse_args()
    planner_throughput()
    bug_search()
    print(f"numeric properties on fixed, {args.examples} examples, seed 0")
    numeric_rate(args.examples)


if __name__ == "__main__":
    main()
