"""gpu_oracle: backend discovery, the zeroing kernel on each CPU backend, and the differential checks."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from oraclehelp import fake_cupy, mutant_kernels

import kvsim.gpu_oracle as gpu_oracle
from kvsim.gpu_oracle.runtime import discovery as backends_module
from kvsim.gpu_oracle.runtime import build
from kvsim.gpu_oracle.kernels.zero_kv_blocks import backends as zeroing
from kvsim.gpu_oracle.runtime import checks as gpu_oracle_checks
from kvsim.gpu_oracle.runtime.checks import CHECKS, run_check
from kvsim.engine.errors import ConfigError
from kvsim.models.kv_zeroing.zeroer import Segment, SegmentTable, plan_segments, zero_blocks
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import deepseek_v4_geometry, last_block_page_geometry, non_uniform_pages_geometry

CPU_BACKENDS = [name for name in ("torch-cpu", "cpu-shim") if backends_module.available(name)]
REPO = Path(__file__).resolve().parent.parent


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


# --- discovery --------------------------------------------------------------------------------------

def test_backends_report_every_backend_with_a_reason() -> None:
    rows = gpu_oracle.backends()
    assert [r["name"] for r in rows] == list(gpu_oracle.BACKEND_NAMES)
    for row in rows:
        assert set(row) == {"name", "available", "reason"}
        assert isinstance(row["available"], bool) and row["reason"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["torch-cpu"]["available"], by_name["torch-cpu"]["reason"]  # torch is a test dependency here
    if not _has_cuda():
        assert not by_name["torch-cuda"]["available"] and not by_name["cupy-cuda"]["available"]


def test_a_failing_probe_is_a_reason_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("cudaErrorInsufficientDriver")

    monkeypatch.setattr(backends_module, "_cache", {})
    monkeypatch.setitem(backends_module.PROBES, "cupy-cuda", broken)
    monkeypatch.setattr(build, "find_compiler", lambda: None)
    by_name = {r["name"]: r for r in gpu_oracle.backends()}
    assert by_name["cupy-cuda"] == {"name": "cupy-cuda", "available": False,
                                    "reason": "RuntimeError: cudaErrorInsufficientDriver"}
    assert not by_name["cpu-shim"]["available"] and "no C++ compiler" in by_name["cpu-shim"]["reason"]


def test_build_goes_to_the_cache_and_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path))
    first = build.build_shim("zero_kv_blocks")
    assert first.parent == tmp_path / "gpu_oracle" and first.exists()
    assert build.build_shim("zero_kv_blocks") == first  # same sources, same key, no rebuild
    assert not list((REPO / "gpu_oracle").rglob("*.so"))


def test_a_kernel_that_does_not_compile_is_a_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    broken = tmp_path / "kernels"
    shutil.copytree(build.KERNEL_DIR, broken)
    build.kernel_source("zero_kv_blocks", broken).write_text("extern \"C\" __global__ void zero_kv_blocks( { }\n")
    with pytest.raises(build.BuildError, match="zero_kv_blocks"):
        build.build_shim("zero_kv_blocks", kernel_dir=broken)


# --- the kernel on the CPU backends ------------------------------------------------------------------

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("chunk_width", [None, 1, 3, 1024])
def test_last_block_page_on_the_backend(backend: str, chunk_width: int | None) -> None:
    backing = np.ones((4, 12), dtype=np.int32)
    table = SegmentTable((Segment(addr=12, block_stride=12, page=4),), num_blocks=4)
    out = gpu_oracle.zero_kv_blocks(backend, backing.view(np.uint8).reshape(-1), table, [3],
                                    chunk_width=chunk_width).view(np.int32).reshape(4, 12)
    expected = np.ones((4, 12), dtype=np.int32)
    expected[3, 3:7] = 0
    assert np.array_equal(out, expected)
    assert (backing == 1).all()  # the input is not modified


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("variant", ["fixed", "pre_d6af803"])
@pytest.mark.parametrize("geometry, ids", [(deepseek_v4_geometry(), (5, 99)), (non_uniform_pages_geometry(), (1, 2))],
                         ids=["deepseek-v4", "non-uniform"])
def test_pinned_geometries_match_the_reference(backend: str, variant: str, geometry: KVCacheGeometry,
                                               ids: tuple[int, ...]) -> None:
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, variant, arena=arena)
    memory = np.random.default_rng(1).integers(1, 256, arena.size, dtype=np.uint8)
    expected = memory.copy()
    zero_blocks(expected, table, ids)
    for chunk_width in (None, 7):  # 7 divides none of these pages
        assert np.array_equal(gpu_oracle.zero_kv_blocks(backend, memory, table, ids, chunk_width=chunk_width),
                              expected)


@pytest.mark.parametrize("kwargs, field", [
    ({"chunk_width": 0}, "chunk_width"), ({"chunk_width": 1025}, "chunk_width"), ({"block_ids": [4]}, "block_ids[0]"),
    ({"memory": np.zeros(64, dtype=np.uint8)}, "memory"), ({"memory": np.zeros(48, dtype=np.int32)}, "memory"),
    ({"backend": "triton"}, "backend"),
])
def test_zero_kv_blocks_rejects_bad_launches(kwargs: dict, field: str) -> None:
    args = {"backend": "torch-cpu", "memory": np.zeros(192, dtype=np.uint8), "block_ids": [3], **kwargs}
    table = SegmentTable((Segment(addr=12, block_stride=12, page=4),), num_blocks=4)
    chunk = args.pop("chunk_width", None)
    with pytest.raises(ConfigError) as info:
        gpu_oracle.zero_kv_blocks(args["backend"], args["memory"], table, args["block_ids"], chunk_width=chunk)
    assert info.value.field == field


# --- the checks ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("check", ["zero_kv_blocks.differential", "zero_kv_blocks.sentinel"])
def test_zeroing_checks_pass_on_the_cpu_backends(backend: str, check: str) -> None:
    outcome = run_check(CHECKS[check], backend, max_examples=40, seed=0)
    assert outcome.status == "passed", outcome.message
    assert outcome.examples >= 12


def test_differential_check_catches_an_off_by_one_mask_in_the_cuda_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    assert "if (word >= seg_page_sizes[seg])" in build.kernel_source("zero_kv_blocks").read_text()
    mutant = mutant_kernels(tmp_path, "zero_kv_blocks.cu", "word >= seg_page_sizes", "word > seg_page_sizes")
    lib = zeroing.shim_library(False, mutant)
    monkeypatch.setitem(zeroing.BACKENDS, "cpu-shim", lambda m, launch, a: zeroing._cpu_shim(m, launch, lib))
    outcome = run_check(CHECKS["zero_kv_blocks.differential"], "cpu-shim", max_examples=100, seed=0)
    assert outcome.status == "failed"
    assert "bytes differing from the reference memset on cpu-shim: expected 0, got 4" in outcome.message
    sentinel = run_check(CHECKS["zero_kv_blocks.sentinel"], "cpu-shim", max_examples=1, seed=0)
    assert sentinel.status == "failed" and "changed from the sentinel outside them" in sentinel.message


def test_sentinel_check_names_the_clobbered_neighbour(monkeypatch: pytest.MonkeyPatch) -> None:
    original = zeroing.BACKENDS["torch-cpu"]

    def one_word_too_many(memory, launch, arena):  # type: ignore[no-untyped-def]
        return original(memory, zeroing.Launch(launch.addrs, launch.strides, launch.pages + 1, launch.ids,
                                               launch.chunk_width, launch.max_chunks), arena)

    monkeypatch.setitem(zeroing.BACKENDS, "torch-cpu", one_word_too_many)
    outcome = run_check(CHECKS["zero_kv_blocks.sentinel"], "torch-cpu", max_examples=1, seed=0)
    assert outcome.status == "failed"
    assert outcome.message.startswith("last block page (4, 12) int32, chunk width None: bytes changed from the "
                                      "sentinel outside them: expected 0, got 4")


def test_oracle_report_runs_every_check_and_skips_what_is_missing() -> None:
    seen: list[str] = []
    report = gpu_oracle.oracle_report(max_examples=15, seed=0, progress=seen.append)
    assert set(report) == {"backends", "checks"}
    available = {b["name"]: b for b in report["backends"]}
    rows = {(c["name"], c["backend"]): c for c in report["checks"]}
    for check in CHECKS.values():
        for backend in check.backends:
            row = rows[(check.name, backend)]
            assert {"name", "backend", "examples", "status", "message"} <= set(row)
            if available[backend]["available"]:
                assert row["status"] == "passed", row["message"]
                assert row["examples"] > 0
            else:
                assert row["status"] == "skipped" and row["message"] == available[backend]["reason"]
    if not _has_cuda():
        assert rows[("zero_kv_blocks.differential", "cupy-cuda")]["status"] == "skipped"
        assert rows[("zero_kv_blocks.differential", "torch-cuda")]["status"] == "skipped"
    assert any("zero_kv_blocks.differential on torch-cpu" in line for line in seen)


def test_disabled_backends_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSIM_ORACLE_DISABLE", "cpu-shim,cpu-shim-asan")
    monkeypatch.setattr(gpu_oracle_checks, "CHECKS", {"zero_kv_blocks.sentinel": CHECKS["zero_kv_blocks.sentinel"]})
    report = gpu_oracle.oracle_report(max_examples=5)
    shim = next(c for c in report["checks"] if c["backend"] == "cpu-shim")
    assert shim["status"] == "skipped" and "KVSIM_ORACLE_DISABLE" in shim["message"]


# --- the CuPy path, driven through a stand-in that runs the launch on the CPU shim ------------------------

def test_cupy_backend_launch_is_well_formed(monkeypatch: pytest.MonkeyPatch) -> None:
    if build.find_compiler() is None:
        pytest.skip("the stand-in runs the launch on the CPU shim")
    calls: list = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(calls, lambda name: zeroing.shim_library(False)))
    zeroing._cupy_kernel.cache_clear()
    try:
        geometry = last_block_page_geometry()
        arena = Arena.for_geometry(geometry)
        table = plan_segments(geometry, arena=arena)
        memory = np.full(arena.size, 0xA5, dtype=np.uint8)
        expected = memory.copy()
        zero_blocks(expected, table, [0, 3])
        got = gpu_oracle.zero_kv_blocks("cupy-cuda", memory, table, [0, 3], chunk_width=3)
    finally:
        zeroing._cupy_kernel.cache_clear()
    assert np.array_equal(got, expected)
    assert calls == [("zero_kv_blocks", (2, 1, 2), (3,), ["DeviceArray[uint64]"] + ["DeviceArray[int64]"] * 3)]
