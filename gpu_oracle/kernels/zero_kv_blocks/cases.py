"""The zeroing kernel's cases (no Hypothesis here): one launch, and the pinned upstream geometries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import (deepseek_v4_geometry, dense_layout, last_block_page_geometry,
                                             non_uniform_pages_geometry, overlaid_groups_geometry, packed_layout)
from kvsim.models.kv_zeroing.zeroer import SegmentTable, write_spans

SENTINEL = 0xA5


def writes_in_bounds(arena: Arena, table: SegmentTable, block_ids: tuple[int, ...]) -> bool:
    """Every write lands inside an allocation (a pre-fix table may write into the red zones between them)."""
    inside = arena.inside()
    return all(inside[start:end].all() for start, end in write_spans(table, block_ids))


@dataclass(frozen=True)
class KernelCase:
    """One launch: where the allocations are, the table, the IDs, the chunk width and the initial bytes."""

    arena: Arena
    table: SegmentTable
    block_ids: tuple[int, ...]
    chunk_width: int | None  # None: the fixed launcher's BLOCK_SIZE
    fill_seed: int
    geometry: KVCacheGeometry | None = None  # None for a raw segment table

    def memory(self) -> np.ndarray:
        return np.random.default_rng(self.fill_seed).integers(0, 256, self.arena.size, dtype=np.uint8)

    def in_bounds(self) -> bool:
        return writes_in_bounds(self.arena, self.table, self.block_ids)

    def __canon__(self) -> dict[str, Any]:  # a counterexample names the table, not every byte of the arena
        return {"segments": [(s.addr, s.block_stride, s.page) for s in self.table.segments],
                "variant": self.table.variant, "block_ids": self.block_ids, "chunk_width": self.chunk_width,
                "allocations": list(self.arena.sizes), "geometry": self.geometry}


@dataclass(frozen=True)
class PinnedCase:
    """An upstream regression geometry and the blocks to zero.

    ASan cases: `variant` (a name of the model's table) plans the segment table, and `overrun` says whether
    that table writes past its allocation (the model's prediction, which ASan must confirm).
    """

    name: str
    geometry: KVCacheGeometry
    block_ids: tuple[int, ...]
    chunk_width: int | None = None
    variant: str = "fixed"
    overrun: bool = False

    def __canon__(self) -> dict[str, Any]:
        return {"name": self.name, "block_ids": self.block_ids, "chunk_width": self.chunk_width,
                "variant": self.variant, "overrun": self.overrun}


def pinned_geometries() -> list[tuple[str, KVCacheGeometry, tuple[int, ...]]]:
    """The upstream regression geometries (research note 2.5) and two layouts with padding inside rows."""
    return [
        ("last block page (4, 12) int32", last_block_page_geometry(), (3,)),
        ("DeepSeek-V4 packed rows", deepseek_v4_geometry(), (0, 5, 99)),
        ("non-uniform pages 10496/2112", non_uniform_pages_geometry(), (1, 2)),
        ("overlaid groups", overlaid_groups_geometry(), (0, 3)),
        ("K/V outer, ratio 2, padded blocks",
         dense_layout(num_blocks=3, kernel_block_size=2, heads=2, head_size=6, element_size=2, ratio=2,
                      kv="outer", block_padding=8), (0, 2)),
        ("packed, head offset, ratio 3",
         packed_layout(num_blocks=4, kernel_block_size=3, widths=(4, 8, 12), element_size=1, ratio=3, align=16,
                       row_padding=4, head_offset=8), (3, 1)),
    ]


def sentinel_cases() -> list[PinnedCase]:
    """Every pinned geometry with the launcher's chunk width and with 3 (which divides no power-of-two page)."""
    return [PinnedCase(name, geometry, ids, chunk_width) for name, geometry, ids in pinned_geometries()
            for chunk_width in (None, 3)]


def overrun_cases() -> list[PinnedCase]:
    """The packed cases zeroing the last block, planned by the pre-fix and by the fixed planner."""
    return [PinnedCase(name, geometry, ids, variant=variant, overrun=overrun)
            for name, geometry, ids in (("last block page (4, 12) int32", last_block_page_geometry(), (3,)),
                                        ("DeepSeek-V4 packed rows", deepseek_v4_geometry(), (99,)))
            for variant, overrun in (("pre_d6af803", True), ("fixed", False))]
