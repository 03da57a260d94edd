"""The worker side of vLLM's KV offload: GPU blocks into CPU chunk slots (research note vllm.md 3.2, "GPU<->CPU
transfer"; vLLM 0.33.0 `vllm/v1/kv_offload/cpu/gpu_worker.py`).

Each GPU KV tensor `t` is viewed as bytes `(num_gpu_blocks, gpu_page_bytes[t])`; its CPU twin is
`(num_cpu_chunks, gpu_page_bytes[t] * blocks_per_chunk)` with a row stride that may exceed the row (the mmap
worker views), so sub-block `j` of chunk slot `c` starts at byte `c * row_stride + j * gpu_page_bytes[t]`.
A transfer names GPU block ids and CPU chunk ids per KV cache group; a group's blocks are logically
contiguous from `block_indices[g]`, so its first chunk may be partial: the first
`skip_count = block_indices[g] % blocks_per_chunk` sub-blocks of that chunk are not part of the transfer (the
last chunk may be partial too: the enumeration stops after `group_sizes[g]` sub-blocks). For every group and
every data reference of it (`DataRef`: tensor and un-padded `page_size_bytes`), block `k` of the group is one
`(src, dst, size)` copy of `page_size_bytes`; all of them form one batched swap (`ops.swap_blocks_batch`).

    plan_swap(geometry, spec, gpu_to_cpu) -> SwapPlan        the segments (one per group x data ref) and copies
    apply_swap(plan, src_buffers, dst_buffers) -> new dst    the reference memcpy of a plan, per tensor

Names follow upstream: `blocks_per_chunk`, `skip_count`, `group_sizes`, `block_indices`, `page_size_bytes`,
`tensor_idx`, `src_blocks_per_chunk` / `dst_blocks_per_chunk` (1 on the GPU side), `compute_sub_block_ptrs`
(here `compute_sub_block_offsets`: byte offsets from the tensor's base instead of pointers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kvsim.engine.errors import check_int, require

MAX_BLOCKS_PER_CHUNK = 1024
MAX_PAGE_BYTES = 1 << 24


@dataclass(frozen=True)
class DataRef:
    """Upstream `CanonicalKVCacheRef` without a canonical mapping: the tensor a layer (group) reads, and its
    un-padded page size in bytes (at most the tensor's page)."""

    tensor_idx: int
    page_size_bytes: int


@dataclass(frozen=True)
class SwapGeometry:
    """The KV tensors on both sides and how the groups use them."""

    gpu_page_bytes: tuple[int, ...]  # per tensor: the (padded) GPU page, the GPU row stride
    num_gpu_blocks: int
    num_cpu_chunks: int
    blocks_per_chunk: int
    group_data_refs: tuple[tuple[DataRef, ...], ...]  # per KV cache group
    cpu_row_padding: int = 0  # bytes between a CPU row's end and the next row (row_stride - cpu_page_size)

    def __post_init__(self) -> None:
        require(len(self.gpu_page_bytes) >= 1, "gpu_page_bytes", "at least one tensor", self.gpu_page_bytes)
        for page in self.gpu_page_bytes:
            check_int(page, "gpu_page_bytes", minimum=1, maximum=MAX_PAGE_BYTES)
        check_int(self.num_gpu_blocks, "num_gpu_blocks", minimum=1, maximum=1 << 31)
        check_int(self.num_cpu_chunks, "num_cpu_chunks", minimum=1, maximum=1 << 31)
        check_int(self.blocks_per_chunk, "blocks_per_chunk", minimum=1, maximum=MAX_BLOCKS_PER_CHUNK)
        check_int(self.cpu_row_padding, "cpu_row_padding", minimum=0, maximum=MAX_PAGE_BYTES)
        for refs in self.group_data_refs:
            for ref in refs:
                require(0 <= ref.tensor_idx < len(self.gpu_page_bytes), "tensor_idx",
                        f"a tensor in [0, {len(self.gpu_page_bytes)})", ref.tensor_idx)
                require(1 <= ref.page_size_bytes <= self.gpu_page_bytes[ref.tensor_idx], "page_size_bytes",
                        f"1..{self.gpu_page_bytes[ref.tensor_idx]} (the tensor's page)", ref.page_size_bytes)

    def cpu_page_bytes(self, tensor_idx: int) -> int:
        """`cpu_page_size_bytes = gpu_page_size_bytes * blocks_per_chunk`."""
        return self.gpu_page_bytes[tensor_idx] * self.blocks_per_chunk

    def cpu_row_stride(self, tensor_idx: int) -> int:
        return self.cpu_page_bytes(tensor_idx) + self.cpu_row_padding

    def gpu_bytes(self, tensor_idx: int) -> int:
        return self.num_gpu_blocks * self.gpu_page_bytes[tensor_idx]

    def cpu_bytes(self, tensor_idx: int) -> int:
        """The CPU view's extent: every row, the last one without its padding."""
        return (self.num_cpu_chunks - 1) * self.cpu_row_stride(tensor_idx) + self.cpu_page_bytes(tensor_idx)


@dataclass(frozen=True)
class TransferSpec:
    """One transfer: `GPULoadStoreSpec` (block ids, group sizes, block indices) and the CPU chunk ids
    (`CPULoadStoreSpec.chunk_ids`), both ordered by group."""

    block_ids: tuple[int, ...]
    group_sizes: tuple[int, ...]
    block_indices: tuple[int, ...]
    chunk_ids: tuple[int, ...]


@dataclass(frozen=True)
class SwapSegment:
    """One (group, data ref): `count` copies of `size` bytes; copy `k` reads sub-block `src_skip + k` of the
    src id list (ids of `src_blocks_per_chunk` sub-blocks each) and writes sub-block `dst_skip + k` of the dst
    list. What one launch of the oracle kernel gets per segment."""

    group: int
    tensor_idx: int
    src_ids: tuple[int, ...]
    dst_ids: tuple[int, ...]
    src_blocks_per_chunk: int
    dst_blocks_per_chunk: int
    src_skip: int
    dst_skip: int
    src_row_stride: int
    dst_row_stride: int
    src_sub_page: int  # the row split into blocks_per_chunk sub-blocks (the GPU page on both sides)
    dst_sub_page: int
    size: int  # the data ref's page_size_bytes
    count: int  # the group's size


@dataclass(frozen=True)
class CopyOp:
    """One `(src, dst, size)` triple, as byte offsets from tensor `tensor_idx`'s base on each side."""

    tensor_idx: int
    src: int
    dst: int
    size: int


@dataclass(frozen=True)
class SwapPlan:
    gpu_to_cpu: bool
    segments: tuple[SwapSegment, ...]
    ops: tuple[CopyOp, ...]  # segment order, block order inside a segment: the batch upstream hands the swap
    num_bytes: int  # the transfer's reported size (TransferResult.transfer_size)


def skip_count(block_index: int, blocks_per_chunk: int) -> int:
    """Sub-blocks of the first chunk before the group's first block (`block_idx % blocks_per_chunk`)."""
    return block_index % blocks_per_chunk


def chunks_spanned(block_index: int, group_size: int, blocks_per_chunk: int) -> int:
    """Chunks a group of `group_size` logically contiguous blocks from `block_index` touches (0 if empty)."""
    if group_size == 0:
        return 0
    return -(-(group_size + skip_count(block_index, blocks_per_chunk)) // blocks_per_chunk)


def compute_sub_block_offsets(ids: Sequence[int], blocks_per_chunk: int, row_stride: int, sub_page: int,
                              count: int, skip: int) -> np.ndarray:
    """Byte offsets of the `count` sub-blocks from sub-block `skip` of the rows `ids`, `blocks_per_chunk` each
    (upstream's flat enumeration `ids x range(blocks_per_chunk)` sliced `[skip : skip + count]`)."""
    require(0 <= skip < blocks_per_chunk, "skip_count", f"0..{blocks_per_chunk - 1}", skip)
    position = skip + np.arange(count, dtype=np.int64)
    rows = np.asarray(ids, dtype=np.int64)
    require(count == 0 or int(position[-1]) // blocks_per_chunk < len(rows), "ids",
            f"at least {-(-(skip + count) // blocks_per_chunk)} rows for {count} sub-blocks from {skip}", len(rows))
    return rows[position // blocks_per_chunk] * row_stride + (position % blocks_per_chunk) * sub_page


def segment_offsets(segment: SwapSegment) -> tuple[np.ndarray, np.ndarray]:
    """(src offsets, dst offsets) of a segment's copies."""
    return (compute_sub_block_offsets(segment.src_ids, segment.src_blocks_per_chunk, segment.src_row_stride,
                                      segment.src_sub_page, segment.count, segment.src_skip),
            compute_sub_block_offsets(segment.dst_ids, segment.dst_blocks_per_chunk, segment.dst_row_stride,
                                      segment.dst_sub_page, segment.count, segment.dst_skip))


def check_spec(geometry: SwapGeometry, spec: TransferSpec) -> None:
    """The spec's shape, as upstream asserts it: one size and index per group, ids in range."""
    groups = len(geometry.group_data_refs)
    require(len(spec.group_sizes) == groups and len(spec.block_indices) == groups, "group_sizes/block_indices",
            f"{groups} entries each (one per KV cache group)", (len(spec.group_sizes), len(spec.block_indices)))
    require(sum(spec.group_sizes) == len(spec.block_ids), "group_sizes",
            f"a sum equal to the {len(spec.block_ids)} GPU block ids", spec.group_sizes)
    require(all(s >= 0 for s in spec.group_sizes) and all(i >= 0 for i in spec.block_indices), "group_sizes",
            "non-negative sizes and block indices", (spec.group_sizes, spec.block_indices))
    require(all(0 <= b < geometry.num_gpu_blocks for b in spec.block_ids), "block_ids",
            f"GPU block ids in [0, {geometry.num_gpu_blocks})", spec.block_ids)
    require(all(0 <= c < geometry.num_cpu_chunks for c in spec.chunk_ids), "chunk_ids",
            f"chunk slots in [0, {geometry.num_cpu_chunks})", spec.chunk_ids)


def plan_swap(geometry: SwapGeometry, spec: TransferSpec, gpu_to_cpu: bool) -> SwapPlan:
    """The batched swap of one transfer (`SingleDirectionOffloadingHandler.transfer_async` with the direct
    layout): per group, per data ref, one copy per block; every id of both lists consumed exactly."""
    check_spec(geometry, spec)
    bpc = geometry.blocks_per_chunk
    src_bpc, dst_bpc = (1, bpc) if gpu_to_cpu else (bpc, 1)
    src_list, dst_list = (spec.block_ids, spec.chunk_ids) if gpu_to_cpu else (spec.chunk_ids, spec.block_ids)
    segments: list[SwapSegment] = []
    src_offset = dst_offset = 0
    for group, (size, index) in enumerate(zip(spec.group_sizes, spec.block_indices)):
        if size == 0:
            continue
        src_skip, dst_skip = skip_count(index, src_bpc), skip_count(index, dst_bpc)
        src_end = src_offset + -(-(size + src_skip) // src_bpc)
        dst_end = dst_offset + -(-(size + dst_skip) // dst_bpc)
        require(src_end <= len(src_list) and dst_end <= len(dst_list), "chunk_ids",
                f"enough ids for group {group} ({src_end} source, {dst_end} destination)",
                (len(src_list), len(dst_list)))
        for ref in geometry.group_data_refs[group]:
            t, gpu_page = ref.tensor_idx, geometry.gpu_page_bytes[ref.tensor_idx]
            cpu_stride = geometry.cpu_row_stride(t)
            src_stride, dst_stride = (gpu_page, cpu_stride) if gpu_to_cpu else (cpu_stride, gpu_page)
            segments.append(SwapSegment(group, t, tuple(src_list[src_offset:src_end]),
                                        tuple(dst_list[dst_offset:dst_end]), src_bpc, dst_bpc, src_skip, dst_skip,
                                        src_stride, dst_stride, gpu_page, gpu_page, ref.page_size_bytes, size))
        src_offset, dst_offset = src_end, dst_end
    require(src_offset == len(src_list) and dst_offset == len(dst_list), "chunk_ids",
            f"exactly the ids the groups span ({src_offset} source, {dst_offset} destination)",
            (len(src_list), len(dst_list)))
    ops: list[CopyOp] = []
    for segment in segments:
        src, dst = segment_offsets(segment)
        ops.extend(CopyOp(segment.tensor_idx, int(s), int(d), segment.size) for s, d in zip(src, dst))
    return SwapPlan(gpu_to_cpu, tuple(segments), tuple(ops), sum(op.size for op in ops))


def side_bytes(geometry: SwapGeometry, gpu: bool) -> list[int]:
    """Each tensor's extent in bytes on one side."""
    return [geometry.gpu_bytes(t) if gpu else geometry.cpu_bytes(t) for t in range(len(geometry.gpu_page_bytes))]


def apply_swap(plan: SwapPlan, src_buffers: Sequence[np.ndarray],
               dst_buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The reference swap: new copies of the dst buffers (1-D uint8, one per tensor) with every copy done in
    batch order (`memcpy(dst + op.dst, src + op.src, op.size)`); the inputs are not modified."""
    out = [np.array(b, dtype=np.uint8, copy=True).reshape(-1) for b in dst_buffers]
    for op in plan.ops:
        src = np.asarray(src_buffers[op.tensor_idx]).reshape(-1)
        require(op.src + op.size <= len(src) and op.dst + op.size <= len(out[op.tensor_idx]), "plan",
                "copies inside both tensors", op)
        out[op.tensor_idx][op.dst:op.dst + op.size] = src[op.src:op.src + op.size]
    return out
