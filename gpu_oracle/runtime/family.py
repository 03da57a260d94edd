"""Kernel and kernel-family descriptors: what the runtime needs to know about a kernel, declared once.

A `Kernel` is one CUDA C source (`kernels/<family>/<name>.cu` with its CPU
launcher `<name>_launch.cpp`) and its entry points:

    prepare(...)                 -> a validated launch (the arguments the reference takes)
    reference(...)               the model's function the kernel must agree with
    torch(device, launch, ...)   the same computation with torch index operations
    shim(lib, asan, launch, ...) the launch through the g++ build of the source (`lib`: its CDLL)
    cupy(function, launch, ...)  the launch through NVRTC (`function`: the compiled kernel)

`Kernel.backends` is the backend table built from them, one entry per
`discovery.BACKEND_NAMES`, each `fn(launch, ...)`; `Kernel.run(backend, ...)`
picks one. A `KernelFamily` (one folder under `kernels/`, its `FAMILY` in
`__init__`) groups the kernels one model's reference covers, names that
model, the modules holding its kernel properties (`register(registry)` adds
them to the model's catalog) and `run_document`, the ASan child's half of a
case: a JSON document in, a JSON result (usually a digest) out.
`families()` finds every folder's `FAMILY`, so adding a kernel touches only
its own folder.
"""

from __future__ import annotations

import ctypes
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kvsim.engine.errors import require

from . import build, shim
from .discovery import BACKEND_NAMES


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str  # the .cu stem, also the launcher's `kvsim_<name>` and the `__global__` function
    argtypes: tuple[Any, ...]  # the launcher's C signature, for ctypes
    prepare: Callable[..., Any]
    reference: Callable[..., Any]
    torch: Callable[..., Any]
    shim: Callable[..., Any]
    cupy: Callable[..., Any]
    backends: dict[str, Callable[..., Any]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table: dict[str, Callable[..., Any]] = {
            "torch-cpu": lambda *a: self.torch("cpu", *a),
            "cpu-shim": lambda *a: self.shim(self.library(False), False, *a),
            "cpu-shim-asan": lambda *a: self.shim(self.library(True), True, *a),
            "torch-cuda": lambda *a: self.torch("cuda", *a),
            "cupy-cuda": lambda *a: self.cupy(shim.cupy_function(self.name), *a),
        }
        assert tuple(table) == BACKEND_NAMES
        object.__setattr__(self, "backends", table)

    def library(self, asan: bool = False, kernel_dir: str = str(build.KERNEL_DIR)) -> ctypes.CDLL:
        """The shim build (ASan only inside the preloaded child); `kernel_dir` admits a mutant copy in tests."""
        return shim.load(self.name, self.argtypes, asan, kernel_dir)

    def check(self, backend: str) -> str:
        """`backend`, if it names an entry of the table (ConfigError otherwise): check before preparing."""
        require(backend in self.backends, "backend", f"one of {', '.join(self.backends)}", backend)
        return backend

    def run(self, backend: str, *args: Any) -> Any:
        return self.backends[self.check(backend)](*args)


@dataclass(frozen=True, eq=False)
class KernelFamily:
    name: str  # the folder under kernels/
    model: str  # the model whose catalog lists the family's kernel properties
    package: str  # the family package's __name__
    kernels: tuple[Kernel, ...]
    run_document: Callable[[Mapping[str, Any]], dict[str, Any]]  # in the ASan child: case document -> result
    properties: tuple[str, ...] = ("properties",)  # modules of the package declaring kernel properties

    def kernel(self, name: str) -> Kernel:
        return next(k for k in self.kernels if k.name == name)

    def register(self, registry: Any) -> None:
        """Add the family's kernel properties to `registry` (the model must be registered already)."""
        registry.add_from(*(importlib.import_module(f"{self.package}.{m}") for m in self.properties))


def families() -> list[KernelFamily]:
    """Every kernel family under `kernels/`, in folder order (imports their backends, not Hypothesis)."""
    from .. import kernels

    found = []
    for info in sorted(pkgutil.iter_modules(kernels.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        if isinstance(getattr(module, "FAMILY", None), KernelFamily):
            found.append(module.FAMILY)
    return found


def family(name: str) -> KernelFamily:
    by_name = {f.name: f for f in families()}
    require(name in by_name, "kernel family", f"one of {', '.join(by_name)}", name)
    return by_name[name]
