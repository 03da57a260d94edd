"""Benchmark the MLA chunked-context oracle: its checks per backend, and the kernels' throughput.

    python benchmarks/bench_oracle_mla.py [--examples N] [--rows R]

Prints: examples per second of every kernel property of model mla-chunks
(`gather_mla_context_*`, `merge_attn_states_*`, `mla_prefill_*`) on every available backend (the ASan
figures include starting the child interpreter; skipped backends print their
reason); then, on the CPU backends, the gather's bandwidth for R workspace rows of
DeepSeek's 576-entry bf16-sized latent (default 65,536 rows, the 64 Ki workspace
cap) and the merge's rate over the matching [tokens, 16 heads, 128] fp32 states,
best of three, next to the numpy reference.
"""

from __future__ import annotations

import argparse

import numpy as np

from kvsim.gpu_oracle.runtime.discovery import available
from kvsim.gpu_oracle.kernels.mla_context import backends as mla
from kvsim.models.mla_chunks.attention import gather_context_rows, merge_attn_states
from oracle_rates import best_of, check_rates  # benchmarks/oracle_rates.py


def throughput(rows: int) -> None:
    rng = np.random.default_rng(0)
    block, width, seqs = 64, 576, 8
    per_seq = rows // seqs
    blocks = seqs * -(-per_seq // block)
    kv = rng.integers(0, 2**16, (blocks, block, width), dtype=np.uint16)  # bf16-sized entries, moved as bits
    table = rng.permutation(blocks).reshape(seqs, -1)
    cu = np.arange(seqs + 1) * per_seq
    seq = np.repeat(np.arange(seqs), per_seq)
    starts = np.zeros(seqs, dtype=np.int64)
    nbytes = len(seq) * width * 2
    print(f"gather: {len(seq)} rows x {width} x 2 bytes = {nbytes / 2**20:.0f} MiB, block {block}, best of 3")
    runners = {"numpy reference": lambda: gather_context_rows(kv, table, cu, seq, starts)}
    for name in ("cpu-shim", "torch-cpu"):
        if available(name):
            launch = mla.prepare_gather(kv, table, cu, seq, starts)
            runners[name] = lambda name=name, launch=launch: mla.GATHER_KERNEL.run(name, launch)
    for name, run in runners.items():
        seconds = best_of(run)
        print(f"  {name:16s} {seconds * 1e3:8.1f} ms  {nbytes / seconds / 1e9:6.2f} GB/s")
    tokens, heads, dim = min(rows, 8192), 16, 128
    po, so = (rng.standard_normal((tokens, heads, dim)).astype(np.float32) for _ in range(2))
    pl, sl = ((rng.standard_normal((heads, tokens)) * 5).astype(np.float32) for _ in range(2))
    elements = tokens * heads * dim
    print(f"merge: [{tokens}, {heads}, {dim}] fp32 states, best of 3")
    runners = {"numpy reference (f64)": lambda: merge_attn_states(po, pl, so, sl)}
    for name in ("cpu-shim", "torch-cpu"):
        if available(name):
            launch = mla.prepare_merge(po, pl, so, sl, threads=128)
            runners[name] = lambda name=name, launch=launch: mla.MERGE_KERNEL.run(name, launch)
    for name, run in runners.items():
        seconds = best_of(run)
        print(f"  {name:22s} {seconds * 1e3:8.1f} ms  {elements / seconds / 1e6:8.1f} M elements/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--rows", type=int, default=65_536)
    args = parser.parse_args()
    check_rates("mla-chunks", args.examples)
    throughput(args.rows)


if __name__ == "__main__":
    main()
