"""Benchmark the real upstream Triton kernels under the interpreter against our CUDA C through the CPU shim.

    python benchmarks/bench_conform_kernels.py [--examples N] [--json]

On the same N derandomized cases of each gpu_oracle strategy, prints kernel checks per second
(the case prepared, the kernel run, the bytes compared with the model) for:
  * `triton-interpreter`: the release's Triton kernel through its own launcher, in the
    `kvsim.conform.triton_child` child (TRITON_INTERPRET=1; the child's start-up is excluded,
    the JSON round trip is included, as `kvsim conform` pays it);
  * `cpu-shim`: our CUDA C of the same kernel, built with g++ (`kvsim.gpu_oracle`).
Kernels: vLLM's zeroing kernel, vLLM's Triton merge_attn_states, SGLang's staging gather.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

from kvsim.conform.source import resolve_source
from kvsim.conform.triton_child import KernelChild
from kvsim.conform.sglang import kernels as sglang_kernels
from kvsim.conform.vllm import kernels as vllm_kernels
from kvsim.gpu_oracle.kernels.mla_context.backends import merge_attn_states as shim_merge
from kvsim.gpu_oracle.kernels.mla_context.properties import merge_violation
from kvsim.gpu_oracle.kernels.staging.backends import gather_head_slice
from kvsim.gpu_oracle.kernels.zero_kv_blocks.backends import zero_kv_blocks
from kvsim.models.kv_zeroing.zeroer import zero_blocks
from kvsim.models.pd_staging.copy import gather_head_slice_to_staging
from kvsim.models.pd_staging.layout import HeadReshard


def draw(strategy: Any, n: int) -> list[Any]:
    cases: list[Any] = []

    def keep(case: Any) -> None:
        cases.append(case)

    settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=(Phase.generate,),
             suppress_health_check=list(HealthCheck))(given(strategy)(keep))()
    return cases[:n]


def shim_zero(case: Any) -> None:
    memory = case.memory()
    expected = memory.copy()
    zero_blocks(expected, case.table, case.block_ids)
    got = zero_kv_blocks("cpu-shim", memory, case.table, case.block_ids, arena=case.arena)
    assert (got == expected).all()


def shim_merge_check(case: Any) -> None:
    r = shim_merge("cpu-shim", case.prefix_output, case.prefix_lse, case.suffix_output, case.suffix_lse,
                   head_pad=case.head_pad, token_pad=case.token_pad, threads=case.threads, with_lse=case.with_lse)
    assert merge_violation(case, "cpu-shim", r.output, r.lse, r.padding_untouched) is None


def shim_gather(case: Any) -> None:
    pool = case.pool(HeadReshard(*case.reshard).src_per, 1)
    staging = case.staging()
    want = gather_head_slice_to_staging(pool, case.pages, case.params, case.layout, staging.copy(), case.offset)
    got = gather_head_slice("cpu-shim", pool, case.pages, case.params, case.layout, staging, case.offset,
                            threads=case.threads)
    assert want.tobytes() == got.tobytes()


def rate(cases: list[Any], check: Callable[[Any], Any]) -> float:
    check(cases[0])  # warm: build, JIT, first load
    started = time.perf_counter()
    for case in cases:
        assert not check(case)
    return len(cases) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    vllm, sglang = resolve_source("vllm", version="0.33.0"), resolve_source("sglang", version="0.5.23")
    rows = []
    with KernelChild(vllm) as vchild, KernelChild(sglang) as schild:
        plan = [
            ("vllm zero_kv_blocks", vllm_kernels.ZERO_KV_BLOCKS, vchild, shim_zero),
            ("vllm merge_attn_states", vllm_kernels.MERGE_ATTN_STATES, vchild, shim_merge_check),
            ("sglang staging gather", sglang_kernels.CHECKS[0], schild, shim_gather),
        ]
        for label, check, child, shim in plan:
            cases = draw(check.strategy(), args.examples)
            interp = rate(cases, lambda c, check=check, child=child: check.compare(child, c))
            native = rate(cases, shim)
            rows.append({"kernel": label, "cases": len(cases), "triton_interpreter_per_s": round(interp, 1),
                         "cpu_shim_per_s": round(native, 1), "shim_over_interpreter": round(native / interp, 2)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'kernel':28} {'cases':>5} {'interpreter/s':>14} {'cpu-shim/s':>11} {'ratio':>6}")
    for r in rows:
        print(f"{r['kernel']:28} {r['cases']:>5} {r['triton_interpreter_per_s']:>14} {r['cpu_shim_per_s']:>11} "
              f"{r['shim_over_interpreter']:>6}")


if __name__ == "__main__":
    main()
