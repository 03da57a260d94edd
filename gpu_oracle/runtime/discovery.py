"""Which kernel backends this machine can run, and why the others are skipped.

Each probe returns `{"name", "available", "reason"}` and never raises: a
missing compiler, torch, CuPy or GPU is a reason, not an error.

* `torch-cpu`: torch index operations on CPU tensors.
* `cpu-shim`: the CUDA C kernels compiled by g++ with `kernels/cuda_cpu_shim.h`.
* `cpu-shim-asan`: the same, built with AddressSanitizer and run in a child
  Python with libasan preloaded (it cannot be loaded into a running interpreter).
* `torch-cuda`: the torch backend on a CUDA device.
* `cupy-cuda`: the CUDA C kernels through `cupy.RawModule` (NVRTC) on a GPU.

`KVSIM_ORACLE_DISABLE=name,name` reports the named backends unavailable (to
keep a slow or broken backend out of a CI run).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from . import build

BACKEND_NAMES = ("torch-cpu", "cpu-shim", "cpu-shim-asan", "torch-cuda", "cupy-cuda")
CUDA_BACKENDS = ("torch-cuda", "cupy-cuda")


def _torch_cpu() -> tuple[bool, str]:
    import torch

    return True, f"torch {torch.__version__}"


def _torch_cuda() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})"
    return True, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def _cpu_shim() -> tuple[bool, str]:
    cxx = build.find_compiler()
    if cxx is None:
        return False, "no C++ compiler (g++/c++ not on PATH, $CXX unset)"
    return True, f"{build.compiler_version(cxx)} at {cxx}"


def _cpu_shim_asan() -> tuple[bool, str]:
    cxx = build.find_compiler()
    if cxx is None:
        return False, "no C++ compiler (g++/c++ not on PATH, $CXX unset)"
    runtime = build.asan_runtime(cxx)
    if runtime is None:
        return False, f"{cxx} has no libasan.so to preload"
    return True, f"{build.compiler_version(cxx)} with {runtime}"


def _cupy_cuda() -> tuple[bool, str]:
    import cupy

    if not cupy.is_available():
        return False, f"cupy {cupy.__version__} sees no CUDA device (cupy.is_available() is False)"
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, f"cupy {cupy.__version__} on {name}"


PROBES: dict[str, Callable[[], tuple[bool, str]]] = {
    "torch-cpu": _torch_cpu, "cpu-shim": _cpu_shim, "cpu-shim-asan": _cpu_shim_asan,
    "torch-cuda": _torch_cuda, "cupy-cuda": _cupy_cuda,
}

_cache: dict[str, tuple[bool, str]] = {}


def probe(name: str) -> tuple[bool, str]:
    """(available, reason) for one backend; cached for the life of the process."""
    if name not in _cache:
        try:
            _cache[name] = PROBES[name]()
        except ImportError as exc:
            _cache[name] = False, f"{exc.name or exc} is not installed"
        except Exception as exc:  # a broken driver or toolkit is a reason to skip, not a crash
            _cache[name] = False, f"{type(exc).__name__}: {exc}"
    return _cache[name]


def backends() -> list[dict[str, Any]]:
    """Every known backend with whether this machine can run it and why (or why not)."""
    disabled = {n.strip() for n in os.environ.get("KVSIM_ORACLE_DISABLE", "").split(",") if n.strip()}
    rows = []
    for name in BACKEND_NAMES:
        available, reason = (False, "disabled by KVSIM_ORACLE_DISABLE") if name in disabled else probe(name)
        rows.append({"name": name, "available": available, "reason": reason})
    return rows


def available(name: str) -> bool:
    return next(b["available"] for b in backends() if b["name"] == name)
