"""Kernel properties of the offload swap against model `kv-offload` (research note vllm.md 3.3.8).

* `offload_swap_differential`: random geometries and transfers in both directions; the dst tensors after the
  backend's swap equal the model's `apply_swap(plan_swap(...))` bit for bit (untouched bytes included).
* `offload_swap_round_trip`: every non-empty group starting inside a chunk (a partial first chunk); a store
  then a load into other GPU blocks, both through the backend, gives the model's bytes on both sides and the
  transferred pages back unchanged.
* `offload_swap_asan_catches_planted_skip_count`: the segment of a group whose last chunk is full, with the CPU
  side's skip_count planted one too high, stops the ASan build with a heap-buffer-overflow READ in
  offload_swap.cu (one id past the chunk list), for a store and a load; the unplanted segment runs clean with
  the reference bytes, and a planted one that stays inside its list runs clean with other bytes (a silent
  shift ASan cannot see: the differential's job).

The kernel has no variants: the properties hold on every variant of the model (the variant is not read).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kernel_property
from kvsim.models.kv_offload.mapping import apply_swap, plan_swap
from kvsim.properties.kv_offload.mapping import SwapCase

from ...runtime import asan
from ...runtime.discovery import BACKEND_NAMES
from .backends import case_document, offload_swap
from .cases import GEOMETRY, SkipCase

MODEL = "kv-offload"


def _differ(what: str, expected: list[np.ndarray], got: list[np.ndarray]) -> None:
    for t, (a, b) in enumerate(zip(expected, got)):
        if a.shape != b.shape:
            raise PropertyViolation(f"{what}, tensor {t}: expected {a.size} bytes, got {b.size}")
        bad = np.flatnonzero(a != b)
        if bad.size:
            raise PropertyViolation(f"{what}, tensor {t}: {bad.size} bytes differ, first at byte {bad[0]}: "
                                    f"model {a[bad[0]]}, backend {b[bad[0]]}")


@kernel_property(model=MODEL, strategy="SWAPS", backends=BACKEND_NAMES)
def offload_swap_differential(case: tuple[SwapCase, bool, int], variant: Any, backend: str) -> None:
    """For random geometries (1-3 tensors, padded pages and CPU rows, 1-3 groups, blocks_per_chunk 1-8, partial
    first and last chunks), either direction and odd thread counts, every dst tensor after the backend's batched
    swap equals the model's apply_swap of plan_swap bit for bit, the bytes no triple names included."""
    swap, gpu_to_cpu, threads = case
    src, dst = swap.buffers(gpu_to_cpu, 1), swap.buffers(not gpu_to_cpu, 2)
    want = apply_swap(plan_swap(swap.geometry, swap.spec, gpu_to_cpu), src, dst)
    got = offload_swap(backend, swap.geometry, swap.spec, gpu_to_cpu, src, dst, threads=threads)
    _differ(f"{'store' if gpu_to_cpu else 'load'} on {backend}", want, got)


@kernel_property(model=MODEL, strategy="PARTIAL_FIRST_SWAPS", backends=BACKEND_NAMES)
def offload_swap_round_trip(case: tuple[SwapCase, int], variant: Any, backend: str) -> None:
    """For geometries whose every group starts inside a chunk, a GPU->CPU store and a CPU->GPU load into other
    GPU blocks, both by the backend, leave the model's bytes on the CPU and on the GPU, and every load block
    holds its store block's first page_size_bytes."""
    swap, threads = case
    g = swap.geometry
    gpu, cpu, gpu_after = swap.buffers(True, 1), swap.buffers(False, 2), swap.buffers(True, 3)
    cpu_model = apply_swap(plan_swap(g, swap.spec, True), gpu, cpu)
    cpu_got = offload_swap(backend, g, swap.spec, True, gpu, cpu, threads=threads)
    _differ(f"CPU chunks after the store on {backend}", cpu_model, cpu_got)
    gpu_model = apply_swap(plan_swap(g, swap.load_spec, False), cpu_model, gpu_after)
    gpu_got = offload_swap(backend, g, swap.load_spec, False, cpu_got, gpu_after, threads=threads)
    _differ(f"GPU blocks after the load on {backend}", gpu_model, gpu_got)
    first = 0
    for group, size in enumerate(swap.spec.group_sizes):
        for ref in g.group_data_refs[group]:
            t, page, n = ref.tensor_idx, g.gpu_page_bytes[ref.tensor_idx], ref.page_size_bytes
            for src, dst in zip(swap.spec.block_ids[first:first + size], swap.load_block_ids[first:first + size]):
                if not np.array_equal(gpu[t][src * page:src * page + n], gpu_got[t][dst * page:dst * page + n]):
                    raise PropertyViolation(f"group {group}, tensor {t}: GPU block {dst} after the round trip on "
                                            f"{backend}: expected block {src}'s {n} bytes, got others")
        first += size


@kernel_property(model=MODEL, strategy="SKIP_CASES", backends=("cpu-shim-asan",), asan_in_child=False)
def offload_swap_asan_catches_planted_skip_count(case: SkipCase, variant: Any, backend: str) -> None:
    """Blocks per chunk 4, a group from logical block 2 (skip_count 2): with the CPU side's skip_count planted
    at 3, the six-block group (last chunk full) stops the ASan build with a heap-buffer-overflow READ in
    offload_swap.cu on a store and on a load; the unplanted store runs clean with the model's bytes, and the
    planted five-block store runs clean with other bytes than the model's."""
    segments = case.segments
    bpc = GEOMETRY.blocks_per_chunk
    ids = [(s.dst_ids, s.dst_skip) if case.gpu_to_cpu else (s.src_ids, s.src_skip) for s in segments]
    reads_past = any((skip + s.count - 1) // bpc >= len(chunks) for s, (chunks, skip) in zip(segments, ids))
    if reads_past != case.overrun:
        raise PropertyViolation(f"{case.what}: expected the segments to {'read past' if case.overrun else 'stay in'} "
                                f"their chunk list, got the opposite")
    src, dst = case.buffers()
    child = asan.run_case("offload_swap", case_document(GEOMETRY, case.gpu_to_cpu, segments, src, dst))
    if case.overrun:
        asan.expect_overflow(case.what, child, "READ", "offload_swap.cu")
        return
    reference = np.concatenate(apply_swap(plan_swap(GEOMETRY, case.spec, case.gpu_to_cpu), src, dst))
    if not case.planted:
        asan.expect_clean(case.what, child, reference)
    elif not child.clean or child.output is None or child.output["sha256"] == asan.sha256(reference):
        raise PropertyViolation(f"{case.what}: expected a clean run with bytes other than the model's (a silent "
                                f"shift), got {child.explain()}")
