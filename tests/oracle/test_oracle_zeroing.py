"""gpu_oracle: backend discovery, the zeroing kernel on each CPU backend, its kernel properties, and the oracle
report (`kvsim.app.oracle`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from oraclehelp import caught, fake_cupy, kernel_properties, run

import kvsim.gpu_oracle as gpu_oracle
from kvsim.app import oracle
from kvsim.engine.errors import ConfigError
from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels.zero_kv_blocks import backends as zeroing
from kvsim.gpu_oracle.runtime import build, family, shim
from kvsim.gpu_oracle.runtime import discovery as backends_module
from kvsim.models.kv_zeroing import DESCRIPTOR
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import deepseek_v4_geometry, last_block_page_geometry, non_uniform_pages_geometry
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.models.kv_zeroing.zeroer import Segment, SegmentTable, ZeroingVariant, plan_segments, zero_blocks

CPU_BACKENDS = [name for name in ("torch-cpu", "cpu-shim") if backends_module.available(name)]
REPO = Path(__file__).resolve().parents[2]


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
@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
@pytest.mark.parametrize("geometry, ids", [(deepseek_v4_geometry(), (5, 99)), (non_uniform_pages_geometry(), (1, 2))],
                         ids=["deepseek-v4", "non-uniform"])
def test_pinned_geometries_match_the_reference(backend: str, variant: ZeroingVariant, geometry: KVCacheGeometry,
                                               ids: tuple[int, ...]) -> None:
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, variant=variant, arena=arena)
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


# --- the kernel properties ----------------------------------------------------------------------------

def test_kernel_properties_are_properties_of_the_model() -> None:
    props = kernel_properties()
    for name in ("zero_kv_blocks_differential", "zero_kv_blocks_sentinel", "zero_kv_blocks_asan_catches_pre_d6af803"):
        assert props[name].model == "kv-zeroing" and props[name].is_kernel and props[name].doc
    assert props["zero_kv_blocks_differential"].backends == gpu_oracle.BACKEND_NAMES
    assert props["zero_kv_blocks_asan_catches_pre_d6af803"].backends == ("cpu-shim-asan",)
    zeroing_family = family.family("zero_kv_blocks")
    assert zeroing_family.model == "kv-zeroing" and [k.name for k in zeroing_family.kernels] == ["zero_kv_blocks"]


def test_a_family_registers_into_its_models_catalog() -> None:
    registry = Registry()
    registry.add_model(DESCRIPTOR)
    family.family("zero_kv_blocks").register(registry)
    assert [p.name for p in registry.properties_of("kv-zeroing")] == [
        "zero_kv_blocks_differential", "zero_kv_blocks_sentinel", "zero_kv_blocks_asan_catches_pre_d6af803"]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ["zero_kv_blocks_differential", "zero_kv_blocks_sentinel"])
def test_zeroing_properties_pass_on_the_cpu_backends(backend: str, name: str) -> None:
    result = run(name, backend, max_examples=40)
    assert result.status == "passed", result.message
    assert result.examples >= 12 and result.variant == "fixed"


def test_a_backend_the_property_does_not_list_is_refused() -> None:
    with pytest.raises(ConfigError, match="--backend"):
        run("zero_kv_blocks_asan_catches_pre_d6af803", "torch-cpu", max_examples=1)


def test_differential_property_catches_an_off_by_one_mask_in_the_cuda_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    assert "if (word >= seg_page_sizes[seg])" in build.kernel_source("zero_kv_blocks").read_text()
    result = caught(monkeypatch, tmp_path, zeroing.KERNEL, "word >= seg_page_sizes", "word > seg_page_sizes",
                    "zero_kv_blocks_differential")
    assert "bytes differing from the reference memset on cpu-shim: expected 0, got 4" in result.message
    assert result.counterexample["case"]["segments"]  # the shrunk table, named by __canon__
    assert "--property zero_kv_blocks_differential" in result.replay and "--backend cpu-shim" in result.replay
    sentinel = run("zero_kv_blocks_sentinel", "cpu-shim", max_examples=12)  # the 12 pinned cases
    assert sentinel.status == "failed" and "changed from the sentinel outside them" in sentinel.message


def test_sentinel_property_names_the_clobbered_neighbour(monkeypatch: pytest.MonkeyPatch) -> None:
    original = zeroing.BACKENDS["torch-cpu"]

    def one_word_too_many(memory, launch, arena):  # type: ignore[no-untyped-def]
        return original(memory, zeroing.Launch(launch.addrs, launch.strides, launch.pages + 1, launch.ids,
                                               launch.chunk_width, launch.max_chunks), arena)

    monkeypatch.setitem(zeroing.BACKENDS, "torch-cpu", one_word_too_many)
    result = run("zero_kv_blocks_sentinel", "torch-cpu", max_examples=1)
    assert result.status == "failed"
    assert result.message.startswith("last block page (4, 12) int32, chunk width None: bytes changed from the "
                                     "sentinel outside them: expected 0, got 4")


def test_oracle_report_runs_every_kernel_property_and_skips_what_is_missing() -> None:
    seen: list[str] = []
    kernel_properties()  # the catalog: the runner resolves the model's variant there
    registry = Registry()
    registry.add_model(DESCRIPTOR)
    gpu_oracle.register(registry)
    report = oracle.oracle_report(registry, max_examples=15, seed=0, progress=seen.append)
    assert set(report) == {"backends", "checks", "complete", "not_run", "stopped_by"} and report["complete"] is True
    available = {b["name"]: b for b in report["backends"]}
    rows = {(c["name"], c["backend"]): c for c in report["checks"]}
    assert len(rows) == len(report["checks"]) == sum(len(p.backends) for p in registry.properties.values())
    for prop in registry.properties.values():
        for backend in prop.backends:
            row = rows[(f"kv-zeroing:{prop.name}", backend)]
            assert {"name", "backend", "examples", "status", "message", "seconds"} <= set(row)
            if available[backend]["available"]:
                assert row["status"] == "passed", row["message"]
                assert row["examples"] > 0
            else:
                assert row["status"] == "skipped" and row["message"] == available[backend]["reason"]
    if not _has_cuda():
        assert rows[("kv-zeroing:zero_kv_blocks_differential", "cupy-cuda")]["status"] == "skipped"
        assert rows[("kv-zeroing:zero_kv_blocks_differential", "torch-cuda")]["status"] == "skipped"
    assert any("kv-zeroing:zero_kv_blocks_differential on torch-cpu" in line for line in seen)


def test_disabled_backends_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSIM_ORACLE_DISABLE", "cpu-shim,cpu-shim-asan")
    registry = Registry()
    registry.add_model(DESCRIPTOR)
    registry.add_property(kernel_properties()["zero_kv_blocks_sentinel"])
    report = oracle.oracle_report(registry, max_examples=5)
    for backend in ("cpu-shim", "cpu-shim-asan"):
        row = next(c for c in report["checks"] if c["backend"] == backend)
        assert row["status"] == "skipped" and "KVSIM_ORACLE_DISABLE" in row["message"] and row["examples"] == 0
    assert run("zero_kv_blocks_sentinel", "cpu-shim", max_examples=1).status == "skipped"


# --- the CuPy path, driven through a stand-in that runs the launch on the CPU shim ------------------------

def test_cupy_backend_launch_is_well_formed(monkeypatch: pytest.MonkeyPatch) -> None:
    if build.find_compiler() is None:
        pytest.skip("the stand-in runs the launch on the CPU shim")
    calls: list = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(calls, lambda name: zeroing.KERNEL.library(False)))
    shim.cupy_function.cache_clear()
    try:
        geometry = last_block_page_geometry()
        arena = Arena.for_geometry(geometry)
        table = plan_segments(geometry, arena=arena)
        memory = np.full(arena.size, 0xA5, dtype=np.uint8)
        expected = memory.copy()
        zero_blocks(expected, table, [0, 3])
        got = gpu_oracle.zero_kv_blocks("cupy-cuda", memory, table, [0, 3], chunk_width=3)
    finally:
        shim.cupy_function.cache_clear()
    assert np.array_equal(got, expected)
    assert calls == [("zero_kv_blocks", (2, 1, 2), (3,), ["DeviceArray[uint64]"] + ["DeviceArray[int64]"] * 3)]
