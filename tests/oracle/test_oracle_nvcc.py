"""Every CUDA C kernel in gpu_oracle compiles for sm_90 (H100/H200), so a kernel that would not build on a GPU
fails CI on machines without one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvsim.gpu_oracle.runtime import build
from kvsim.gpu_oracle.runtime.family import families

NVCC = build.find_nvcc()
KERNELS = build.kernel_files()


def test_there_are_kernels_to_check() -> None:
    assert "zero_kv_blocks.cu" in [k.name for k in KERNELS]
    # every source has a descriptor in its family, and every descriptor a source and a CPU launcher
    assert sorted(k.stem for k in KERNELS) == sorted(k.name for f in families() for k in f.kernels) \
        == build.shim_kernels()
    assert sorted(f.model for f in families()) == ["kv-offload", "kv-zeroing", "mla-backends", "mla-chunks", "pd-staging"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin")
@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_kernel_compiles_for_sm_90(kernel: Path, tmp_path: Path) -> None:
    assert NVCC is not None
    out = tmp_path / f"{kernel.stem}.cubin"
    proc = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-Werror", "all-warnings", str(kernel), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
