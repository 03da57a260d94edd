"""SGLang PD staging kernels on every backend: the prefill head-slice gather and the decode scatter (05c7ebf).

    gather_head_slice(backend, kv, page_indices, params, layout, staging=None, offset=None)
        -> the staging bytes, as `models.pd_staging_copy.gather_head_slice_to_staging` computes them
    scatter_staging(backend, kv, staging, page_indices, params, layout, offset=None)
        -> the pool after the scatter, as `models.pd_staging_copy.scatter_staging_to_pages` computes it

The CUDA C sources are `kernels/staging_gather_head_slice.cu` and
`kernels/staging_scatter.cu` (CuPy on a GPU, g++ through the CPU shim, with and
without ASan); the torch backends do the same with index operations on CPU or
CUDA. Inputs are never modified: each call returns a new array. Under
`cpu-shim-asan` the pool, the page list and the staging buffer each get their
own exact-size malloc, so a writer region that does not fit its slot
(`check_bounds=False`, the pre-05c7ebf multi-slot send) stores into a red zone.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from kvsim.engine.errors import check_int, require
from kvsim.models.pd_staging.copy import check_paged_kv
from kvsim.models.pd_staging.layout import HeadSliceParams, StagingLayout

from ...runtime import build
from ...runtime import shim

GATHER, SCATTER = "staging_gather_head_slice", "staging_scatter"
KERNELS = (GATHER, SCATTER)
THREADS = 128
_LL, _I, _P, _U = ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint
_ARGTYPES = [_U, _U, _U, _P, _P, _P, _LL, _LL, _LL, _LL, _LL, _LL, _I, _I, _I, _I, _I]


def shim_library(kernel: str, asan: bool = False, kernel_dir: str = str(build.KERNEL_DIR)) -> ctypes.CDLL:
    """The shim build of `kernel` (ASan only inside the preloaded child); `kernel_dir` admits mutants."""
    return shim.load(kernel, tuple(_ARGTYPES), asan, kernel_dir)


_cupy_function = shim.cupy_function


@dataclass(frozen=True, eq=False)
class StagingLaunch:
    """One writer's copy: the pool as bytes `[L, 2, P, ps, H, head_bytes]`, int32 pages, the staging buffer."""

    kernel: str
    pool: np.ndarray  # uint8 view, 6-D
    pages: np.ndarray  # int32
    staging: np.ndarray  # uint8, 1-D, the whole buffer
    offset: int  # the writer's first byte in `staging`
    head_start: int  # src_head_start (gather) or dst_head_start (scatter)
    num_heads: int
    threads: int

    @property
    def num_tokens(self) -> int:
        return len(self.pages) * self.pool.shape[3]

    @property
    def grid(self) -> tuple[int, int]:
        return self.num_tokens, 2 * self.pool.shape[0]

    @property
    def region_bytes(self) -> int:
        return 2 * self.pool.shape[0] * self.num_tokens * self.num_heads * self.pool.shape[5]

    def scalars(self) -> tuple[int, ...]:
        p = self.pool
        return (*p.strides[:5], p.shape[5], self.head_start, self.num_heads, p.shape[0], p.shape[3], self.num_tokens)


def prepare(kernel: str, kv: np.ndarray, page_indices: Sequence[int] | np.ndarray, params: HeadSliceParams,
            layout: StagingLayout, staging: np.ndarray | None, offset: int | None, threads: int = THREADS,
            check_bounds: bool = True) -> StagingLaunch:
    """Validate like the reference; `check_bounds=False` lets a region past the buffer through (for ASan)."""
    kv = check_paged_kv(kv)
    require(isinstance(threads, int) and 1 <= threads <= 1024, "threads", "1..1024", threads)
    pages = np.asarray(page_indices, dtype=np.int64).reshape(-1)
    require(not pages.size or (pages.min() >= 0 and pages.max() < kv.shape[2]), "page_indices",
            f"page ids in [0, {kv.shape[2]})", pages.tolist())
    w = check_int(params.writer_index, "params.writer_index", minimum=0, maximum=len(layout.writer_heads) - 1)
    head_start = params.src_head_start if kernel == GATHER else params.dst_head_start
    require(head_start + params.num_heads <= kv.shape[4], "params", f"heads inside the pool's {kv.shape[4]}",
            (head_start, params.num_heads))
    require(layout.head_bytes == kv.shape[5] * kv.itemsize and layout.num_layers == kv.shape[0], "layout",
            "the pool's head bytes and layers", (layout.head_bytes, layout.num_layers))
    if staging is None:
        staging = np.zeros(layout.total_bytes, dtype=np.uint8)
    require(isinstance(staging, np.ndarray) and staging.dtype == np.uint8 and staging.ndim == 1, "staging",
            "a 1-D uint8 array", getattr(staging, "dtype", type(staging).__name__))
    base = layout.writer_offsets[w] if offset is None else check_int(offset, "offset", minimum=0)
    launch = StagingLaunch(kernel, kv.view(np.uint8).reshape(*kv.shape[:5], -1), pages.astype(np.int32),
                           np.ascontiguousarray(staging), base, head_start, params.num_heads, threads)
    if check_bounds:
        require(layout.tokens == launch.num_tokens and layout.writer_heads[w] == params.num_heads, "layout",
                f"{launch.num_tokens} tokens, writer {w} with {params.num_heads} heads",
                (layout.tokens, layout.writer_heads))
        require(base + launch.region_bytes <= len(staging), "staging",
                f"at least {base + launch.region_bytes} bytes", len(staging))
    return launch


