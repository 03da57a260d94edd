"""Benchmark the kv-offload worker mapping: property examples/s, the swap kernel per backend, the ASan catch, and
the conform targets against vLLM 0.33.0's own handler.

    python benchmarks/bench_offload_swap.py [--examples N] [--json]

* `properties`: each worker-mapping property of the model on N derandomized cases (case checks per second).
* `kernel`: `offload_swap_differential` on the same N cases per available backend (torch-cpu, cpu-shim,
  torch-cuda, cupy-cuda; the shim build is made before timing), and `offload_swap_round_trip`.
* `asan`: seconds from starting the ASan child on the planted skip_count store to its heap-buffer-overflow
  report (the g++ ASan build made before timing), and the ASan differential run inside the child.
* `conform`: `offload_transfer_async` and `offload_get_finished` on vLLM 0.33.0 (compared inputs per second).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from kvsim.app.oracle import run_kernel_property
from kvsim.engine.registry import REGISTRY, Registry
from kvsim.gpu_oracle.kernels import offload_swap as family
from kvsim.gpu_oracle.kernels.offload_swap import properties as kernel_props
from kvsim.gpu_oracle.kernels.offload_swap import strategies as kernel_strategies
from kvsim.gpu_oracle.kernels.offload_swap.backends import case_document
from kvsim.gpu_oracle.kernels.offload_swap.cases import GEOMETRY, skip_cases
from kvsim.gpu_oracle.runtime import asan, build, discovery
from kvsim.models.kv_offload import DESCRIPTOR
from kvsim.properties.kv_offload import mapping as props
from kvsim.properties.kv_offload import mapping_strategies as strategies


def draw(strategy: Any, n: int) -> list[Any]:
    cases: list[Any] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def keep(case: Any) -> None:
        cases.append(case)

    keep()
    return cases[:n]


def rate(fn: Any, cases: list[Any], *args: Any) -> dict[str, Any]:
    started = time.perf_counter()
    for case in cases:
        fn(case, None, *args)
    seconds = time.perf_counter() - started
    return {"examples": len(cases), "seconds": round(seconds, 3), "per_second": round(len(cases) / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = args.examples
    out: dict[str, Any] = {"properties": {}, "kernel": {}, "asan": {}, "conform": {}}

    for prop, strategy in ((props.transfer_job_offsets_disjoint_inside_primary_view, strategies.TRANSFER_JOBS),
                           (props.worker_mapping_is_a_bijection_with_page_bytes, strategies.SWAP_CASES),
                           (props.round_trip_gpu_cpu_gpu_is_identity, strategies.SWAP_CASES),
                           (props.transfer_jobs_finish_in_submission_order, strategies.QUEUE_CASES)):
        out["properties"][prop.name] = rate(prop, draw(strategy, n))

    build.build_shim("offload_swap")
    swaps, partial = draw(kernel_strategies.SWAPS, n), draw(kernel_strategies.PARTIAL_FIRST_SWAPS, n)
    for backend in ("torch-cpu", "cpu-shim", "torch-cuda", "cupy-cuda"):
        if not discovery.available(backend):
            out["kernel"][backend] = {"skipped": discovery.probe(backend)[1]}
            continue
        out["kernel"][backend] = {"differential": rate(kernel_props.offload_swap_differential, swaps, backend),
                                  "round_trip": rate(kernel_props.offload_swap_round_trip, partial, backend)}

    if discovery.available("cpu-shim-asan"):
        build.build_shim("offload_swap", asan=True)
        planted = skip_cases()[1]
        started = time.perf_counter()
        child = asan.run_case("offload_swap", case_document(GEOMETRY, True, planted.segments, *planted.buffers()))
        out["asan"]["seconds_to_catch_planted_skip_count"] = round(time.perf_counter() - started, 3)
        out["asan"]["report"] = str(child.report)
        if "kv-offload" not in REGISTRY.models:
            REGISTRY.add_model(DESCRIPTOR)
        registry = Registry()
        registry.add_model(DESCRIPTOR)
        family.register(registry)
        prop = registry.property("kv-offload", "offload_swap_differential")
        started = time.perf_counter()
        result = run_kernel_property(prop, "cpu-shim-asan", max_examples=n, seed=0)
        seconds = time.perf_counter() - started
        out["asan"]["differential"] = {"status": result.status, "examples": result.examples,
                                       "seconds_with_child": round(seconds, 3),
                                       "per_second": round(result.examples / seconds, 1)}

    from kvsim.conform.source import resolve_source
    from kvsim.conform.targets import RunOptions
    from kvsim.conform.vllm.offload_mapping import TARGETS

    source = resolve_source("vllm", version="0.33.0")
    for target in TARGETS:
        result = target.run(source, RunOptions(max_examples=n))
        out["conform"][target.name] = {"status": result.status, "compared": result.compared,
                                       "seconds": result.seconds,
                                       "per_second": round(result.compared / max(result.seconds, 1e-9), 1)}

    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    for section, rows in out.items():
        print(section)
        for name, row in rows.items():
            print(f"  {name}: {row}")


if __name__ == "__main__":
    main()
