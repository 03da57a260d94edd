"""Benchmark the PD staging oracle: its checks per backend, the kernels' bandwidth, and the end-to-end property.

    python benchmarks/bench_oracle_staging.py [--examples N] [--property-examples M] [--tokens T]

Prints: examples per second of every kernel property of model pd-staging
(`staging_*`, `decode_kv_through_kernels_matches_single_server`) on every available backend (the ASan figures include starting
the child interpreter; skipped backends print their reason); the bandwidth of one
writer's gather and scatter of a Llama-3.1-8B slot (prefill TP 4 -> decode TP 2, two
heads of 128 bf16-sized entries, 32 layers, T tokens, default 256 = one cps-256 grid
cell) on the CPU backends next to the numpy reference, best of three; and examples
per second of `decode_kv_matches_single_server` on both variants.
"""

from __future__ import annotations

import argparse

import numpy as np

import kvsim.gpu_oracle as gpu_oracle
from kvsim.gpu_oracle.runtime.discovery import available
from kvsim.app import catalog
from kvsim.engine.runner import run_property
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging.copy import gather_head_slice_to_staging, scatter_staging_to_pages
from kvsim.models.pd_staging.layout import HeadReshard
from oracle_rates import best_of, check_rates  # benchmarks/oracle_rates.py


def throughput(tokens: int) -> None:
    res, ps, layers, dim = HeadReshard(8, 4, 2), 16, 32, 128
    pages = tokens // ps
    params = layout.writers_of_decode_rank(res, 0)[1][1]
    lay = layout.compute_staging_layout(res, 0, pages * ps, layers, dim * 2)
    rng = np.random.default_rng(0)
    prefill = rng.integers(0, 2**16, (layers, 2, 2 * pages, ps, res.src_per, dim), dtype=np.uint16)
    decode = rng.integers(0, 2**16, (layers, 2, 2 * pages, ps, res.dst_per, dim), dtype=np.uint16)
    src, dst = rng.permutation(2 * pages)[:pages], rng.permutation(2 * pages)[:pages]
    slot = gather_head_slice_to_staging(prefill, src, params, lay)
    nbytes = lay.writer_size(params.writer_index)
    print(f"one writer of a Llama-3.1-8B slot: {tokens} tokens x 2 heads x 128 x 2 bytes x 32 layers x K,V = "
          f"{nbytes / 2**20:.0f} MiB, best of 3")
    runners = {"numpy reference": (lambda: gather_head_slice_to_staging(prefill, src, params, lay),
                                   lambda: scatter_staging_to_pages(decode.copy(), slot, dst, params, lay))}
    for name in ("cpu-shim", "torch-cpu"):
        if available(name):
            runners[name] = (lambda b=name: gpu_oracle.gather_head_slice(b, prefill, src, params, lay),
                             lambda b=name: gpu_oracle.scatter_staging(b, decode, slot, dst, params, lay))
    for name, (gather, scatter) in runners.items():
        g, s = best_of(gather), best_of(scatter)
        print(f"  {name:16s} gather {g * 1e3:8.2f} ms = {nbytes / g / 2**30:6.2f} GiB/s   "
              f"scatter {s * 1e3:8.2f} ms = {nbytes / s / 2**30:6.2f} GiB/s")


def property_rates(examples: int) -> None:
    prop = {p.name: p for p in catalog.load().properties_of("pd-staging")}["decode_kv_matches_single_server"]
    for variant in ("fixed", "pre_05c7ebf"):
        result = run_property(prop, variant, max_examples=examples, seed=0, use_examples=False)
        print(f"decode_kv_matches_single_server [{variant}]: {result.status}, {result.examples} examples in "
              f"{result.seconds:.2f} s = {result.examples / result.seconds:.0f} examples/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--property-examples", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    check_rates("pd-staging", args.examples)
    throughput(args.tokens)
    property_rates(args.property_examples)


if __name__ == "__main__":
    main()