# --- backends: each returns (new staging, new pool bytes) ------------------------------------------------

def _torch(launch: StagingLaunch, device: str) -> tuple[np.ndarray, np.ndarray]:
    import torch

    pool = torch.from_numpy(launch.pool.copy()).to(device)
    staging = torch.from_numpy(launch.staging.copy()).to(device)
    pages = torch.from_numpy(launch.pages.astype(np.int64)).to(device)
    heads = slice(launch.head_start, launch.head_start + launch.num_heads)
    span = slice(launch.offset, launch.offset + launch.region_bytes)
    # region order is (K/V, layer, token, head, byte): K/V moves in front of the layer
    if launch.kernel == GATHER:
        staging[span] = pool[:, :, pages, :, heads, :].transpose(0, 1).reshape(-1)
    else:
        n, ps, hb = len(launch.pages), launch.pool.shape[3], launch.pool.shape[5]
        block = staging[span].reshape(2, launch.pool.shape[0], n, ps, launch.num_heads, hb).transpose(0, 1)
        pool[:, :, :, :, heads, :][:, :, pages] = block  # a basic slice is a view: this writes the pool
    return staging.cpu().numpy(), pool.cpu().numpy()


def _shim(launch: StagingLaunch, asan: bool, lib: ctypes.CDLL | None = None) -> tuple[np.ndarray, np.ndarray]:
    lib = lib or shim_library(launch.kernel, asan)
    entry = getattr(lib, f"kvsim_{launch.kernel}")
    pool, staging = launch.pool.copy(), launch.staging.copy()
    if not launch.num_tokens:
        return staging, pool
    if not asan:
        entry(*launch.grid, launch.threads, pool.ctypes.data, staging.ctypes.data + launch.offset,
              launch.pages.ctypes.data, *launch.scalars())
        return staging, pool
    with shim.Mallocs(lib) as mem:
        pool_ptr, staging_ptr = mem.put(pool), mem.put(staging)
        entry(*launch.grid, launch.threads, pool_ptr, staging_ptr + launch.offset, mem.put(launch.pages),
              *launch.scalars())
        return shim.read(staging_ptr, staging), shim.read(pool_ptr, pool)


def _cupy(launch: StagingLaunch) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    pool, staging = cupy.asarray(launch.pool.copy()), cupy.asarray(launch.staging.copy())
    if launch.num_tokens:
        s = launch.scalars()
        args = (pool, staging[launch.offset:], cupy.asarray(launch.pages), *(np.int64(v) for v in s[:6]),
                *(np.int32(v) for v in s[6:]))
        _cupy_function(launch.kernel)(launch.grid, (launch.threads,), args)
        cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(staging), cupy.asnumpy(pool)


BACKENDS: dict[str, Callable[[StagingLaunch], tuple[np.ndarray, np.ndarray]]] = {
    "torch-cpu": lambda l: _torch(l, "cpu"), "torch-cuda": lambda l: _torch(l, "cuda"),
    "cpu-shim": lambda l: _shim(l, False), "cpu-shim-asan": lambda l: _shim(l, True),
    "cupy-cuda": _cupy,
}


def gather_head_slice(backend: str, kv: np.ndarray, page_indices: Sequence[int] | np.ndarray,
                      params: HeadSliceParams, layout: StagingLayout, staging: np.ndarray | None = None,
                      offset: int | None = None, *, threads: int = THREADS, check_bounds: bool = True) -> np.ndarray:
    """The staging buffer after `backend` packed the writer's head slice of `page_indices` (a new array)."""
    require(backend in BACKENDS, "backend", f"one of {', '.join(BACKENDS)}", backend)
    launch = prepare(GATHER, kv, page_indices, params, layout, staging, offset, threads, check_bounds)
    return BACKENDS[backend](launch)[0]


def scatter_staging(backend: str, kv: np.ndarray, staging: np.ndarray, page_indices: Sequence[int] | np.ndarray,
                    params: HeadSliceParams, layout: StagingLayout, offset: int | None = None, *,
                    threads: int = THREADS, check_bounds: bool = True) -> np.ndarray:
    """The pool after `backend` scattered the writer's region of `staging` into `page_indices` (a new array)."""
    require(backend in BACKENDS, "backend", f"one of {', '.join(BACKENDS)}", backend)
    launch = prepare(SCATTER, kv, page_indices, params, layout, staging, offset, threads, check_bounds)
    return BACKENDS[backend](launch)[1].view(kv.dtype).reshape(kv.shape)
