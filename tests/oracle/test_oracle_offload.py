"""gpu_oracle for vLLM's KV offload swap: the batched GPU<->CPU swap kernel on every CPU backend, its kernel
properties against the kv-offload mapping, planted kernel faults, the ASan catch of a planted skip_count, and the
CuPy launch through a stand-in."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from oraclehelp import fake_cupy, plant

from kvsim.app.oracle import run_kernel_property
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.registry import REGISTRY, Registry
from kvsim.gpu_oracle.kernels import offload_swap as family
from kvsim.gpu_oracle.kernels.offload_swap.backends import KERNEL, case_document, offload_swap
from kvsim.gpu_oracle.kernels.offload_swap.cases import GEOMETRY, skip_cases
from kvsim.gpu_oracle.runtime import asan, build, discovery, shim
from kvsim.models.kv_offload import DESCRIPTOR
from kvsim.models.kv_offload.mapping import DataRef, SwapGeometry, TransferSpec, apply_swap, plan_swap

CPU_BACKENDS = [name for name in ("torch-cpu", "cpu-shim") if discovery.available(name)]
needs_shim = pytest.mark.skipif(build.find_compiler() is None, reason="no C++ compiler")
needs_asan = pytest.mark.skipif(not discovery.available("cpu-shim-asan"),
                                reason=f"cpu-shim-asan unavailable: {discovery.probe('cpu-shim-asan')[1]}")
PROPERTY_NAMES = ("offload_swap_differential", "offload_swap_round_trip")
SOURCE = build.kernel_source("offload_swap")


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SOURCE.read_text().splitlines(), 1) if text in line)


def _properties() -> dict:
    """The family's kernel properties through a local registry (the runner resolves variants in REGISTRY)."""
    if "kv-offload" not in REGISTRY.models:
        REGISTRY.add_model(DESCRIPTOR)
    registry = Registry()
    registry.add_model(DESCRIPTOR)
    family.register(registry)
    return {p.name: p for p in registry.properties_of("kv-offload")}


def _run(name: str, backend: str, examples: int):  # type: ignore[no-untyped-def]
    return run_kernel_property(_properties()[name], backend, max_examples=examples, seed=0)


def _bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# two tensors (6- and 10-byte pages), 3 blocks per chunk, padded CPU rows; group 0 uses both tensors from logical
# block 4 (skip_count 1), group 1 tensor 0 from block 6 (aligned)
GEO = SwapGeometry((6, 10), 12, 5, 3, ((DataRef(0, 6), DataRef(1, 7)), (DataRef(0, 5),)), cpu_row_padding=4)
SPEC = TransferSpec(block_ids=(11, 2, 5, 7, 0, 9), group_sizes=(4, 2), block_indices=(4, 6), chunk_ids=(3, 0, 4))


def test_family_is_found_by_nvcc_the_asan_prebuild_and_the_registry() -> None:
    assert "offload_swap.cu" in {k.name for k in build.kernel_files()}
    assert "offload_swap" in build.shim_kernels()
    source = SOURCE.read_text()
    for banned in ("#include", "__shared__", "__syncthreads", "__shfl"):  # NVRTC-ready
        assert banned not in source
    assert family.FAMILY.model == "kv-offload" and family.FAMILY.kernels == (KERNEL,)
    props = _properties()
    assert sorted(props) == sorted((*PROPERTY_NAMES, "offload_swap_asan_catches_planted_skip_count"))
    assert props["offload_swap_asan_catches_planted_skip_count"].backends == ("cpu-shim-asan",)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_two_groups_two_tensors_through_the_backend(backend: str) -> None:
    store = plan_swap(GEO, SPEC, True)
    assert [(s.group, s.tensor_idx, s.dst_ids, s.dst_skip) for s in store.segments] == [
        (0, 0, (3, 0), 1), (0, 1, (3, 0), 1), (1, 0, (4,), 0)]
    gpu = [_bytes(GEO.gpu_bytes(t), t) for t in (0, 1)]
    cpu = [_bytes(GEO.cpu_bytes(t), 10 + t) for t in (0, 1)]
    got = offload_swap(backend, GEO, SPEC, True, gpu, cpu)
    want = apply_swap(store, gpu, cpu)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
    # block 11 (logical 4) is sub-block 1 of chunk 3 on tensor 1: row stride 3 * 10 + 4
    assert got[1][3 * 34 + 10:3 * 34 + 17].tobytes() == gpu[1][110:117].tobytes()
    assert got[1][3 * 34 + 17:3 * 34 + 20].tobytes() == cpu[1][3 * 34 + 17:3 * 34 + 20].tobytes()  # past the ref
    back = offload_swap(backend, GEO, SPEC, False, got, [np.zeros(GEO.gpu_bytes(t), np.uint8) for t in (0, 1)])
    assert back[0][66:72].tobytes() == gpu[0][66:72].tobytes()
    assert back[1][110:117].tobytes() == gpu[1][110:117].tobytes()


