"""vLLM `KVBlockZeroer`: the segment-table planner and the reference memset.

Follows `KVBlockZeroer` in `vllm/v1/worker/utils.py` before and after the
packed-stride fix d6af803 (PR #50276); research note
../shared/research/vllm.md, section 2.

A segment is one contiguous region per block: an address, the stride between
logical blocks and the page (how much is cleared), both in int32 words
because the kernel stores int32 zeros. Before the fix a segment had no
stride; the page doubled as it. For a packed view (several layers carved
from one per-block row, as in DeepSeek-V4) `stride(block_dim)` is the whole
row, so the old plan cleared the row from the layer's offset onwards: other
layers of the same block, padding, the first bytes of the next block, and
past the allocation for the last block.

Variants: `fixed` (today's upstream, vLLM 0.29.0 to 0.33.0, including the later merge of
overlaid segments and the standardized block-first views, whose outer dimensions may follow
the block dimension), `first_view_overlaid` (vLLM 0.28.0: d6af803 without those: overlaid
groups keep the first view's page) and `pre_d6af803`, as records of
`ZeroingVariant`: one flag per change, read where that change touched the
planner (the group ratio, `plan_segments`) or the launcher (`launch_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from kvsim.engine.errors import ConfigError, check_int, require

from .geometry import Arena, KVCacheGeometry, outer_dims, outer_offsets, view_start
from .variants import FIXED, ZeroingVariant

MAX_BLOCK_SIZE = 1024  # the kernel's chunk width cap (BLOCK_SIZE), in int32 words


@dataclass(frozen=True)
class Segment:
    """One row of the segment table (`seg_addrs`, `seg_block_strides`, `seg_page_sizes`)."""

    addr: int          # byte address (an arena offset here; a device pointer upstream)
    block_stride: int  # int32 words from logical block b to b+1
    page: int          # int32 words cleared per logical block
    layers: tuple[str, ...] = field(default=(), compare=False)  # provenance, for messages only

    def __post_init__(self) -> None:
        check_int(self.addr, "segment.addr", minimum=0)
        check_int(self.block_stride, "segment.block_stride", minimum=1)
        check_int(self.page, "segment.page", minimum=1)

    def span(self, block_id: int) -> tuple[int, int]:
        """Byte range [start, end) the kernel clears for `block_id`."""
        start = self.addr + 4 * block_id * self.block_stride
        return start, start + 4 * self.page


@dataclass(frozen=True)
class SegmentTable:
    """The planner's output: segments and the number of logical blocks they index."""

    segments: tuple[Segment, ...]
    num_blocks: int
    variant: ZeroingVariant = FIXED  # the planner (and so the launcher) that built it

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        require(all(isinstance(s, Segment) for s in self.segments), "segments", "Segment rows",
                self.segments)
        check_int(self.num_blocks, "num_blocks", minimum=1)
        require(isinstance(self.variant, ZeroingVariant), "variant", "a ZeroingVariant record (VARIANTS[name])",
                self.variant)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`seg_addrs` (uint64), `seg_block_strides` and `seg_page_sizes` (int64), as the kernel takes them."""
        return (np.array([s.addr for s in self.segments], dtype=np.uint64),
                np.array([s.block_stride for s in self.segments], dtype=np.int64),
                np.array([s.page for s in self.segments], dtype=np.int64))


def _group_ratio(geometry: KVCacheGeometry, group_index: int, variant: ZeroingVariant) -> int:
    """Kernel blocks per logical block of a group (virtual block splitting)."""
    group = geometry.groups[group_index]
    if variant.whole_kernel_blocks:
        require(group.block_size % group.kernel_block_size == 0, f"groups[{group_index}].block_size",
                f"a multiple of kernel_block_size={group.kernel_block_size} (virtual block splitting)",
                group.block_size)
    return group.ratio


def _page_span_bytes(geometry: KVCacheGeometry, index: int, variant: ZeroingVariant) -> int:
    """Byte extent of one kernel block's data: first element to end of last, without trailing padding."""
    view = geometry.views[index]
    skip = set(outer_dims(view, variant.outer_past_block)) | {view.block_dim}
    return view.element_size * (1 + sum((n - 1) * s for d, (n, s) in enumerate(zip(view.shape, view.strides))
                                        if d not in skip))


