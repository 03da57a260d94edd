"""Build the CUDA C kernels for the CPU shim, into a cache keyed by source hash.

`build_shim("zero_kv_blocks")` compiles `kernels/zero_kv_blocks_launch.cpp`
(which includes the shim header and the `.cu` file) with the system C++
compiler into `$KVSIM_CACHE_DIR` (default `~/.cache/kvsim`, or a temporary
directory when that is not writable), never into the source tree. The file
name carries a hash of the sources, the flags and the compiler version, so a
changed kernel is rebuilt and concurrent builders (pytest-xdist) agree on it;
the library is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"  # one folder per kernel family
SHIM_HEADER = Path(__file__).resolve().parent / "cuda_cpu_shim.h"
FLAGS = ("-O2", "-g", "-std=c++17", "-shared", "-fPIC")
# -O1 keeps ASan's reports on the right source line; no frame-pointer omission keeps the stack readable.
ASAN_FLAGS = ("-O1", "-g", "-std=c++17", "-shared", "-fPIC", "-fsanitize=address", "-fno-omit-frame-pointer")


class BuildError(RuntimeError):
    """The compiler rejected a kernel: the message holds its command line and diagnostics."""


def find_compiler() -> str | None:
    """`$CXX`, else `g++`, else `c++` on PATH."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and (path := shutil.which(name)):
            return path
    return None


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


@functools.lru_cache(maxsize=None)
def asan_runtime(cxx: str) -> str | None:
    """Path of the compiler's libasan shared library (to LD_PRELOAD into a Python child), or None."""
    try:
        out = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def cache_dir() -> Path:
    """Where built libraries go: $KVSIM_CACHE_DIR, $XDG_CACHE_HOME/kvsim, ~/.cache/kvsim, else a temp dir."""
    root = os.environ.get("KVSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvsim")
    path = Path(root) / "gpu_oracle"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    path = Path(tempfile.gettempdir()) / f"kvsim-{os.getuid()}" / "gpu_oracle"
    path.mkdir(parents=True, exist_ok=True)
    return path


def kernel_source(kernel: str, kernel_dir: Path = KERNEL_DIR) -> Path:
    """`NAME.cu` in its family folder under `kernel_dir` (the path a missing kernel would have, if none)."""
    found = sorted(Path(kernel_dir).glob(f"*/{kernel}.cu"))
    return found[0] if found else Path(kernel_dir) / f"{kernel}.cu"


def kernel_sources(kernel: str, kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    cu = kernel_source(kernel, kernel_dir)
    return [SHIM_HEADER, cu, cu.parent / f"{kernel}_launch.cpp"]


def build_shim(kernel: str = "zero_kv_blocks", *, asan: bool = False, kernel_dir: Path = KERNEL_DIR) -> Path:
    """Compile `kernel` for the CPU shim (optionally with AddressSanitizer) and return the shared library path.

    `kernel_dir` lets a test build a deliberately broken copy of the kernels.
    """
    cxx = find_compiler()
    if cxx is None:
        raise BuildError("no C++ compiler: g++ and c++ are not on PATH and $CXX is unset")
    sources = kernel_sources(kernel, Path(kernel_dir))
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise BuildError(f"kernel {kernel}: missing source files {missing}")
    flags = ASAN_FLAGS if asan else FLAGS
    key = hashlib.sha256()
    for part in (compiler_version(cxx), " ".join(flags)):
        key.update(part.encode())
    for path in sources:  # the full path too: ASan and debug info name the source file a build came from
        key.update(str(path.resolve()).encode() + b"\0" + path.read_bytes())
    target = cache_dir() / f"lib{kernel}{'-asan' if asan else ''}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *flags, "-I", str(sources[0].parent), str(sources[2]), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda."""
    if path := shutil.which("nvcc"):
        return path
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(candidate := os.path.join(root, "bin", "nvcc"), os.X_OK):
            return candidate
    return None


def kernel_files() -> list[Path]:
    """Every CUDA C kernel in the package, for the nvcc compile check."""
    return sorted(KERNEL_DIR.glob("*/*.cu"))


def shim_kernels(kernel_dir: Path = KERNEL_DIR) -> list[str]:
    """Kernels with a CPU launcher (`NAME.cu` next to `NAME_launch.cpp`), for building ahead of an ASan child."""
    return sorted(p.stem for p in Path(kernel_dir).glob("*/*.cu") if (p.parent / f"{p.stem}_launch.cpp").exists())
