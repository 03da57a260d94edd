"""gpu_oracle for MLA chunked context: the gather and merge kernels on every CPU backend, their kernel properties,
the torch SDPA end-to-end oracle of the prefill, and that each property fails on a planted fault."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from oraclehelp import caught, fake_cupy, kernel_properties, run

import kvsim.gpu_oracle as gpu_oracle
from kvsim.engine.errors import ConfigError
from kvsim.gpu_oracle.kernels.mla_context import backends as mla
from kvsim.gpu_oracle.kernels.mla_context.backends import case_document
from kvsim.gpu_oracle.kernels.mla_context.cases import bad_metadata_cases
from kvsim.gpu_oracle.runtime import asan, build, discovery, shim
from kvsim.models.mla_chunks.attention import gather_context_rows
from kvsim.models.mla_chunks.attention import merge_attn_states as merge_reference

CPU_BACKENDS = [name for name in ("torch-cpu", "cpu-shim") if discovery.available(name)]
needs_shim = pytest.mark.skipif(build.find_compiler() is None, reason="no C++ compiler")
needs_asan = pytest.mark.skipif(not discovery.available("cpu-shim-asan"),
                                reason=f"cpu-shim-asan unavailable: {discovery.probe('cpu-shim-asan')[1]}")


def _line(kernel: str, text: str) -> int:
    lines = build.kernel_source(kernel.removesuffix(".cu")).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_the_nvcc_check_and_the_asan_prebuild_pick_up_the_kernels() -> None:
    names = {k.name for k in build.kernel_files()}
    assert {"gather_mla_context.cu", "merge_attn_states.cu", "zero_kv_blocks.cu"} <= names
    assert {"gather_mla_context", "merge_attn_states", "zero_kv_blocks"} <= set(build.shim_kernels())
    for kernel in ("gather_mla_context.cu", "merge_attn_states.cu"):  # NVRTC-ready: no includes, no shared memory
        source = build.kernel_source(kernel.removesuffix(".cu")).read_text()
        assert "#include" not in source and "__shared__" not in source and "__syncthreads" not in source


# --- gather --------------------------------------------------------------------------------------------

def _paged(dtype: str = "float32", pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """7 blocks of 4 slots, 6 wide, distinct values, stored with `pad` extra elements per entry."""
    buffer = np.arange(7 * 4 * (6 + pad)).reshape(7, 4, 6 + pad).astype(dtype)
    return buffer[:, :, :6], np.array([[3, 1, 5], [6, 2, 0]])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype, pad, threads", [("float32", 0, 64), ("float16", 3, 5), ("float64", 1, 1)])
def test_gather_unaligned_starts_match_the_reference(backend: str, dtype: str, pad: int, threads: int) -> None:
    kv, table = _paged(dtype, pad)
    cu, seq, starts = (0, 7, 10), (0,) * 7 + (1,) * 3, (3, 5)  # starts inside blocks: 3 of block 3, 1 of block 2
    before = kv.copy()
    got = gpu_oracle.gather_mla_context(backend, kv, table, cu, seq, starts, threads=threads)
    want = gather_context_rows(kv, table, cu, seq, starts)
    assert got.dtype == kv.dtype and got.tobytes() == want.tobytes()
    assert np.array_equal(got[0], kv[3, 3]) and np.array_equal(got[9], kv[2, 3])
    assert np.array_equal(kv, before)
    assert gpu_oracle.gather_mla_context(backend, kv, table, (0,), (), ()).shape == (0, 6)


@pytest.mark.parametrize("args, field", [
    ({"cu_seq_lens": (0, 8, 10), "seq_starts": (3, 0)}, "cu_seq_lens"),  # token 7 would read position -1
    ({"seq_starts": (3, 10)}, "block_table"),  # position 12 needs a fourth column
    ({"block_table": np.array([[3, 1, 5], [6, 7, 0]])}, "block_table"),  # block 7 of 7
    ({"token_to_seq": (0,) * 7 + (1, 1, 2)}, "token_to_seq"),
    ({"kv_cache": np.zeros((7, 4))}, "kv_cache"),
])
def test_gather_rejects_metadata_that_would_read_out_of_bounds(args: dict, field: str) -> None:
    kv, table = _paged()
    call = {"kv_cache": kv, "block_table": table, "cu_seq_lens": (0, 7, 10), "token_to_seq": (0,) * 7 + (1,) * 3,
            "seq_starts": (3, 5), **args}
    with pytest.raises(ConfigError) as info:
        gpu_oracle.gather_mla_context("torch-cpu", **call)
    assert info.value.field == field


# --- merge -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_merge_empty_states_give_the_identity_never_nan(backend: str) -> None:
    inf = np.inf
    po = np.full((4, 1, 3), 2.0, dtype=np.float32)
    so = np.full((4, 1, 3), -1.0, dtype=np.float32)
    pl = np.array([[-inf, inf, 0.5, -inf]], dtype=np.float32)  # +inf is FA2's empty row
    sl = np.array([[-inf, -inf, -inf, 1.25]], dtype=np.float32)
    result = gpu_oracle.merge_attn_states(backend, po, pl, so, sl, head_pad=2, token_pad=1, threads=2)
    assert result.padding_untouched and not np.isnan(result.output).any()
    assert (result.output[:2] == 0).all() and np.isneginf(result.lse[0, :2]).all()  # (0,-inf) + (0,-inf)
    assert (result.output[2] == 2.0).all() and result.lse[0, 2] == np.float32(0.5)  # suffix empty: the prefix
    assert (result.output[3] == -1.0).all() and result.lse[0, 3] == np.float32(1.25)
    balanced = gpu_oracle.merge_attn_states(backend, po[2:3], pl[:, 2:3], so[2:3], pl[:, 2:3], with_lse=False)
    assert balanced.lse is None and np.allclose(balanced.output, 0.5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_merge_agrees_with_the_float64_reference_on_a_wide_spread(backend: str) -> None:
    rng = np.random.default_rng(0)
    po, so = (rng.standard_normal((5, 3, 17)).astype(np.float32) for _ in range(2))
    pl, sl = ((rng.standard_normal((3, 5)) * 40).astype(np.float32) for _ in range(2))
    got = gpu_oracle.merge_attn_states(backend, po, pl, so, sl, threads=4)
    want, want_lse = merge_reference(*(x.astype(np.float64) for x in (po, pl, so, sl)))
    assert np.abs(got.output - want).max() < 1e-5 and np.abs(got.lse - want_lse).max() < 1e-4


# --- the kernel properties -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ["gather_mla_context_differential", "merge_attn_states_differential",
                                  "mla_prefill_kernels_vs_sdpa"])
def test_kernel_properties_pass_on_the_cpu_backends(backend: str, name: str) -> None:
    result = run(name, backend, max_examples=30)
    assert result.status == "passed", result.message
    assert result.examples >= 20 and kernel_properties()[name].model == "mla-chunks"


def test_sdpa_oracle_passes_on_torch_cpu_and_low_precision_is_gpu_only() -> None:
    result = run("mla_prefill_sdpa_oracle", "torch-cpu", max_examples=30)
    assert result.status == "passed" and result.examples >= 20, result.message
    assert kernel_properties()["mla_prefill_sdpa_oracle_low_precision"].backends == ("torch-cuda",)


@pytest.mark.parametrize("variant", ["pre_b38e111d", "uniform_unmasked"])
def test_sdpa_oracle_fails_the_pre_fix_variants(variant: str) -> None:
    """The uniform plans mis-merge a prefill without context that precedes one with it (note 1.7)."""
    result = run("mla_prefill_sdpa_oracle", "torch-cpu", max_examples=300, variant=variant)
    assert result.status == "failed" and result.variant == variant
    assert f"{variant} chunked prefill output vs SDPA float64 on cpu" in result.message
    assert result.counterexample["case"]["context_lens"] == [0, 1]  # shrunk to the context-order case


@needs_shim
def test_gather_property_catches_a_kernel_that_ignores_seq_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 ) -> None:
    """The pre-per-request assumption that every request's chunk starts at its position 0."""
    result = caught(monkeypatch, tmp_path, mla.GATHER_KERNEL, "(long long)seq_starts[b] + ", "",
                    "gather_mla_context_differential")
    assert "workspace bytes of chunk 1 on cpu-shim equal to the reference gather's" in result.message
    result = run("mla_prefill_kernels_vs_sdpa", "cpu-shim", max_examples=100)
    assert result.status == "failed" and "prefill from the cpu-shim kernels vs SDPA float64" in result.message


