"""MLA chunked-context kernels on every backend: the context gather and `merge_attn_states` (vLLM b38e111d).

    gather_mla_context(backend, kv_cache, block_table, cu_seq_lens, token_to_seq, seq_starts)
        -> workspace rows, the arguments and result of `kvsim.models.mla_chunks.attention.gather_context_rows`
    merge_attn_states(backend, prefix_output, prefix_lse, suffix_output, suffix_lse, ...)
        -> MergeOutput (fp32 output, LSE, and whether the padding of a strided output was left alone)

The CUDA C sources are `gather_mla_context.cu` and `merge_attn_states.cu`
(CuPy on a GPU, g++ through the CPU shim, with and without ASan); the torch backends
compute the same thing with index and elementwise operations on CPU or CUDA. Under
`cpu-shim-asan` every argument gets its own exact-size malloc, so one element past any
array is a red zone. The gather moves bytes, so any cache dtype works and the result is
compared bit for bit; the merge runs in fp32.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kvsim.engine.errors import require
from kvsim.models.mla_chunks.attention import gather_context_rows
from kvsim.models.mla_chunks.attention import merge_attn_states as merge_reference

from ...runtime import asan, shim
from ...runtime.family import Kernel

GATHER, MERGE = "gather_mla_context", "merge_attn_states"
KERNELS = (GATHER, MERGE)
GATHER_THREADS = 64  # upstream: one CTA of 64 threads per workspace row
PAD_SENTINEL = np.float32(-7777.25)  # exact in fp32; a strided output's padding must keep it
_LL, _I, _P, _U = ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint


def _span(view: np.ndarray) -> np.ndarray:
    """The bytes from a strided view's first element to its last, as a flat copy (what a device buffer holds)."""
    if view.size == 0:
        return np.zeros(0, dtype=np.uint8)
    end = sum((n - 1) * s for n, s in zip(view.shape, view.strides)) + view.itemsize
    return np.lib.stride_tricks.as_strided(view.view(np.uint8), shape=(end,), strides=(1,)).copy()


# --- gather ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GatherLaunch:
    """Kernel arguments: the cache as bytes `[num_blocks, block_size, entry_bytes]` and int32 metadata."""

    cache: np.ndarray
    block_table: np.ndarray
    cu_seq_lens: np.ndarray
    token_to_seq: np.ndarray
    seq_starts: np.ndarray
    threads: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_to_seq)

    def scalars(self) -> tuple[int, int, int, int, int, int]:
        c = self.cache
        return (self.block_table.shape[1], c.strides[0], c.strides[1], c.shape[2], c.shape[1], self.num_tokens)


def _int32(values: Sequence[int] | np.ndarray, field: str, ndim: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.int64)
    require(array.ndim == ndim, field, f"{ndim}-D integers", array.shape)
    require(not array.size or (array.min() >= -2**31 and array.max() < 2**31), field, "int32 values", array)
    return np.ascontiguousarray(array.astype(np.int32))


def prepare_gather(kv_cache: np.ndarray, block_table: np.ndarray, cu_seq_lens: Sequence[int],
                   token_to_seq: Sequence[int], seq_starts: Sequence[int], *, threads: int = GATHER_THREADS,
                   check_bounds: bool = True) -> GatherLaunch:
    """Validate like the reference indexes; `check_bounds=False` lets wrong metadata through (for ASan)."""
    require(isinstance(kv_cache, np.ndarray) and kv_cache.ndim == 3 and kv_cache.strides[2] == kv_cache.itemsize
            and min(kv_cache.strides) >= 0, "kv_cache", "a [num_blocks, block_size, D] array, last axis dense",
            getattr(kv_cache, "shape", type(kv_cache).__name__))
    require(isinstance(threads, int) and 1 <= threads <= 1024, "threads", "1..1024", threads)
    launch = GatherLaunch(kv_cache.view(np.uint8), _int32(block_table, "block_table", 2),
                          _int32(cu_seq_lens, "cu_seq_lens", 1), _int32(token_to_seq, "token_to_seq", 1),
                          _int32(seq_starts, "seq_starts", 1), threads)
    if check_bounds and launch.num_tokens:
        seq, cu, starts = (a.astype(np.int64) for a in (launch.token_to_seq, launch.cu_seq_lens, launch.seq_starts))
        rows = min(len(cu), len(starts), launch.block_table.shape[0])
        require(seq.min() >= 0 and seq.max() < rows, "token_to_seq", f"requests in [0, {rows})", seq.tolist())
        pos = starts[seq] + np.arange(len(seq)) - cu[seq]
        require(pos.min() >= 0, "cu_seq_lens", "rows at non-negative positions", pos.tolist())
        slots = pos // kv_cache.shape[1]
        require(slots.max() < launch.block_table.shape[1], "block_table", f"{slots.max() + 1} columns",
                launch.block_table.shape)
        blocks = launch.block_table.astype(np.int64)[seq, slots]
        require(blocks.min() >= 0 and blocks.max() < kv_cache.shape[0], "block_table",
                f"block ids in [0, {kv_cache.shape[0]})", blocks.tolist())
    return launch


