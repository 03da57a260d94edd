"""The CUDA C zeroing kernel under AddressSanitizer: the pre-fix segment table's out-of-bounds store is caught."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from oraclehelp import kernel_properties, run

from kvsim.engine.errors import PropertyViolation
from kvsim.gpu_oracle.kernels.zero_kv_blocks.backends import case_document
from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import overrun_cases
from kvsim.gpu_oracle.runtime import asan, build, discovery
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import deepseek_v4_geometry, last_block_page_geometry
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.models.kv_zeroing.zeroer import FIXED, ZeroingVariant, plan_segments, zero_blocks

pytestmark = pytest.mark.skipif(not discovery.available("cpu-shim-asan"),
                                reason=f"cpu-shim-asan unavailable: {discovery.probe('cpu-shim-asan')[1]}")

STORE_LINE = next(i for i, line in enumerate(build.kernel_source("zero_kv_blocks").read_text().splitlines(), 1)
                  if "base[offset] = 0;" in line)


def _run(geometry: KVCacheGeometry, variant: ZeroingVariant, ids: tuple[int, ...]) -> tuple[asan.ChildResult, Arena]:
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, variant=variant, arena=arena)
    return asan.run_case("zero_kv_blocks", case_document(arena, table, ids, fill=0xA5)), arena


def test_pre_fix_last_block_page_is_a_heap_buffer_overflow_in_the_kernel() -> None:
    child, _ = _run(last_block_page_geometry(), VARIANTS["pre_d6af803"], (3,))
    assert child.returncode == asan.ASAN_EXIT_CODE and child.output is None
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in child.stderr
    assert f"zero_kv_blocks.cu:{STORE_LINE}" in child.stderr
    report = child.report
    assert report is not None
    assert (report.kind, report.access, report.size) == ("heap-buffer-overflow", "WRITE", 4)
    # the kernel lives in its family folder since the house move (a build cached from before named the old path)
    assert report.file.endswith("gpu_oracle/kernels/zero_kv_blocks/zero_kv_blocks.cu") and report.line == STORE_LINE
    assert report.function == "zero_kv_blocks"
    assert report.region == "0 bytes to the right of 192-byte region"  # the first word past the (4, 12) backing


def test_pre_fix_deepseek_v4_last_block_overflows_the_allocation() -> None:
    child, _ = _run(deepseek_v4_geometry(), VARIANTS["pre_d6af803"], (99,))
    assert child.report is not None and child.report.kind == "heap-buffer-overflow"
    assert child.report.region == "0 bytes to the right of 14976000-byte region"
    assert child.report.line == STORE_LINE


@pytest.mark.parametrize("geometry, ids", [(last_block_page_geometry(), (3,)), (deepseek_v4_geometry(), (5, 99))],
                         ids=["last-block-page", "deepseek-v4"])
def test_fixed_table_runs_clean_and_matches_the_reference(geometry, ids) -> None:  # type: ignore[no-untyped-def]
    child, arena = _run(geometry, FIXED, ids)
    assert child.clean, child.explain()
    expected = np.full(arena.size, 0xA5, dtype=np.uint8)
    zero_blocks(expected, plan_segments(geometry, arena=arena), ids)
    assert child.output == {"sha256": hashlib.sha256(expected.tobytes()).hexdigest(),
                            "zero_bytes": int((expected == 0).sum())}


def test_properties_run_inside_the_asan_child() -> None:
    for name in ("zero_kv_blocks_differential", "zero_kv_blocks_sentinel", "zero_kv_blocks_asan_catches_pre_d6af803"):
        result = run(name, "cpu-shim-asan", max_examples=30)
        assert result.status == "passed", result.message
        assert result.examples >= 4


def test_the_asan_property_fails_when_asan_does_not_stop_the_pre_fix_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case runs clean (as if the kernel's store were bounds-checked): the pre-fix cases must then fail."""
    prop = kernel_properties()["zero_kv_blocks_asan_catches_pre_d6af803"]
    pre, fixed = overrun_cases()[:2]
    assert pre.overrun and not fixed.overrun
    prop.fn(pre, FIXED, "cpu-shim-asan")  # caught: the property holds
    clean = _run(fixed.geometry, FIXED, fixed.block_ids)[0]
    monkeypatch.setattr(asan, "run_case", lambda family, document: clean)
    with pytest.raises(PropertyViolation, match="expected an ASan heap-buffer-overflow WRITE in zero_kv_blocks.cu"):
        prop.fn(pre, FIXED, "cpu-shim-asan")


def test_child_refuses_to_run_without_libasan() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvsim.gpu_oracle.runtime.asan_run", "case", "zero_kv_blocks", "-"],
                          input="{}", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "libasan is not preloaded" in proc.stderr


def test_report_parser() -> None:
    stderr = ("noise\n==7==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6 at pc 0x1 bp 0x2 sp 0x3\n"
              "WRITE of size 4 at 0x6 thread T0\n    #0 0x7f in zero_kv_blocks /k/zero_kv_blocks.cu:28\n"
              "0x6 is located 0 bytes to the right of 192-byte region [0x5,0x6)\n"
              "SUMMARY: AddressSanitizer: heap-buffer-overflow /k/zero_kv_blocks.cu:28 in zero_kv_blocks\n")
    report = asan.parse_report(stderr)
    assert report is not None
    assert str(report) == ("heap-buffer-overflow: WRITE of size 4 in zero_kv_blocks at zero_kv_blocks.cu:28 "
                           "(0 bytes to the right of 192-byte region)")
    assert asan.parse_report("all fine\n") is None