@needs_shim
def test_merge_property_catches_a_kernel_without_the_empty_state_guard(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    result = caught(monkeypatch, tmp_path, mla.MERGE_KERNEL, "if (m < -3.402823466e+38f) {", "if (false) {",
                    "merge_attn_states_differential")
    assert "NaN in the merged output on cpu-shim: expected none" in result.message


# --- AddressSanitizer ----------------------------------------------------------------------------------

@needs_asan
def test_asan_stops_a_gather_fed_wrong_metadata_at_the_faulting_load() -> None:
    good, shifted, foreign = (case.arguments for case in bad_metadata_cases())
    kv, table = good[:2]
    clean = asan.run_case("mla_context", case_document(*good))
    assert clean.clean and clean.output["shape"] == [13, 6]
    child = asan.run_case("mla_context", case_document(*shifted))
    assert child.returncode == asan.ASAN_EXIT_CODE and child.output is None and child.report is not None
    assert (child.report.kind, child.report.access, child.report.size) == ("heap-buffer-overflow", "READ", 4)
    assert child.report.line == _line("gather_mla_context.cu", "const long long block = block_table[")
    assert child.report.region == "0 bytes to the right of 16-byte region"  # the 2 x 2 int32 block table
    child = asan.run_case("mla_context", case_document(*foreign))
    assert child.report is not None and (child.report.access, child.report.size) == ("READ", 1)
    assert child.report.line == _line("gather_mla_context.cu", "dst[i] = src[i];")


@needs_asan
def test_properties_run_inside_the_asan_child() -> None:
    for name in ("gather_mla_context_differential", "merge_attn_states_differential", "mla_prefill_kernels_vs_sdpa"):
        result = run(name, "cpu-shim-asan", max_examples=25)
        assert result.status == "passed" and result.examples >= 20, result.message
    result = run("gather_mla_context_asan_catches_bad_metadata", "cpu-shim-asan", max_examples=10)
    assert result.status == "passed" and result.examples == 3, result.message


# --- the CuPy path, through a stand-in that runs each launch on the CPU shim ---------------------------------

@needs_shim
def test_cupy_launches_are_well_formed(monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list = []
    kernels = {k.name: k for k in (mla.GATHER_KERNEL, mla.MERGE_KERNEL)}
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(launches, lambda name: kernels[name].library()))
    shim.cupy_function.cache_clear()
    try:
        kv, table = _paged("float16", 3)
        args = (kv, table, (0, 7, 10), (0,) * 7 + (1,) * 3, (3, 5))
        assert gpu_oracle.gather_mla_context("cupy-cuda", *args).tobytes() == gather_context_rows(*args).tobytes()
        po, so = np.ones((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32)
        pl, sl = np.zeros((3, 2), np.float32), np.full((3, 2), -np.inf, np.float32)
        merged = gpu_oracle.merge_attn_states("cupy-cuda", po, pl, so, sl, head_pad=1, threads=3)
    finally:
        shim.cupy_function.cache_clear()
    assert merged.padding_untouched and (merged.output == 1).all() and (merged.lse == 0).all()
    assert [launch[:3] for launch in launches] == [("gather_mla_context", (10,), (64,)),
                                                   ("merge_attn_states", (2, 3), (3,))]
    assert launches[1][3][-4:] == ["int32", "int32", "int64", "int64"]
