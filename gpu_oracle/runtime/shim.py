"""Loading the CPU-shim builds of the CUDA C kernels, and moving arrays in and out of them.

Every kernel in `kernels/` compiles twice for the CPU (`build.build_shim`):
plain, and with AddressSanitizer, which only loads inside a child started
with libasan preloaded (`gpu_oracle.asan`). On a GPU the same source is
compiled by NVRTC through `cupy.RawModule`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Sequence

import numpy as np

from kvsim.engine.errors import ConfigError

from . import build

_P = ctypes.c_void_p


def asan_loaded() -> bool:
    """True when libasan is mapped into this process (only in the preloaded child)."""
    try:
        with open("/proc/self/maps") as maps:
            return "libasan" in maps.read()
    except OSError:
        return False


@functools.lru_cache(maxsize=16)
def load(kernel: str, argtypes: Sequence[type], asan: bool = False,
         kernel_dir: str = str(build.KERNEL_DIR)) -> ctypes.CDLL:
    """The shim build of `kernel` with its entry point typed; `kernel_dir` admits mutants in tests."""
    if asan and not asan_loaded():
        raise ConfigError("cpu-shim-asan", "a process started with libasan preloaded "
                          "(run it through gpu_oracle.asan)", "a plain interpreter")
    lib = ctypes.CDLL(str(build.build_shim(kernel, asan=asan, kernel_dir=Path(kernel_dir))))
    entry = getattr(lib, f"kvsim_{kernel}")
    entry.argtypes, entry.restype = list(argtypes), None
    lib.kvsim_malloc.argtypes, lib.kvsim_malloc.restype = [ctypes.c_size_t], _P
    lib.kvsim_free.argtypes, lib.kvsim_free.restype = [_P], None
    return lib


class Mallocs:
    """One exact-size malloc per array (so ASan red zones sit right after it), copied in; freed on exit."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib, self.ptrs = lib, []  # type: ignore[var-annotated]

    def put(self, data: np.ndarray) -> int:
        data = np.ascontiguousarray(data)
        ptr = self.lib.kvsim_malloc(max(data.nbytes, 1))
        self.ptrs.append(ptr)
        ctypes.memmove(ptr, data.ctypes.data, data.nbytes)
        return ptr

    def __enter__(self) -> "Mallocs":
        return self

    def __exit__(self, *exc: object) -> None:
        for ptr in self.ptrs:
            self.lib.kvsim_free(ptr)


def read(ptr: int, like: np.ndarray) -> np.ndarray:
    """A copy of the bytes at `ptr`, shaped and typed like `like`."""
    out = np.empty_like(like)
    ctypes.memmove(out.ctypes.data, ptr, out.nbytes)
    return out


@functools.lru_cache(maxsize=8)
def cupy_function(kernel: str):  # type: ignore[no-untyped-def]
    """The kernel compiled by NVRTC on the GPU (CuPy imported only here)."""
    import cupy

    return cupy.RawModule(code=build.kernel_source(kernel).read_text()).get_function(kernel)
