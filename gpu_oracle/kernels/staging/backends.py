"""SGLang PD staging kernels on every backend: the prefill head-slice gather and the decode scatter (05c7ebf).

    gather_head_slice(backend, kv, page_indices, params, layout, staging=None, offset=None)
        -> the staging bytes, as `kvsim.models.pd_staging.copy.gather_head_slice_to_staging` computes them
    scatter_staging(backend, kv, staging, page_indices, params, layout, offset=None)
        -> the pool after the scatter, as `kvsim.models.pd_staging.copy.scatter_staging_to_pages` computes it

The CUDA C sources are `staging_gather_head_slice.cu` and
`staging_scatter.cu` (CuPy on a GPU, g++ through the CPU shim, with and
without ASan); the torch backends do the same with index operations on CPU or
CUDA. Inputs are never modified: each call returns a new array. Under
`cpu-shim-asan` the pool, the page list and the staging buffer each get their
own exact-size malloc, so a writer region that does not fit its slot
(`check_bounds=False`, the pre-05c7ebf multi-slot send) stores into a red zone.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kvsim.engine.canon import to_jsonable
from kvsim.engine.errors import check_int, require
from kvsim.models.pd_staging.copy import check_paged_kv, gather_head_slice_to_staging, scatter_staging_to_pages
from kvsim.models.pd_staging.layout import HeadSliceParams, StagingLayout

from ...runtime import asan, shim
from ...runtime.family import Kernel

GATHER, SCATTER = "staging_gather_head_slice", "staging_scatter"
KERNELS = (GATHER, SCATTER)
THREADS = 128
_LL, _I, _P, _U = ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint
_ARGTYPES = (_U, _U, _U, _P, _P, _P, _LL, _LL, _LL, _LL, _LL, _LL, _I, _I, _I, _I, _I)  # both kernels

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

def _torch(device: str, launch: StagingLaunch) -> tuple[np.ndarray, np.ndarray]:
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


def _shim(lib: ctypes.CDLL, asan: bool, launch: StagingLaunch) -> tuple[np.ndarray, np.ndarray]:
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


def _cupy(function: Any, launch: StagingLaunch) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    pool, staging = cupy.asarray(launch.pool.copy()), cupy.asarray(launch.staging.copy())
    if launch.num_tokens:
        s = launch.scalars()
        args = (pool, staging[launch.offset:], cupy.asarray(launch.pages), *(np.int64(v) for v in s[:6]),
                *(np.int32(v) for v in s[6:]))
        function(launch.grid, (launch.threads,), args)
        cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(staging), cupy.asnumpy(pool)


# backend -> fn(launch) -> (new staging, new pool bytes); one launch function serves both kernels
GATHER_KERNEL = Kernel(name=GATHER, argtypes=_ARGTYPES, prepare=prepare, reference=gather_head_slice_to_staging,
                       torch=_torch, shim=_shim, cupy=_cupy)
SCATTER_KERNEL = Kernel(name=SCATTER, argtypes=_ARGTYPES, prepare=prepare, reference=scatter_staging_to_pages,
                        torch=_torch, shim=_shim, cupy=_cupy)


def gather_head_slice(backend: str, kv: np.ndarray, page_indices: Sequence[int] | np.ndarray,
                      params: HeadSliceParams, layout: StagingLayout, staging: np.ndarray | None = None,
                      offset: int | None = None, *, threads: int = THREADS, check_bounds: bool = True) -> np.ndarray:
    """The staging buffer after `backend` packed the writer's head slice of `page_indices` (a new array)."""
    GATHER_KERNEL.check(backend)
    launch = prepare(GATHER, kv, page_indices, params, layout, staging, offset, threads, check_bounds)
    return GATHER_KERNEL.run(backend, launch)[0]


def scatter_staging(backend: str, kv: np.ndarray, staging: np.ndarray, page_indices: Sequence[int] | np.ndarray,
                    params: HeadSliceParams, layout: StagingLayout, offset: int | None = None, *,
                    threads: int = THREADS, check_bounds: bool = True) -> np.ndarray:
    """The pool after `backend` scattered the writer's region of `staging` into `page_indices` (a new array)."""
    SCATTER_KERNEL.check(backend)
    launch = prepare(SCATTER, kv, page_indices, params, layout, staging, offset, threads, check_bounds)
    return SCATTER_KERNEL.run(backend, launch)[1].view(kv.dtype).reshape(kv.shape)


# --- the ASan child's half of a case: one writer's copy, unchecked ----------------------------------------

def case_document(kernel: str, pool: np.ndarray, pages: Sequence[int], params: HeadSliceParams,
                  layout: StagingLayout, staging: np.ndarray, offset: int) -> dict[str, Any]:
    """A copy as JSON (`kernel`: "gather" or "scatter"): pool and staging buffer bit-exact, head slice, layout."""
    return {"kernel": kernel, "pool": asan.pack(pool), "pages": [int(p) for p in pages], "params": to_jsonable(params),
            "layout": to_jsonable(layout), "staging": asan.pack(np.asarray(staging, dtype=np.uint8)),
            "offset": int(offset)}


def run_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """In the ASan child: the copy without a bounds check (a layout larger than the slot must reach the kernel
    for ASan to stop it), the staging buffer its own malloc; the SHA-256 of the result (buffer or pool)."""
    raw = document["layout"]
    lay = StagingLayout(raw["tokens"], raw["num_layers"], raw["head_bytes"], tuple(raw["writer_heads"]))
    pool, staging, params = asan.unpack(document["pool"]), asan.unpack(document["staging"]), \
        HeadSliceParams(**document["params"])
    if document["kernel"] == "gather":
        out = gather_head_slice("cpu-shim-asan", pool, document["pages"], params, lay, staging, document["offset"],
                                check_bounds=False)
    else:
        out = scatter_staging("cpu-shim-asan", pool, staging, document["pages"], params, lay, document["offset"],
                              check_bounds=False)
    return {"sha256": asan.sha256(out), "nbytes": int(out.nbytes)}
