"""`offload_swap` on every backend: the batched GPU<->CPU swap of vLLM's KV offload worker (0.33.0).

    offload_swap(backend, geometry, spec, gpu_to_cpu, src_buffers, dst_buffers, threads=128, segments=None)
        -> the dst buffers after the swap, as `kvsim.models.kv_offload.mapping.apply_swap` computes them

Buffers are 1-D uint8 arrays, one per KV tensor: on the GPU side `num_gpu_blocks x gpu_page_bytes`, on the CPU
side the chunk rows (`SwapGeometry.cpu_bytes`). The model's `plan_swap` validates the transfer and cuts it into
segments (one per KV cache group and data reference); the CUDA C source `offload_swap.cu` gets the segment
table and computes each triple's pointers itself (CuPy on a GPU, g++ through the CPU shim, with and without
ASan); the torch backends do the same arithmetic with tensor index operations on CPU or CUDA. `segments`
bypasses the plan (unchecked: how the ASan check hands the kernel a planted skip_count). Inputs are never
modified. Under `cpu-shim-asan` every tensor and every id list gets its own exact-size malloc.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kvsim.engine.canon import to_jsonable
from kvsim.engine.errors import require
from kvsim.models.kv_offload.mapping import (SwapGeometry, SwapSegment, TransferSpec, apply_swap, plan_swap,
                                             side_bytes)

from ...runtime import asan, shim
from ...runtime.family import Kernel

NAME = "offload_swap"
THREADS = 128
SEGMENT_FIELDS = 15
CUDA_GRID_X_LIMIT = 2**31 - 1
_U, _P, _I = ctypes.c_uint, ctypes.c_void_p, ctypes.c_int


@dataclass(frozen=True, eq=False)
class SwapLaunch:
    """The segments of one batched swap and the buffers on each side (1-D uint8, one per tensor)."""

    segments: tuple[SwapSegment, ...]
    src: tuple[np.ndarray, ...]
    dst: tuple[np.ndarray, ...]
    threads: int

    @property
    def num_ops(self) -> int:
        return sum(s.count for s in self.segments)

    def ids(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each segment's id lists as int32 arrays (upstream's `block_ids` dtype), at least one entry long."""
        return [(np.array(s.src_ids or (0,), dtype=np.int32), np.array(s.dst_ids or (0,), dtype=np.int32))
                for s in self.segments]

    def table(self, src_bases: Sequence[int], dst_bases: Sequence[int],
              id_ptrs: Sequence[tuple[int, int]]) -> np.ndarray:
        """The kernel's int64 segment table (field order in offload_swap.cu) for these addresses."""
        rows, first = [], 0
        for s, (src_ids, dst_ids) in zip(self.segments, id_ptrs):
            rows.append((first, s.count, src_bases[s.tensor_idx], dst_bases[s.tensor_idx], src_ids, dst_ids,
                         s.src_row_stride, s.dst_row_stride, s.src_sub_page, s.dst_sub_page, s.src_blocks_per_chunk,
                         s.dst_blocks_per_chunk, s.src_skip, s.dst_skip, s.size))
            first += s.count
        return np.array(rows or [(0,) * SEGMENT_FIELDS], dtype=np.int64).reshape(-1, SEGMENT_FIELDS)


def _buffers(what: str, buffers: Sequence[np.ndarray], sizes: Sequence[int]) -> tuple[np.ndarray, ...]:
    require(len(buffers) == len(sizes), what, f"{len(sizes)} buffers (one per tensor)", len(buffers))
    out = []
    for t, (b, n) in enumerate(zip(buffers, sizes)):
        require(isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.ndim == 1 and len(b) == n, f"{what}[{t}]",
                f"a 1-D uint8 array of {n} bytes", getattr(b, "shape", type(b).__name__))
        out.append(np.ascontiguousarray(b))
    return tuple(out)


def prepare(geometry: SwapGeometry, spec: TransferSpec, gpu_to_cpu: bool, src_buffers: Sequence[np.ndarray],
            dst_buffers: Sequence[np.ndarray], threads: int = THREADS,
            segments: Sequence[SwapSegment] | None = None) -> SwapLaunch:
    """Validate like the reference (`plan_swap`), unless `segments` are given (then only the buffers)."""
    require(isinstance(threads, int) and 1 <= threads <= 1024, "threads", "1..1024", threads)
    src = _buffers("src_buffers", src_buffers, side_bytes(geometry, gpu_to_cpu))
    dst = _buffers("dst_buffers", dst_buffers, side_bytes(geometry, not gpu_to_cpu))
    chosen = plan_swap(geometry, spec, gpu_to_cpu).segments if segments is None else tuple(segments)
    launch = SwapLaunch(chosen, src, dst, threads)
    require(launch.num_ops <= CUDA_GRID_X_LIMIT, "triples", f"at most {CUDA_GRID_X_LIMIT} (grid x)", launch.num_ops)
    return launch


# --- backends: each returns the new dst buffers ------------------------------------------------------------

