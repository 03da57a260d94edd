"""gpu_oracle for the SGLang PD staging path: gather and scatter kernels on every CPU backend, their kernel
properties against the pd-staging model, the ASan check of the pre-05c7ebf slot overrun, and planted kernel faults."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from oraclehelp import caught, fake_cupy, kernel_properties, run

import kvsim.gpu_oracle as gpu_oracle
from kvsim.engine.errors import ConfigError
from kvsim.gpu_oracle.kernels.staging import backends as staging
from kvsim.gpu_oracle.kernels.staging.backends import case_document
from kvsim.gpu_oracle.kernels.staging.cases import overrun_cases
from kvsim.gpu_oracle.runtime import asan, build, discovery, shim
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging.copy import gather_head_slice_to_staging, scatter_staging_to_pages
from kvsim.models.pd_staging.layout import HeadReshard, compute_staging_layout

CPU_BACKENDS = [name for name in ("torch-cpu", "cpu-shim") if discovery.available(name)]
needs_shim = pytest.mark.skipif(build.find_compiler() is None, reason="no C++ compiler")
needs_asan = pytest.mark.skipif(not discovery.available("cpu-shim-asan"),
                                reason=f"cpu-shim-asan unavailable: {discovery.probe('cpu-shim-asan')[1]}")
KERNELS = ("staging_gather_head_slice", "staging_scatter")
PROPERTY_NAMES = ("staging_gather_head_slice_differential", "staging_scatter_differential")


def _line(kernel: str, text: str) -> int:
    lines = build.kernel_source(kernel.removesuffix(".cu")).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _writer(res: HeadReshard, decode_rank: int, w: int):  # type: ignore[no-untyped-def]
    return layout.writers_of_decode_rank(res, decode_rank)[w][1]


def _bits(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).view(dtype).reshape(shape)


def test_kernels_are_picked_up_by_nvcc_and_the_asan_prebuild() -> None:
    names = {k.name for k in build.kernel_files()}
    assert {f"{k}.cu" for k in KERNELS} <= names
    assert set(KERNELS) <= set(build.shim_kernels())
    for kernel in KERNELS:  # NVRTC-ready: no includes, no shared memory, no barriers or warp intrinsics
        source = build.kernel_source(kernel).read_text()
        for banned in ("#include", "__shared__", "__syncthreads", "__shfl"):
            assert banned not in source
    props = kernel_properties()
    for name in (*PROPERTY_NAMES, "staging_gather_head_slice_asan_catches_slot_overrun",
                 "decode_kv_through_kernels_matches_single_server"):
        assert props[name].model == "pd-staging"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_llama_pairing_round_trips_through_the_backend(backend: str) -> None:
    """Prefill TP 4 -> decode TP 2, H = 8: both writers of decode rank 1 gathered, then scattered, bit for bit."""
    res = HeadReshard(8, 4, 2)
    slot_layout = compute_staging_layout(res, 1, 3 * 4, 2, 2 * 8)
    prefill = _bits((2, 2, 5, 4, 2, 8), "float16", 0)  # NaN payloads included
    decode = _bits((2, 2, 6, 4, 4, 8), "float16", 1)
    slot = np.zeros(slot_layout.total_bytes, np.uint8)
    want_slot, want_pool = slot.copy(), decode.copy()
    for w in range(2):
        params = _writer(res, 1, w)
        slot = gpu_oracle.gather_head_slice(backend, prefill, [4, 0, 2], params, slot_layout, slot)
        gather_head_slice_to_staging(prefill, [4, 0, 2], params, slot_layout, want_slot)
        decode = gpu_oracle.scatter_staging(backend, decode, slot, [5, 1, 3], params, slot_layout)
        scatter_staging_to_pages(want_pool, want_slot, [5, 1, 3], params, slot_layout)
    assert slot.tobytes() == want_slot.tobytes() and decode.tobytes() == want_pool.tobytes()
    # writer 1 (prefill rank 3) holds global heads 6, 7: local heads 2, 3 of decode rank 1
    assert np.array_equal(decode[:, :, [5, 1, 3], :, 2:].view(np.uint16), prefill[:, :, [4, 0, 2]].view(np.uint16))


def test_backends_refuse_what_the_reference_refuses() -> None:
    res = HeadReshard(8, 1, 4)
    lay = compute_staging_layout(res, 0, 4, 1, 2)
    pool = _bits((1, 2, 3, 2, 8, 1), "float16", 0)
    with pytest.raises(ConfigError, match="staging"):
        gpu_oracle.gather_head_slice("torch-cpu", pool, [0, 1], _writer(res, 0, 0), lay, np.zeros(8, np.uint8))
    with pytest.raises(ConfigError, match="backend"):
        gpu_oracle.gather_head_slice("tpu", pool, [0, 1], _writer(res, 0, 0), lay)
    with pytest.raises(ConfigError, match="cpu-shim-asan"):
        staging.GATHER_KERNEL.library(asan=True)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_properties_pass_on_the_cpu_backends(backend: str, name: str) -> None:
    result = run(name, backend, max_examples=60)
    assert result.status == "passed", result.message
    assert result.examples >= 60


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_end_to_end_transfer_through_the_kernels_matches_a_single_server(backend: str) -> None:
    """The e2e property with both copies done by the backend: Llama-3.1-8B cases and random rooms."""
    result = run("decode_kv_through_kernels_matches_single_server", backend, max_examples=40)
    assert result.status == "passed" and result.examples >= 40, result.message
    failed = run("decode_kv_through_kernels_matches_single_server", backend, max_examples=200, variant="pre_05c7ebf")
    assert failed.status == "failed" and "decode rank" in failed.message


# --- planted kernel faults ---------------------------------------------------------------------------------

@needs_shim
def test_gather_check_catches_a_kernel_that_ignores_the_source_head(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """P_tp <= D_tp picks the decode rank's heads out of the prefill rank's: starting at head 0 is wrong."""
    result = caught(monkeypatch, tmp_path, staging.GATHER_KERNEL, "+ (long long)src_head_start * head_stride", "",
                    "staging_gather_head_slice_differential", max_examples=200)
    assert "staging bytes after the gather on cpu-shim" in result.message
    assert result.examples < 200


@needs_shim
def test_scatter_check_catches_k_and_v_swapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = caught(monkeypatch, tmp_path, staging.SCATTER_KERNEL, "const long long which = region / num_layers;",
                    "const long long which = 1 - region / num_layers;", "staging_scatter_differential",
                    max_examples=200)
    assert "decode pool after the scatter on cpu-shim" in result.message


# --- AddressSanitizer -----------------------------------------------------------------------------------------

@needs_asan
def test_asan_stops_the_pre_fix_multi_slot_send_at_the_faulting_store() -> None:
    fixed, pre, pre_scatter = overrun_cases()
    assert (fixed.overrun, pre.overrun, pre_scatter.kernel) == (False, True, "scatter")
    pool, pages, params, sent, slot = fixed.pool, fixed.pages, fixed.params, fixed.sent, fixed.slot
    old_pool, old_pages, old_sent, decode_pool = pre.pool, pre.pages, pre.sent, pre_scatter.pool
    clean = asan.run_case("staging", case_document("gather", pool, pages, params, sent, slot, 0))
    assert clean.clean and clean.output["nbytes"] == 1024 == len(slot)  # 16 pages x 16 rows x 2 heads x K, V
    child = asan.run_case("staging", case_document("gather", old_pool, old_pages, params, old_sent, slot, 0))
    assert child.returncode == asan.ASAN_EXIT_CODE and child.output is None and child.report is not None
    assert (child.report.kind, child.report.access, child.report.size) == ("heap-buffer-overflow", "WRITE", 1)
    assert child.report.line == _line("staging_gather_head_slice.cu", "dst[i] = src[")
    assert child.report.region == "0 bytes to the right of 1024-byte region"  # the slot
    child = asan.run_case("staging", case_document("scatter", decode_pool, old_pages, params, old_sent, slot, 0))
    assert child.report is not None and (child.report.access, child.report.size) == ("READ", 1)
    assert child.report.line == _line("staging_scatter.cu", "= src[i];")


@needs_asan
def test_properties_run_inside_the_asan_child() -> None:
    for name in PROPERTY_NAMES:
        result = run(name, "cpu-shim-asan", max_examples=30)
        assert result.status == "passed" and result.examples >= 30, result.message
    result = run("staging_gather_head_slice_asan_catches_slot_overrun", "cpu-shim-asan", max_examples=10)
    assert result.status == "passed" and result.examples == 3, result.message
    assert [c.what for c in overrun_cases()] == ["fixed send 0 (16 pages, chunk 0) gathered into slot 0",
                                                 "pre_05c7ebf send 0 (54 pages, chunk 0) gathered into slot 0",
                                                 "pre_05c7ebf send 0 (54 pages, chunk 0) scattered from slot 0"]


# --- the CuPy path, through a stand-in that runs each launch on the CPU shim ----------------------------------

@needs_shim
def test_cupy_launches_are_well_formed(monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list = []
    kernels = {k.name: k for k in (staging.GATHER_KERNEL, staging.SCATTER_KERNEL)}
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(launches, lambda name: kernels[name].library()))
    shim.cupy_function.cache_clear()
    res = HeadReshard(8, 4, 2)
    lay = compute_staging_layout(res, 0, 2 * 2, 3, 4)
    pool, decode = _bits((3, 2, 4, 2, 2, 2), "float16", 3), _bits((3, 2, 4, 2, 4, 2), "float16", 4)
    params = _writer(res, 0, 1)
    try:
        got = gpu_oracle.gather_head_slice("cupy-cuda", pool, [3, 1], params, lay)
        pool_after = gpu_oracle.scatter_staging("cupy-cuda", decode, got, [0, 2], params, lay)
    finally:
        shim.cupy_function.cache_clear()
    want = gather_head_slice_to_staging(pool, [3, 1], params, lay)
    assert got.tobytes() == want.tobytes()
    assert pool_after.tobytes() == scatter_staging_to_pages(decode.copy(), want, [0, 2], params, lay).tobytes()
    assert [launch[:3] for launch in launches] == [("staging_gather_head_slice", (4, 6), (128,)),
                                                   ("staging_scatter", (4, 6), (128,))]
    assert launches[0][3] == ["DeviceArray[uint8]"] * 2 + ["DeviceArray[int32]"] + ["int64"] * 6 + ["int32"] * 5
