"""KV-cache layouts the zeroer meets, as `KVCacheGeometry` builders, and the pinned upstream geometries.

Follows the layouts named around vLLM d6af803 (PR #50276) and its CPU test
(PR #51288, `tests/v1/worker/test_dsv4_packed_zeroer_geometry.py`):

* packed rows: several layers carved from one per-block row at byte offsets,
  each page padded to an alignment (DeepSeek-V4's cross-layer slab);
* dense per-layer buffers, with K/V as an outer dimension (`block_dim=1`),
  inside the block (`block_dim=0`), or absent (MLA), optionally padded;
* overlaid KV-cache groups whose views share the start of one row.

Every builder takes logical `num_blocks` and `ratio` and lays out
`num_blocks * ratio` kernel blocks, which is what virtual block splitting
hands the attention backend.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.engine.errors import check_int, require

from .geometry import KVCacheGeometry, KVCacheGroup, KVView, round_up

KV_LAYOUTS = ("none", "outer", "inner")


def _group(kernel_block_size: int, ratio: int) -> KVCacheGroup:
    check_int(ratio, "ratio", minimum=1)
    return KVCacheGroup(block_size=kernel_block_size * ratio, kernel_block_size=kernel_block_size)


def _packed_row(kernel_block_size: int, widths: Sequence[int], element_size: int,
                align: int) -> tuple[list[int], list[int], int]:
    """Per-layer page bytes, offsets inside the row, and the row length (before any row padding)."""
    check_int(align, "align", minimum=1)
    pages = [kernel_block_size * check_int(w, f"widths[{i}]", minimum=1) * element_size
             for i, w in enumerate(widths)]
    offsets, cursor = [], 0
    for page in pages:
        offsets.append(cursor)
        cursor += round_up(page, align)
    return pages, offsets, cursor


def packed_layout(*, num_blocks: int, kernel_block_size: int, widths: Sequence[int], element_size: int = 1,
                  ratio: int = 1, align: int = 4, row_padding: int = 0, head_offset: int = 0,
                  tail_slack: int = 0, prefix: str = "layer") -> KVCacheGeometry:
    """One allocation of per-kernel-block rows; layer i holds `kernel_block_size x widths[i]` elements.

    `align` pads each layer's page; `row_padding` pads the row; `head_offset`
    puts the slab after other data in the allocation; `tail_slack` leaves
    room after the last row.
    """
    check_int(num_blocks, "num_blocks", minimum=1)
    pages, offsets, row = _packed_row(kernel_block_size, widths, element_size, align)
    row += check_int(row_padding, "row_padding", minimum=0)
    require(row % element_size == 0, "row length", f"a multiple of element_size={element_size}", row)
    kernel_blocks = num_blocks * ratio
    views = tuple(KVView(layer=f"{prefix}{i}", allocation=0, offset=head_offset + off,
                         shape=(kernel_blocks, kernel_block_size, w), strides=(row // element_size, w, 1),
                         element_size=element_size)
                  for i, (off, w) in enumerate(zip(offsets, widths)))
    size = check_int(head_offset, "head_offset", minimum=0) + kernel_blocks * row + \
        check_int(tail_slack, "tail_slack", minimum=0)
    return KVCacheGeometry((size,), (_group(kernel_block_size, ratio),), views)


def dense_layout(*, num_blocks: int, kernel_block_size: int, heads: int, head_size: int, element_size: int = 2,
                 ratio: int = 1, kv: str = "outer", block_padding: int = 0, layers: int = 1,
                 prefix: str = "dense") -> KVCacheGeometry:
    """One contiguous allocation per layer.

    `kv="outer"`: shape (2, blocks, kbs, heads, head_size), `block_dim=1`, so
    K and V are two segments; `"inner"`: (blocks, 2, kbs, heads, head_size);
    `"none"`: (blocks, kbs, heads, head_size), as MLA. `block_padding` bytes
    follow each block's data.
    """
    require(kv in KV_LAYOUTS, "kv", f"one of {KV_LAYOUTS}", kv)
    check_int(num_blocks, "num_blocks", minimum=1)
    check_int(layers, "layers", minimum=1)
    token = check_int(heads, "heads", minimum=1) * check_int(head_size, "head_size", minimum=1)
    halves = 2 if kv == "inner" else 1
    block_bytes = halves * kernel_block_size * token * element_size + check_int(block_padding, "block_padding",
                                                                                   minimum=0)
    require(block_bytes % element_size == 0, "block_padding", f"a multiple of element_size={element_size}",
            block_padding)
    blk = block_bytes // element_size
    kernel_blocks = num_blocks * ratio
    inner_shape, inner_strides = (kernel_block_size, heads, head_size), (token, head_size, 1)
    if kv == "outer":
        shape, strides, block_dim = (2, kernel_blocks) + inner_shape, (kernel_blocks * blk, blk) + inner_strides, 1
    elif kv == "inner":
        shape = (kernel_blocks, 2) + inner_shape
        strides, block_dim = (blk, kernel_block_size * token) + inner_strides, 0
    else:
        shape, strides, block_dim = (kernel_blocks,) + inner_shape, (blk,) + inner_strides, 0
    size = kernel_blocks * block_bytes * (2 if kv == "outer" else 1)
    views = tuple(KVView(layer=f"{prefix}{i}", allocation=i, offset=0, shape=shape, strides=strides,
                         element_size=element_size, block_dim=block_dim) for i in range(layers))
    return KVCacheGeometry((size,) * layers, (_group(kernel_block_size, ratio),), views)


def overlaid_layout(*, num_blocks: int, kernel_block_size: int, group_widths: Sequence[Sequence[int]],
                    element_size: int = 1, ratio: int = 1) -> KVCacheGeometry:
    """KV-cache groups packed into the same rows: every group's first layer starts at the row start.

    The row is the widest group's packed row, as a shared backing pool gives
    every group the same per-block stride.
    """
    require(len(group_widths) >= 2, "group_widths", "at least two groups", group_widths)
    rows = [_packed_row(kernel_block_size, widths, element_size, 4) for widths in group_widths]
    row = max(r[2] for r in rows)
    kernel_blocks = num_blocks * ratio
    views = tuple(KVView(layer=f"g{g}.{i}", allocation=0, offset=off, shape=(kernel_blocks, kernel_block_size, w),
                         strides=(row // element_size, w, 1), element_size=element_size, group=g)
                  for g, (widths, (_, offsets, _)) in enumerate(zip(group_widths, rows))
                  for i, (off, w) in enumerate(zip(offsets, widths)))
    groups = tuple(_group(kernel_block_size, ratio) for _ in group_widths)
    return KVCacheGeometry((kernel_blocks * row,), groups, views)


def combine(*parts: KVCacheGeometry) -> KVCacheGeometry:
    """Several geometries side by side: allocations, groups and views renumbered in order."""
    require(bool(parts), "parts", "at least one geometry", parts)
    allocations, groups, views = [], [], []
    for n, part in enumerate(parts):
        for view in part.views:
            views.append(KVView(layer=view.layer if len(parts) == 1 else f"p{n}.{view.layer}",
                                allocation=view.allocation + len(allocations), offset=view.offset,
                                shape=view.shape, strides=view.strides, element_size=view.element_size,
                                block_dim=view.block_dim, group=view.group + len(groups), kind=view.kind))
        allocations.extend(part.allocations)
        groups.extend(part.groups)
    return KVCacheGeometry(tuple(allocations), tuple(groups), tuple(views))


def with_mamba_state(geometry: KVCacheGeometry, state_words: int) -> KVCacheGeometry:
    """Add a Mamba state tensor (one row of int32 words per block) in its own allocation; the zeroer skips it."""
    blocks = geometry.num_blocks
    view = KVView(layer="mamba", allocation=len(geometry.allocations), offset=0,
                  shape=(blocks, check_int(state_words, "state_words", minimum=1)), strides=(state_words, 1),
                  element_size=4, kind="mamba")
    return KVCacheGeometry(geometry.allocations + (blocks * state_words * 4,), geometry.groups,
                           geometry.views + (view,))


# --- pinned upstream geometries (research note 2.5) --------------------------------------------------


def last_block_page_geometry() -> KVCacheGeometry:
    """`test_packed_segment_zeros_only_its_last_block_page`: int32 backing (4, 12), a view at +3 words, 4 wide.

    Upstream hand-builds the segment (stride 12, page 4); this is the view
    that plan gives, with the other 8 words of each row owned by no view.
    """
    view = KVView(layer="packed", allocation=0, offset=12, shape=(4, 4), strides=(12, 1), element_size=4)
    return KVCacheGeometry((4 * 12 * 4,), (KVCacheGroup(1, 1),), (view,))


def deepseek_v4_geometry(num_blocks: int = 100) -> KVCacheGeometry:
    """PR #50276 / #51288: 4 fp8_ds_mla layers of (blocks, 64, 584) uint8, pages padded to 576 B, row 149,760 B."""
    return packed_layout(num_blocks=num_blocks, kernel_block_size=64, widths=(584,) * 4, element_size=1,
                         align=576, prefix="dsv4.")


def non_uniform_pages_geometry() -> KVCacheGeometry:
    """`test_non_uniform_page_sizes`: two storages of 4 blocks, pages 10,496 (MLA) and 2,112 (DSA indexer) words."""
    return combine(dense_layout(num_blocks=4, kernel_block_size=1, heads=1, head_size=10_496, element_size=4,
                                kv="none", prefix="mla"),
                   dense_layout(num_blocks=4, kernel_block_size=1, heads=1, head_size=2_112, element_size=4,
                                kv="none", prefix="indexer"))


def overlaid_groups_geometry() -> KVCacheGeometry:
    """Overlaid groups at block size 64: g0 has 512- and 128-wide layers, g1 one 1024-wide layer (fp8 bytes)."""
    return overlaid_layout(num_blocks=4, kernel_block_size=64, group_widths=((512, 128), (1024,)))