def _torch(device: str, launch: SwapLaunch) -> list[np.ndarray]:
    import torch

    src = [torch.from_numpy(b.copy()).to(device) for b in launch.src]
    dst = [torch.from_numpy(b.copy()).to(device) for b in launch.dst]
    for s, (src_ids, dst_ids) in zip(launch.segments, launch.ids()):
        k = torch.arange(s.count, device=device, dtype=torch.int64)
        sides = []
        for ids, skip, bpc, row, sub in (
                (src_ids, s.src_skip, s.src_blocks_per_chunk, s.src_row_stride, s.src_sub_page),
                (dst_ids, s.dst_skip, s.dst_blocks_per_chunk, s.dst_row_stride, s.dst_sub_page)):
            pos = skip + k
            rows = torch.from_numpy(ids.astype(np.int64)).to(device)[pos // bpc]
            start = rows * row + (pos % bpc) * sub
            sides.append((start[:, None] + torch.arange(s.size, device=device)[None, :]).reshape(-1))
        dst[s.tensor_idx][sides[1]] = src[s.tensor_idx][sides[0]]
    return [b.cpu().numpy() for b in dst]


def _shim(lib: ctypes.CDLL, asan_build: bool, launch: SwapLaunch) -> list[np.ndarray]:
    dst = [b.copy() for b in launch.dst]
    if not launch.num_ops:
        return dst
    ids = launch.ids()
    if not asan_build:
        table = launch.table([b.ctypes.data for b in launch.src], [b.ctypes.data for b in dst],
                             [(a.ctypes.data, b.ctypes.data) for a, b in ids])
        lib.kvsim_offload_swap(launch.num_ops, launch.threads, table.ctypes.data, len(launch.segments))
        return dst
    with shim.Mallocs(lib) as mem:
        src_ptrs, dst_ptrs = [mem.put(b) for b in launch.src], [mem.put(b) for b in dst]
        table = launch.table(src_ptrs, dst_ptrs, [(mem.put(a), mem.put(b)) for a, b in ids])
        lib.kvsim_offload_swap(launch.num_ops, launch.threads, mem.put(table), len(launch.segments))
        return [shim.read(p, b) for p, b in zip(dst_ptrs, dst)]


def _cupy(function: Any, launch: SwapLaunch) -> list[np.ndarray]:
    import cupy

    src = [cupy.asarray(b.copy()) for b in launch.src]
    dst = [cupy.asarray(b.copy()) for b in launch.dst]
    if launch.num_ops:
        ids = [(cupy.asarray(a), cupy.asarray(b)) for a, b in launch.ids()]
        table = cupy.asarray(launch.table([b.data.ptr for b in src], [b.data.ptr for b in dst],
                                          [(a.data.ptr, b.data.ptr) for a, b in ids]))
        function((launch.num_ops,), (launch.threads,), (table, np.int32(len(launch.segments))))
        cupy.cuda.get_current_stream().synchronize()
    return [cupy.asnumpy(b) for b in dst]


def _reference(launch: SwapLaunch) -> list[np.ndarray]:
    """The model's memcpy of the launch's segments (valid segments only: the model refuses a planted one)."""
    from kvsim.models.kv_offload.mapping import CopyOp, SwapPlan, segment_offsets

    ops = tuple(CopyOp(s.tensor_idx, int(a), int(b), s.size) for s in launch.segments
                for a, b in zip(*segment_offsets(s)))
    return apply_swap(SwapPlan(True, launch.segments, ops, sum(o.size for o in ops)), launch.src, launch.dst)


KERNEL = Kernel(name=NAME, argtypes=(_U, _U, _P, _I), prepare=prepare, reference=_reference, torch=_torch, shim=_shim,
                cupy=_cupy)


def offload_swap(backend: str, geometry: SwapGeometry, spec: TransferSpec, gpu_to_cpu: bool,
                 src_buffers: Sequence[np.ndarray], dst_buffers: Sequence[np.ndarray], *, threads: int = THREADS,
                 segments: Sequence[SwapSegment] | None = None) -> list[np.ndarray]:
    """The dst buffers after `backend` ran the transfer's batched swap (new arrays)."""
    KERNEL.check(backend)
    return KERNEL.run(backend, prepare(geometry, spec, gpu_to_cpu, src_buffers, dst_buffers, threads, segments))


# --- the ASan child's half of a case: one batched swap, segments as given -----------------------------------

def case_document(geometry: SwapGeometry, gpu_to_cpu: bool, segments: Sequence[SwapSegment],
                  src_buffers: Sequence[np.ndarray], dst_buffers: Sequence[np.ndarray]) -> dict[str, Any]:
    """A swap as JSON: the geometry, the direction, the segments (possibly planted) and both sides bit-exact."""
    return {"geometry": to_jsonable(geometry), "gpu_to_cpu": bool(gpu_to_cpu),
            "segments": [to_jsonable(s) for s in segments], "src": [asan.pack(b) for b in src_buffers],
            "dst": [asan.pack(b) for b in dst_buffers]}


def _geometry(raw: Mapping[str, Any]) -> SwapGeometry:
    from kvsim.models.kv_offload.mapping import DataRef

    groups = tuple(tuple(DataRef(r["tensor_idx"], r["page_size_bytes"]) for r in refs)
                   for refs in raw["group_data_refs"])
    return SwapGeometry(tuple(raw["gpu_page_bytes"]), raw["num_gpu_blocks"], raw["num_cpu_chunks"],
                        raw["blocks_per_chunk"], groups, raw["cpu_row_padding"])


def run_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """In the ASan child: the segments as given (no plan check), every tensor and id list its own malloc; the
    SHA-256 of the dst buffers afterwards, concatenated."""
    segments = [SwapSegment(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
                for raw in document["segments"]]
    geometry = _geometry(document["geometry"])
    out = offload_swap("cpu-shim-asan", geometry, TransferSpec((), (), (), ()), document["gpu_to_cpu"],
                       [asan.unpack(d) for d in document["src"]], [asan.unpack(d) for d in document["dst"]],
                       segments=segments)
    joined = np.concatenate(out) if out else np.zeros(0, np.uint8)
    return {"sha256": asan.sha256(joined), "nbytes": int(joined.nbytes)}
