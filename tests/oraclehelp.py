"""Helpers for the oracle tests: the kernel properties, planted kernel faults, and a stand-in `cupy` that runs
launches on the CPU shim.

The stand-in checks what the CuPy backends hand to NVRTC and to the launch
(source without includes, grid, block, argument types) and computes the
result with the same CUDA C source, so the CuPy code path is exercised on a
CPU machine.
"""

from __future__ import annotations

import shutil
import types
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import kvsim.gpu_oracle as gpu_oracle
from kvsim.app import catalog, oracle
from kvsim.engine.property import KvProperty
from kvsim.engine.runner import PropertyResult
from kvsim.gpu_oracle.runtime import build
from kvsim.gpu_oracle.runtime.family import Kernel


def kernel_properties() -> dict[str, KvProperty]:
    """Every kernel property of the catalog, by name (registered through the catalog, else added here)."""
    registry = catalog.load()
    gpu_oracle.register(registry)  # a no-op where the models' properties packages registered them already
    return {p.name: p for p in oracle.kernel_properties(registry)}


def run(name: str, backend: str, *, max_examples: int, seed: int | None = 0, variant: str = "fixed") -> PropertyResult:
    """Kernel property `name` on `backend`, as `kvsim check --backend` runs it (ASan child included)."""
    return oracle.run_kernel_property(kernel_properties()[name], backend, variant=variant, max_examples=max_examples,
                                      seed=seed)


def plant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kernel: Kernel, old: str, new: str) -> None:
    """Make `kernel`'s cpu-shim backend run a build of its source with `old` replaced by `new`."""
    lib = kernel.library(False, mutant_kernels(tmp_path, kernel.name, old, new))
    monkeypatch.setitem(kernel.backends, "cpu-shim", lambda *args: kernel.shim(lib, False, *args))


def caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kernel: Kernel, old: str, new: str, name: str,
           max_examples: int = 100) -> PropertyResult:
    """Plant the fault (`plant`), run property `name` on cpu-shim, and require that it fails."""
    plant(monkeypatch, tmp_path, kernel, old, new)
    result = run(name, "cpu-shim", max_examples=max_examples)
    assert result.status == "failed", f"{name} missed the planted fault {old!r} -> {new!r}"
    return result


def mutant_kernels(tmp_path: Path, kernel: str, old: str, new: str) -> str:
    """A copy of the kernel directory with one planted change in `kernel` (the text must be there)."""
    mutant = tmp_path / "kernels"
    shutil.copytree(build.KERNEL_DIR, mutant)
    path = build.kernel_source(kernel.removesuffix(".cu"), mutant)
    source = path.read_text()
    assert old in source
    path.write_text(source.replace(old, new))
    return str(mutant)


class DeviceArray:
    def __init__(self, host: np.ndarray, base: int = 0) -> None:
        self.host = host if base else np.ascontiguousarray(host).copy()
        self.data = types.SimpleNamespace(ptr=self.host.ctypes.data + base)
        self.base = base

    def __getitem__(self, key: slice) -> "DeviceArray":  # `buffer[offset:]`, as the staging backend slices
        assert isinstance(key, slice) and key.stop is None and key.step is None
        return DeviceArray(self.host, self.base + key.start)


def _kind(arg: object) -> str:
    return f"DeviceArray[{arg.host.dtype}]" if isinstance(arg, DeviceArray) else type(arg).__name__


def fake_cupy(launches: list, library: Callable[[str], object]) -> types.ModuleType:
    """`library(kernel)` returns the shim CDLL whose `kvsim_<kernel>` runs a launch."""

    class RawModule:
        def __init__(self, code: str) -> None:
            assert "#include" not in code  # NVRTC compiles the source as is
            self.code = code

        def get_function(self, name: str):  # type: ignore[no-untyped-def]
            assert f"__global__ void {name}(" in self.code

            def kernel(grid, block, args):  # type: ignore[no-untyped-def]
                launches.append((name, tuple(grid), tuple(block), [_kind(a) for a in args]))
                raw = [a.data.ptr if isinstance(a, DeviceArray) else a.item() for a in args]
                getattr(library(name), f"kvsim_{name}")(*grid, *block, *raw)
            return kernel

    module = types.ModuleType("cupy")
    module.RawModule, module.asarray, module.uint8 = RawModule, DeviceArray, np.uint8  # type: ignore[attr-defined]
    module.zeros = lambda shape, dtype: DeviceArray(np.zeros(shape, dtype))  # type: ignore[attr-defined]
    module.asnumpy = lambda a: a.host.copy()  # type: ignore[attr-defined]
    module.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None))
    return module
