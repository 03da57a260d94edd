"""FlashInfer's base-2 `merge_state` on every backend: the CUDA C source `merge_state.cu` (CuPy on a GPU, g++
through the CPU shim, with and without ASan) and torch on CPU or CUDA, against
`kvsim.models.mla_backends.merge.merge_state`.

    merge_state(backend, v_a, s_a, v_b, s_b, threads=32) -> (v [T, H, D], s [T, H]) in float32

Under `cpu-shim-asan` every array gets its own exact-size malloc, so one element past any array is a red zone.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from kvsim.engine.errors import require
from kvsim.models.mla_backends.merge import merge_state as merge_reference

from ...runtime import asan, shim
from ...runtime.family import Kernel

NAME = "merge_state"
_I, _P, _U = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint


@dataclass(frozen=True)
class MergeStateLaunch:
    v_a: np.ndarray  # [T, H, D] float32, contiguous
    s_a: np.ndarray  # [T, H] float32
    v_b: np.ndarray
    s_b: np.ndarray
    threads: int

    @property
    def shape(self) -> tuple[int, int, int]:
        t, h, d = self.v_a.shape
        return t, h, d


def prepare(v_a: np.ndarray, s_a: np.ndarray, v_b: np.ndarray, s_b: np.ndarray, *,
            threads: int = 32) -> MergeStateLaunch:
    require(v_a.ndim == 3 and v_a.shape == v_b.shape, "v", "equal [T, H, D] shapes", (v_a.shape, v_b.shape))
    t, h, _ = v_a.shape
    require(s_a.shape == s_b.shape == (t, h), "s", f"[T, H] = {(t, h)}", (s_a.shape, s_b.shape))
    require(h <= 65_535, "num_heads", "at most 65535 (grid y)", h)
    require(isinstance(threads, int) and 1 <= threads <= 1024, "threads", "1..1024", threads)
    dense = [np.ascontiguousarray(x, dtype=np.float32) for x in (v_a, s_a, v_b, s_b)]
    return MergeStateLaunch(*dense, threads=threads)


def _torch(device: str, launch: MergeStateLaunch) -> tuple[np.ndarray, np.ndarray]:
    import torch

    v_a, s_a, v_b, s_b = (torch.from_numpy(x).to(device) for x in (launch.v_a, launch.s_a, launch.v_b, launch.s_b))
    m = torch.maximum(s_a, s_b)
    shift = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w_a, w_b = torch.exp2(s_a - shift), torch.exp2(s_b - shift)
    total = w_a + w_b
    denom = torch.where(total > 0, total, torch.ones_like(total))
    v = (v_a * w_a[..., None] + v_b * w_b[..., None]) / denom[..., None]
    return v.cpu().numpy(), (shift + torch.log2(total)).cpu().numpy()


def _shim(lib: ctypes.CDLL, asan_build: bool, launch: MergeStateLaunch) -> tuple[np.ndarray, np.ndarray]:
    t, h, d = launch.shape
    v = np.full(launch.v_a.shape, np.nan, dtype=np.float32)
    s = np.full(launch.s_a.shape, np.nan, dtype=np.float32)
    ins = (launch.v_a, launch.s_a, launch.v_b, launch.s_b)
    if not t or not h:
        return v, s
    if not asan_build:
        lib.kvsim_merge_state(t, h, launch.threads, *(a.ctypes.data for a in ins), v.ctypes.data, s.ctypes.data,
                              t, h, d)
        return v, s
    with shim.Mallocs(lib) as mem:
        pointers = [mem.put(a) for a in ins]
        v_ptr, s_ptr = mem.put(v), mem.put(s)
        lib.kvsim_merge_state(t, h, launch.threads, *pointers, v_ptr, s_ptr, t, h, d)
        return shim.read(v_ptr, v), shim.read(s_ptr, s)


def _cupy(function: Any, launch: MergeStateLaunch) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    t, h, d = launch.shape
    v = cupy.full(launch.v_a.shape, np.nan, dtype=cupy.float32)
    s = cupy.full(launch.s_a.shape, np.nan, dtype=cupy.float32)
    if t and h:
        args = (*(cupy.asarray(a) for a in (launch.v_a, launch.s_a, launch.v_b, launch.s_b)), v, s,
                np.int32(t), np.int32(h), np.int32(d))
        function((t, h), (launch.threads,), args)
        cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(v), cupy.asnumpy(s)


KERNEL = Kernel(name=NAME, argtypes=(_U, _U, _U, _P, _P, _P, _P, _P, _P, _I, _I, _I), prepare=prepare,
                reference=merge_reference, torch=_torch, shim=_shim, cupy=_cupy)


def merge_state(backend: str, v_a: np.ndarray, s_a: np.ndarray, v_b: np.ndarray, s_b: np.ndarray, *,
                threads: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """`(v, s)` merged on `backend` (base-2 LSEs, float32)."""
    KERNEL.check(backend)
    return KERNEL.run(backend, prepare(v_a, s_a, v_b, s_b, threads=threads))


def case_document(v_a: np.ndarray, s_a: np.ndarray, v_b: np.ndarray, s_b: np.ndarray, threads: int) -> dict[str, Any]:
    return {"arrays": [asan.pack(np.asarray(x, np.float32)) for x in (v_a, s_a, v_b, s_b)], "threads": threads}


def run_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """In the ASan child: the merge on `cpu-shim-asan`; the SHA-256 of the merged bytes."""
    v, s = merge_state("cpu-shim-asan", *(asan.unpack(a) for a in document["arrays"]), threads=document["threads"])
    return {"sha256": asan.sha256(np.concatenate([v.ravel(), s.ravel()])), "shape": list(v.shape)}