def plan_segments(geometry: KVCacheGeometry, variant: ZeroingVariant = FIXED, *,
                  arena: Arena | None = None) -> SegmentTable:
    """Build the segment table for every attention view, with upstream's assertions as ConfigError."""
    arena = arena or Arena.for_geometry(geometry)
    planned: list[Segment] = []
    seen_ptrs: set[int] = set()
    num_blocks: list[int] = []
    for index, view in geometry.attention_views():
        name = f"views[{index}] ({view.layer})"
        ratio = _group_ratio(geometry, view.group, variant)
        stride_bytes = view.block_stride_bytes
        require(stride_bytes % 4 == 0, f"{name}.strides[{view.block_dim}]",
                "a block stride that is a multiple of 4 bytes (the kernel stores int32 words)",
                f"{view.strides[view.block_dim]} elements of {view.element_size} bytes = {stride_bytes} bytes")
        data_ptr = view_start(arena, view)
        if not variant.merge_overlaid:
            if data_ptr in seen_ptrs:  # the old planner skipped a buffer it had seen by data_ptr
                continue
            seen_ptrs.add(data_ptr)
        if variant.whole_kernel_blocks:
            require(view.shape[view.block_dim] % ratio == 0, f"{name}.shape[{view.block_dim}]",
                    f"a multiple of ratio={ratio} (kernel blocks per logical block)", view.shape[view.block_dim])
        num_blocks.append(view.shape[view.block_dim] // ratio)
        if not variant.separate_stride:
            # The point of the bug: one page of `stride(block_dim) * ratio` bytes, used as the stride too.
            page = stride_bytes // 4 * ratio
            planned.extend(Segment(data_ptr + off, page, page, (view.layer,))
                           for off in outer_offsets(view, variant.outer_past_block))
            continue
        page_bytes = _page_span_bytes(geometry, index, variant)
        require(page_bytes % 4 == 0, f"{name} page span", "a multiple of 4 bytes", page_bytes)
        # No page-within-stride assertion: no release has one. With a single kernel block K/V's stride equals
        # the block stride, upstream's outer-dimension test sees K/V as inner, and the page spans K and V
        # (found by `kvsim conform vllm`; the model used to refuse such dense layouts).
        for off in outer_offsets(view, variant.outer_past_block):
            require((data_ptr + off) % 4 == 0, f"{name} segment address",
                    "a multiple of 4 bytes", f"allocation {view.allocation} + {view.offset + off}")
            # Each virtual kernel block gets its own segment, so padding between them is never cleared.
            planned.extend(Segment(data_ptr + off + v * stride_bytes, stride_bytes * ratio // 4, page_bytes // 4,
                                   (view.layer,)) for v in range(ratio))
    require(min(num_blocks) >= 1, "views", "at least one logical block in every attention view",
            f"{min(num_blocks)} blocks")
    segments = _merge_overlaid(planned) if variant.merge_overlaid else tuple(planned)
    return SegmentTable(segments, min(num_blocks), variant)


def _merge_overlaid(planned: list[Segment]) -> tuple[Segment, ...]:
    """One segment per address: overlaid groups keep the widest page, and must agree on the stride."""
    merged: dict[int, Segment] = {}
    for seg in planned:
        old = merged.get(seg.addr)
        if old is None:
            merged[seg.addr] = seg
            continue
        require(old.block_stride == seg.block_stride, f"segment at address {seg.addr}",
                f"one block stride for overlaid layers {old.layers + seg.layers}",
                (old.block_stride, seg.block_stride))
        merged[seg.addr] = Segment(seg.addr, seg.block_stride, max(old.page, seg.page), old.layers + seg.layers)
    return tuple(merged.values())


@dataclass(frozen=True)
class LaunchConfig:
    """Kernel launch parameters: chunk width (`BLOCK_SIZE`, int32 words), chunks per page, segments."""

    block_size: int
    max_chunks: int
    n_segs: int

    def grid(self, n_blocks: int) -> tuple[int, int, int]:
        """CUDA grid (x = chunk, y = segment, z = block index); x is the only axis allowed past 65,535."""
        return self.max_chunks, self.n_segs, n_blocks


def launch_config(table: SegmentTable, variant: ZeroingVariant | None = None) -> LaunchConfig:
    """`BLOCK_SIZE` and `max_chunks` as each variant's launcher chose them.

    Before the fix the kernel had no mask, so `BLOCK_SIZE` had to divide every
    page (the smallest power-of-two divisor, capped at 1024). The fixed 3-D
    launcher masks to the page and takes the next power of two of the widest.
    """
    variant = variant if variant is not None else table.variant
    pages = [s.page for s in table.segments]
    if not variant.masked_launch:
        block = min(min(p & -p for p in pages), MAX_BLOCK_SIZE)
        return LaunchConfig(block, max(pages) // block, len(pages))
    block = min(1 << (max(pages) - 1).bit_length(), MAX_BLOCK_SIZE)
    return LaunchConfig(block, -(-max(pages) // block), len(pages))


def _block_ids(segments: SegmentTable | Sequence[Segment], block_ids: Iterable[int]) -> list[int]:
    limit = segments.num_blocks - 1 if isinstance(segments, SegmentTable) else None
    return [check_int(b, f"block_ids[{i}]", minimum=0, maximum=limit) for i, b in enumerate(block_ids)]


def _rows(segments: SegmentTable | Sequence[Segment]) -> tuple[Segment, ...]:
    return segments.segments if isinstance(segments, SegmentTable) else tuple(segments)


def write_spans(segments: SegmentTable | Sequence[Segment], block_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Every byte range the kernel writes for these block IDs, in launch order (block, then segment)."""
    rows = _rows(segments)
    return [s.span(b) for b in _block_ids(segments, block_ids) for s in rows]


def zero_blocks(memory: np.ndarray | bytearray, segments: SegmentTable | Sequence[Segment],
                block_ids: Iterable[int]) -> None:
    """The reference memset: clear `[s.addr + b*stride, +page)` words for every block and segment, in place."""
    buf = memory if isinstance(memory, np.ndarray) else np.frombuffer(memory, dtype=np.uint8)
    require(buf.dtype == np.uint8 and buf.ndim == 1, "memory", "a 1-D uint8 buffer",
            f"{buf.dtype} array of shape {buf.shape}")
    spans = write_spans(segments, block_ids)
    for start, end in spans:
        if end > len(buf):
            raise ConfigError("memory", f"a buffer covering every write (up to byte {end})", f"{len(buf)} bytes")
    for start, end in spans:
        buf[start:end] = 0


def span_mask(size: int, spans: Iterable[tuple[int, int]]) -> np.ndarray:
    """Boolean mask of the bytes covered by `spans`, clipped to `size` (anything clipped is out of bounds anyway)."""
    mask = np.zeros(size, dtype=bool)
    for start, end in spans:
        mask[max(start, 0):min(end, size)] = True
    return mask


@dataclass(frozen=True)
class KVBlockZeroer:
    """The upstream object: plan once from the geometry, then zero block IDs each step."""

    geometry: KVCacheGeometry
    variant: ZeroingVariant = FIXED
    arena: Arena | None = None
    table: SegmentTable = field(init=False)

    def __post_init__(self) -> None:
        arena = self.arena or Arena.for_geometry(self.geometry)
        object.__setattr__(self, "arena", arena)
        object.__setattr__(self, "table", plan_segments(self.geometry, self.variant, arena=arena))

    def new_memory(self, fill: int = 0) -> np.ndarray:
        assert self.arena is not None
        return np.full(self.arena.size, fill, dtype=np.uint8)

    def zero_block_ids(self, memory: np.ndarray, block_ids: Iterable[int]) -> None:
        zero_blocks(memory, self.table, block_ids)

    def warmup(self, memory: np.ndarray, num_kv_blocks: int) -> None:
        """Upstream warms the kernel up by zeroing block 0, and only when the cache has blocks at all."""
        if check_int(num_kv_blocks, "num_kv_blocks", minimum=0) > 0:
            self.zero_block_ids(memory, [0])