def _gather_torch(device: str, launch: GatherLaunch) -> np.ndarray:
    import torch

    def tensor(a: np.ndarray) -> "torch.Tensor":
        return torch.from_numpy(a.astype(np.int64)).to(device)

    cache = torch.from_numpy(launch.cache).to(device)
    seq, cu, starts = tensor(launch.token_to_seq), tensor(launch.cu_seq_lens), tensor(launch.seq_starts)
    pos = starts[seq] + torch.arange(launch.num_tokens, device=device) - cu[seq]
    blocks = tensor(launch.block_table)[seq, pos // launch.cache.shape[1]]
    return cache[blocks, pos % launch.cache.shape[1]].cpu().numpy()


def _gather_shim(lib: ctypes.CDLL, asan: bool, launch: GatherLaunch) -> np.ndarray:
    out = np.zeros((launch.num_tokens, launch.cache.shape[2]), dtype=np.uint8)
    meta = (launch.block_table, launch.cu_seq_lens, launch.token_to_seq, launch.seq_starts)
    if not launch.num_tokens:
        return out
    if not asan:
        lib.kvsim_gather_mla_context(launch.num_tokens, launch.threads, launch.cache.ctypes.data, out.ctypes.data,
                                     *(a.ctypes.data for a in meta), *launch.scalars())
        return out
    with shim.Mallocs(lib) as mem:
        cache, dst = mem.put(_span(launch.cache)), mem.put(out)
        lib.kvsim_gather_mla_context(launch.num_tokens, launch.threads, cache, dst, *(mem.put(a) for a in meta),
                                     *launch.scalars())
        return shim.read(dst, out)


def _gather_cupy(function: Any, launch: GatherLaunch) -> np.ndarray:
    import cupy

    out = cupy.zeros((launch.num_tokens, launch.cache.shape[2]), dtype=cupy.uint8)
    if launch.num_tokens:
        ll = [np.int64(v) for v in launch.scalars()[:4]]
        args = (cupy.asarray(_span(launch.cache)), out,
                *(cupy.asarray(a) for a in (launch.block_table, launch.cu_seq_lens, launch.token_to_seq,
                                            launch.seq_starts)),
                *ll, np.int32(launch.cache.shape[1]), np.int32(launch.num_tokens))
        function((launch.num_tokens,), (launch.threads,), args)
        cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(out)


GATHER_KERNEL = Kernel(name=GATHER, argtypes=(_U, _U, _P, _P, _P, _P, _P, _P, _LL, _LL, _LL, _LL, _I, _I),
                       prepare=prepare_gather, reference=gather_context_rows, torch=_gather_torch,
                       shim=_gather_shim, cupy=_gather_cupy)
GATHER_BACKENDS = GATHER_KERNEL.backends  # backend -> fn(launch) -> workspace bytes


def gather_mla_context(backend: str, kv_cache: np.ndarray, block_table: np.ndarray, cu_seq_lens: Sequence[int],
                       token_to_seq: Sequence[int], seq_starts: Sequence[int], *, threads: int = GATHER_THREADS,
                       check_bounds: bool = True) -> np.ndarray:
    """Workspace rows `[len(token_to_seq), D]` in `kv_cache`'s dtype, gathered by `backend`."""
    GATHER_KERNEL.check(backend)
    launch = prepare_gather(kv_cache, block_table, cu_seq_lens, token_to_seq, seq_starts, threads=threads,
                            check_bounds=check_bounds)
    rows = GATHER_KERNEL.run(backend, launch)
    return np.ascontiguousarray(rows).view(kv_cache.dtype).reshape(launch.num_tokens, kv_cache.shape[2])


# --- merge_attn_states -------------------------------------------------------------------------------

@dataclass(frozen=True)
class MergeLaunch:
    """fp32 buffers: outputs `[T, H, D]` inside flat buffers with strides (token, head, 1); LSEs `[H, T]`."""

    prefix: np.ndarray  # flat padded buffers
    suffix: np.ndarray
    prefix_lse: np.ndarray
    suffix_lse: np.ndarray
    shape: tuple[int, int, int]
    token_stride: int
    head_stride: int
    threads: int
    with_lse: bool

    def view(self, flat: np.ndarray) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(flat, self.shape, (self.token_stride * 4, self.head_stride * 4, 4))


@dataclass(frozen=True, eq=False)
class MergeOutput:
    output: np.ndarray  # [T, H, D] float32
    lse: np.ndarray | None  # [H, T] float32, None when the launch wrote none
    padding_untouched: bool  # every padding element of the strided output still holds PAD_SENTINEL


def prepare_merge(prefix_output: np.ndarray, prefix_lse: np.ndarray, suffix_output: np.ndarray,
                  suffix_lse: np.ndarray, *, head_pad: int = 0, token_pad: int = 0, threads: int = 32,
                  with_lse: bool = True) -> MergeLaunch:
    """Cast to fp32 and lay the outputs out with `head_pad`/`token_pad` extra elements per head/token."""
    require(prefix_output.ndim == 3 and prefix_output.shape == suffix_output.shape, "outputs",
            "equal [T, H, D] shapes", (prefix_output.shape, suffix_output.shape))
    t, h, d = prefix_output.shape
    require(prefix_lse.shape == suffix_lse.shape == (h, t), "lse", f"[H, T] = {(h, t)}",
            (prefix_lse.shape, suffix_lse.shape))
    require(h <= 65_535, "num_heads", "at most 65535 (grid y)", h)
    require(isinstance(threads, int) and 1 <= threads <= 1024, "threads", "1..1024", threads)
    require(head_pad >= 0 and token_pad >= 0, "padding", "non-negative", (head_pad, token_pad))
    head_stride = d + head_pad
    token_stride = h * head_stride + token_pad
    size = t * token_stride

    def padded(x: np.ndarray) -> np.ndarray:
        flat = np.full(size, PAD_SENTINEL, dtype=np.float32)
        launch_view = np.lib.stride_tricks.as_strided(flat, (t, h, d), (token_stride * 4, head_stride * 4, 4))
        launch_view[...] = x.astype(np.float32)
        return flat

    return MergeLaunch(padded(prefix_output), padded(suffix_output),
                       np.ascontiguousarray(prefix_lse, dtype=np.float32),
                       np.ascontiguousarray(suffix_lse, dtype=np.float32), (t, h, d), token_stride, head_stride,
                       threads, with_lse)


def _merge_torch(device: str, launch: MergeLaunch) -> tuple[np.ndarray, np.ndarray]:
    import torch

    t, h, d = launch.shape
    strides = (launch.token_stride, launch.head_stride, 1)

    def view(flat: np.ndarray) -> "torch.Tensor":
        return torch.from_numpy(flat).to(device).as_strided((t, h, d), strides)

    inf = torch.tensor(float("inf"), device=device)
    lp, ls = (torch.from_numpy(x).to(device) for x in (launch.prefix_lse, launch.suffix_lse))
    lp, ls = torch.where(lp == inf, -inf, lp), torch.where(ls == inf, -inf, ls)  # FA2: +inf is an empty row
    peak = torch.maximum(lp, ls)
    empty = peak == -inf
    safe = torch.where(empty, torch.zeros_like(peak), peak)  # keeps -inf - -inf from making NaN
    wp, ws = torch.exp(lp - safe), torch.exp(ls - safe)
    total = torch.where(empty, torch.ones_like(peak), wp + ws)
    merged = view(launch.prefix) * (wp / total).T[..., None] + view(launch.suffix) * (ws / total).T[..., None]
    merged = torch.where(empty.T[..., None], torch.zeros_like(merged), merged)
    out = torch.from_numpy(np.full(len(launch.prefix), PAD_SENTINEL, dtype=np.float32)).to(device)
    out.as_strided((t, h, d), strides).copy_(merged)
    lse = torch.where(empty, -inf, safe + torch.log(total))
    return out.cpu().numpy(), lse.cpu().numpy()


def _merge_shim(lib: ctypes.CDLL, asan: bool, launch: MergeLaunch) -> tuple[np.ndarray, np.ndarray]:
    t, h, d = launch.shape
    out = np.full(len(launch.prefix), PAD_SENTINEL, dtype=np.float32)
    lse = np.full((h, t), np.nan, dtype=np.float32)
    ins = (launch.prefix, launch.prefix_lse, launch.suffix, launch.suffix_lse)
    scalars = (t, d, launch.token_stride, launch.head_stride)
    if not t or not h:
        return out, lse
    if not asan:
        lib.kvsim_merge_attn_states(t, h, launch.threads, out.ctypes.data, lse.ctypes.data if launch.with_lse else
                                    None, *(a.ctypes.data for a in ins), *scalars)
        return out, lse
    with shim.Mallocs(lib) as mem:
        out_ptr, lse_ptr = mem.put(out), mem.put(lse)
        lib.kvsim_merge_attn_states(t, h, launch.threads, out_ptr, lse_ptr if launch.with_lse else None,
                                    *(mem.put(a) for a in ins), *scalars)
        return shim.read(out_ptr, out), shim.read(lse_ptr, lse)


def _merge_cupy(function: Any, launch: MergeLaunch) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    t, h, d = launch.shape
    out = cupy.asarray(np.full(len(launch.prefix), PAD_SENTINEL, dtype=np.float32))
    lse = cupy.asarray(np.full((h, t), np.nan, dtype=np.float32))  # always passed: no null pointer through CuPy
    if t and h:
        args = (out, lse, *(cupy.asarray(a) for a in (launch.prefix, launch.prefix_lse, launch.suffix,
                                                      launch.suffix_lse)),
                np.int32(t), np.int32(d), np.int64(launch.token_stride), np.int64(launch.head_stride))
        function((t, h), (launch.threads,), args)
        cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(out), cupy.asnumpy(lse)


MERGE_KERNEL = Kernel(name=MERGE, argtypes=(_U, _U, _U, _P, _P, _P, _P, _P, _P, _I, _I, _LL, _LL),
                      prepare=prepare_merge, reference=merge_reference, torch=_merge_torch, shim=_merge_shim,
                      cupy=_merge_cupy)
MERGE_BACKENDS = MERGE_KERNEL.backends  # backend -> fn(launch) -> (flat output, lse)


def merge_attn_states(backend: str, prefix_output: np.ndarray, prefix_lse: np.ndarray, suffix_output: np.ndarray,
                      suffix_lse: np.ndarray, *, head_pad: int = 0, token_pad: int = 0, threads: int = 32,
                      with_lse: bool = True) -> MergeOutput:
    """Merge two `(output [T, H, D], lse [H, T])` states in fp32 on `backend`, into a padded output buffer."""
    MERGE_KERNEL.check(backend)
    launch = prepare_merge(prefix_output, prefix_lse, suffix_output, suffix_lse, head_pad=head_pad,
                           token_pad=token_pad, threads=threads, with_lse=with_lse)
    flat, lse = MERGE_KERNEL.run(backend, launch)
    covered = np.zeros(len(flat), dtype=bool)
    np.lib.stride_tricks.as_strided(covered, launch.shape, (launch.token_stride, launch.head_stride, 1))[...] = True
    return MergeOutput(launch.view(flat).copy(), lse if with_lse else None,
                       bool((flat[~covered] == PAD_SENTINEL).all()))


# --- the ASan child's half of a case: a gather with the metadata as given ---------------------------

def case_document(kv_cache: np.ndarray, block_table: np.ndarray, cu_seq_lens: Sequence[int],
                  token_to_seq: Sequence[int], seq_starts: Sequence[int]) -> dict[str, Any]:
    """A gather case as JSON: the cache bit-exact (NaN payloads included) and the metadata."""
    return {"kv_cache": asan.pack(kv_cache), "block_table": np.asarray(block_table).tolist(),
            "cu_seq_lens": [int(x) for x in cu_seq_lens], "token_to_seq": [int(x) for x in token_to_seq],
            "seq_starts": [int(x) for x in seq_starts]}


def run_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """In the ASan child: the gather without a bounds check (wrong metadata must reach the kernel for ASan to
    stop it), every array its own malloc; the SHA-256 of the workspace bytes."""
    rows = gather_mla_context("cpu-shim-asan", asan.unpack(document["kv_cache"]),
                              np.array(document["block_table"], dtype=np.int64), document["cu_seq_lens"],
                              document["token_to_seq"], document["seq_starts"], check_bounds=False)
    return {"sha256": asan.sha256(rows), "shape": list(rows.shape)}