def test_backends_refuse_what_the_model_refuses() -> None:
    gpu = [np.zeros(GEO.gpu_bytes(t), np.uint8) for t in (0, 1)]
    cpu = [np.zeros(GEO.cpu_bytes(t), np.uint8) for t in (0, 1)]
    with pytest.raises(ConfigError, match="chunk_ids"):
        offload_swap("torch-cpu", GEO, TransferSpec(SPEC.block_ids, SPEC.group_sizes, SPEC.block_indices, (3, 0)),
                     True, gpu, cpu)
    with pytest.raises(ConfigError, match=r"dst_buffers\[1\]"):
        offload_swap("torch-cpu", GEO, SPEC, True, gpu, [cpu[0], cpu[1][:-1]])
    with pytest.raises(ConfigError, match="backend"):
        offload_swap("tpu", GEO, SPEC, True, gpu, cpu)
    with pytest.raises(ConfigError, match="cpu-shim-asan"):
        KERNEL.library(asan=True)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_properties_pass_on_the_cpu_backends(backend: str, name: str) -> None:
    result = _run(name, backend, 40)
    assert result.status == "passed" and result.examples >= 40, result.message


# --- planted kernel faults (safe ones: they stay inside the buffers) -----------------------------------------

@needs_shim
@pytest.mark.parametrize("old, new, name, match", [
    ("const long long dst_pos = seg[13] + k;", "const long long dst_pos = k;", "offload_swap_differential",
     "store on cpu-shim"),
    ("for (long long i = threadIdx.x; i < size; i += blockDim.x)",
     "for (long long i = threadIdx.x; i < size - 1; i += blockDim.x)", "offload_swap_round_trip",
     "after the store on cpu-shim"),
], ids=["ignores-dst-skip-count", "copy-one-byte-short"])
def test_kernel_properties_catch_planted_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str,
                                                new: str, name: str, match: str) -> None:
    plant(monkeypatch, tmp_path, KERNEL, old, new)
    result = _run(name, "cpu-shim", 200)
    assert result.status == "failed" and match in result.message, result.message
    assert result.examples < 200


# --- AddressSanitizer ---------------------------------------------------------------------------------------

@needs_asan
def test_asan_stops_a_planted_skip_count_one_past_the_chunk_list() -> None:
    fixed, store, load, silent = skip_cases()
    src, dst = fixed.buffers()
    clean = asan.run_case("offload_swap", case_document(GEOMETRY, True, fixed.segments, src, dst))
    assert clean.clean and clean.output["nbytes"] == GEOMETRY.cpu_bytes(0) == 96
    assert [s.dst_skip for s in store.segments] == [3] and store.segments[0].dst_ids == (2, 0)
    started = time.perf_counter()
    child = asan.run_case("offload_swap", case_document(GEOMETRY, True, store.segments, *store.buffers()))
    seconds = time.perf_counter() - started
    assert child.returncode == asan.ASAN_EXIT_CODE and child.output is None and child.report is not None
    assert (child.report.kind, child.report.access, child.report.size) == ("heap-buffer-overflow", "READ", 4)
    assert child.report.line == _line("+ (long long)dst_ids[")
    assert child.report.region == "0 bytes to the right of 8-byte region"  # two int32 chunk ids
    assert seconds > 0  # the figure goes to the report (benchmarks/bench_offload_swap.py), not an assertion
    child = asan.run_case("offload_swap", case_document(GEOMETRY, False, load.segments, *load.buffers()))
    assert child.report is not None and child.report.line == _line("+ (long long)src_ids[")
    child = asan.run_case("offload_swap", case_document(GEOMETRY, True, silent.segments, *silent.buffers()))
    reference = np.concatenate(apply_swap(plan_swap(GEOMETRY, silent.spec, True), *silent.buffers()))
    assert child.clean and child.output["sha256"] != asan.sha256(reference)  # a shift ASan cannot see


@needs_asan
def test_asan_property_and_the_differential_inside_the_asan_child() -> None:
    result = _run("offload_swap_asan_catches_planted_skip_count", "cpu-shim-asan", 10)
    assert result.status == "passed" and result.examples == 4, result.message
    for name in PROPERTY_NAMES:
        result = _run(name, "cpu-shim-asan", 20)
        assert result.status == "passed" and result.examples >= 20, result.message


@needs_asan
def test_the_asan_property_fails_when_asan_does_not_stop_the_planted_case(monkeypatch: pytest.MonkeyPatch) -> None:
    prop = _properties()["offload_swap_asan_catches_planted_skip_count"]
    fixed, store = skip_cases()[:2]
    prop.fn(store, None, "cpu-shim-asan")  # caught: the property holds
    clean = asan.run_case("offload_swap", case_document(GEOMETRY, True, fixed.segments, *fixed.buffers()))
    monkeypatch.setattr(asan, "run_case", lambda family_name, document: clean)
    with pytest.raises(PropertyViolation, match="expected an ASan heap-buffer-overflow READ in offload_swap.cu"):
        prop.fn(store, None, "cpu-shim-asan")


# --- the CuPy path, through a stand-in that runs each launch on the CPU shim ---------------------------------

@needs_shim
def test_cupy_launch_is_well_formed(monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(launches, lambda name: KERNEL.library()))
    shim.cupy_function.cache_clear()
    gpu = [_bytes(GEO.gpu_bytes(t), t) for t in (0, 1)]
    cpu = [_bytes(GEO.cpu_bytes(t), 10 + t) for t in (0, 1)]
    try:
        got = offload_swap("cupy-cuda", GEO, SPEC, True, gpu, cpu, threads=3)
    finally:
        shim.cupy_function.cache_clear()
    want = apply_swap(plan_swap(GEO, SPEC, True), gpu, cpu)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
    assert launches == [("offload_swap", (4 + 4 + 2,), (3,), ["DeviceArray[int64]", "int32"])]
