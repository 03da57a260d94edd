"""`zero_kv_blocks` on every backend: the segment-table kernel of vLLM's `KVBlockZeroer` (d6af803).

`zero_kv_blocks(backend, memory, table, block_ids)` takes what the reference
memset `kvsim.models.kv_zeroing.zeroer.zero_blocks` takes (a byte buffer whose offsets are
the segment addresses) and returns the bytes the backend produced, leaving
`memory` as it was. A differential check compares the two bit for bit.

The CUDA C backends launch `zero_kv_blocks.cu` on the grid (chunks,
segments, block IDs) with `chunk_width` threads per program; the torch
backends clear the same words with one vectorised index per batch. `KERNEL`
is the kernel's descriptor (`runtime.family.Kernel`); `case_document` /
`run_document` carry one case into the ASan child.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from kvsim.engine.canon import to_jsonable
from kvsim.engine.errors import check_int, require
from kvsim.models.kv_zeroing.geometry import Arena
from kvsim.models.kv_zeroing.zeroer import (FIXED, MAX_BLOCK_SIZE, Segment, SegmentTable, launch_config, write_spans,
                                            zero_blocks)

from ...runtime import asan
from ...runtime.family import Kernel

CUDA_GRID_YZ_LIMIT = 65_535
TORCH_BATCH_WORDS = 1 << 24  # bounds the index tensor of the torch backend to 128 MiB


@dataclass(frozen=True)
class Launch:
    """Kernel arguments: segment arrays (addresses are offsets into the buffer), block IDs and the grid."""

    addrs: np.ndarray
    strides: np.ndarray
    pages: np.ndarray
    ids: np.ndarray
    chunk_width: int
    max_chunks: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.max_chunks, len(self.addrs), len(self.ids)


def prepare(memory: np.ndarray, table: SegmentTable | Sequence[Segment], block_ids: Iterable[int],
            chunk_width: int | None = None) -> Launch:
    """Validate inputs like the reference does and compute the launch; every write must stay inside `memory`."""
    require(isinstance(memory, np.ndarray) and memory.dtype == np.uint8 and memory.ndim == 1, "memory",
            "a 1-D uint8 numpy array", type(memory).__name__)
    segments = table.segments if isinstance(table, SegmentTable) else tuple(table)
    require(bool(segments), "segments", "at least one segment", segments)
    ids = list(block_ids)
    spans = write_spans(table, ids)  # validates the IDs against num_blocks
    end = max((e for _, e in spans), default=0)
    require(end <= len(memory), "memory", f"a buffer covering every write (up to byte {end})",
            f"{len(memory)} bytes")
    pages = [s.page for s in segments]
    if chunk_width is None:
        chunk_width = launch_config(table if isinstance(table, SegmentTable) else SegmentTable(segments, 1),
                                    FIXED).block_size
    check_int(chunk_width, "chunk_width", minimum=1, maximum=MAX_BLOCK_SIZE)
    require(len(segments) <= CUDA_GRID_YZ_LIMIT, "segments", f"at most {CUDA_GRID_YZ_LIMIT} (grid y)", len(segments))
    require(len(ids) <= CUDA_GRID_YZ_LIMIT, "block_ids", f"at most {CUDA_GRID_YZ_LIMIT} (grid z)", len(ids))
    return Launch(addrs=np.array([s.addr for s in segments], dtype=np.uint64),
                  strides=np.array([s.block_stride for s in segments], dtype=np.int64),
                  pages=np.array(pages, dtype=np.int64), ids=np.array(ids, dtype=np.int64),
                  chunk_width=chunk_width, max_chunks=-(-max(pages) // chunk_width))


# --- torch -------------------------------------------------------------------------------------------

def _torch(device: str, memory: np.ndarray, launch: Launch, arena: Arena | None) -> np.ndarray:
    import torch

    require(len(memory) % 4 == 0, "memory", "a length that is a multiple of 4 (the torch backend views int32)",
            len(memory))
    require(not (launch.addrs % 4).any(), "segment addresses", "multiples of 4 for the torch backend",
            launch.addrs.tolist())
    mem = torch.from_numpy(memory).to(device)
    words = mem.view(torch.int32)
    # One row per (block, segment) pair; rows with the same page share one 2-D index (start + arange(page)).
    starts = ((launch.addrs // 4).astype(np.int64)[None, :] + launch.ids[:, None] * launch.strides[None, :]).ravel()
    pages = np.tile(launch.pages, len(launch.ids))
    for page in np.unique(pages).tolist():
        rows = torch.from_numpy(starts[pages == page]).to(device)
        step = max(1, TORCH_BATCH_WORDS // page)
        columns = torch.arange(page, device=device)
        for first in range(0, len(rows), step):
            words.index_fill_(0, (rows[first:first + step, None] + columns[None, :]).reshape(-1), 0)
    return mem.cpu().numpy()


# --- CPU shim ----------------------------------------------------------------------------------------

def _call(lib: ctypes.CDLL, launch: Launch, absolute: np.ndarray) -> None:
    if not len(launch.ids):
        return
    arrays = [np.ascontiguousarray(a) for a in (absolute, launch.strides, launch.pages, launch.ids)]
    lib.kvsim_zero_kv_blocks(*launch.grid, launch.chunk_width, *(a.ctypes.data for a in arrays))


def _shim(lib: ctypes.CDLL, asan: bool, memory: np.ndarray, launch: Launch, arena: Arena | None) -> np.ndarray:
    """Plain: on `memory` itself. ASan: one malloc per allocation of `arena` (not one arena), so a store past
    an allocation hits a red zone."""
    if not asan:
        _call(lib, launch, launch.addrs + np.uint64(memory.ctypes.data))
        return memory
    require(arena is not None, "arena", "the allocation layout (ASan checks each allocation separately)", arena)
    assert arena is not None
    pointers = [lib.kvsim_malloc(size) for size in arena.sizes]
    try:
        for ptr, base, size in zip(pointers, arena.bases, arena.sizes):
            ctypes.memmove(ptr, memory.ctypes.data + base, size)
        absolute = []
        for addr in launch.addrs.tolist():
            index = arena.allocation_at(addr)
            require(index is not None, "segment address", "inside an allocation", arena.describe(addr))
            absolute.append(pointers[index] + addr - arena.bases[index])
        _call(lib, launch, np.array(absolute, dtype=np.uint64))
        for ptr, base, size in zip(pointers, arena.bases, arena.sizes):
            ctypes.memmove(memory.ctypes.data + base, ptr, size)
    finally:
        for ptr in pointers:
            lib.kvsim_free(ptr)
    return memory


# --- CuPy --------------------------------------------------------------------------------------------

def _cupy(function: Any, memory: np.ndarray, launch: Launch, arena: Arena | None) -> np.ndarray:
    import cupy

    device_memory = cupy.asarray(memory)
    if len(launch.ids):
        args = (cupy.asarray(launch.addrs + np.uint64(device_memory.data.ptr)), cupy.asarray(launch.strides),
                cupy.asarray(launch.pages), cupy.asarray(launch.ids))
        function(launch.grid, (launch.chunk_width,), args)
        cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(device_memory)


_U32, _PTR = ctypes.c_uint, ctypes.c_void_p
KERNEL = Kernel(name="zero_kv_blocks", argtypes=(_U32, _U32, _U32, _U32, _PTR, _PTR, _PTR, _PTR), prepare=prepare,
                reference=zero_blocks, torch=_torch, shim=_shim, cupy=_cupy)
BACKENDS = KERNEL.backends  # backend -> fn(memory, launch, arena) -> the bytes after the launch


def zero_kv_blocks(backend: str, memory: np.ndarray, table: SegmentTable | Sequence[Segment],
                   block_ids: Iterable[int], *, chunk_width: int | None = None,
                   arena: Arena | None = None) -> np.ndarray:
    """Run the zeroing kernel on `backend` over a copy of `memory`; return the resulting bytes.

    `chunk_width` is the kernel's `BLOCK_SIZE` (threads per program, int32
    words), default the fixed launcher's choice; the torch backends ignore
    it. `arena` is required by `cpu-shim-asan`, which gives every allocation
    its own malloc.
    """
    KERNEL.check(backend)
    launch = prepare(memory, table, block_ids, chunk_width)
    return KERNEL.run(backend, memory.copy(), launch, arena)


# --- the ASan child's half of a case -------------------------------------------------------------------

def case_document(arena: Arena, table: SegmentTable, block_ids: Sequence[int], *, fill: int = 0xA5,
                  chunk_width: int | None = None) -> dict[str, Any]:
    """Zero `block_ids` by `table` on an arena filled with `fill`: the segments, not the planning variant."""
    return {"arena": to_jsonable(arena), "segments": to_jsonable(table.segments), "num_blocks": table.num_blocks,
            "block_ids": list(block_ids), "fill": fill, "chunk_width": chunk_width}


def run_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """In the ASan child: one malloc per allocation; the SHA-256 of the arena bytes afterwards."""
    raw = document["arena"]
    arena = Arena(tuple(raw["bases"]), tuple(raw["sizes"]), raw["size"])
    table = SegmentTable(tuple(Segment(s["addr"], s["block_stride"], s["page"], tuple(s.get("layers", ())))
                               for s in document["segments"]), document["num_blocks"])
    memory = np.full(arena.size, document["fill"], dtype=np.uint8)
    out = zero_kv_blocks("cpu-shim-asan", memory, table, document["block_ids"],
                         chunk_width=document.get("chunk_width"), arena=arena)
    return {"sha256": asan.sha256(out), "zero_bytes": int((out == 0).sum())}
