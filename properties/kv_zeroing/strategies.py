"""Hypothesis strategies of the kv-zeroing properties (imported only when a property runs).

The layout families are public so the kernel oracle (`kvsim.gpu_oracle`) draws
the same geometries as the model's properties:

* `packed_geometries(num_blocks)`: one allocation of packed per-block rows
  (layers at byte offsets, padded pages, padded rows, a head offset);
* `dense_geometries(num_blocks)`: per-layer buffers, K/V outer, inner or absent,
  optionally padded and virtually split;
* `overlaid_geometries(num_blocks)`: two or three KV-cache groups sharing rows;
* `layout_geometries(num_blocks)`: any one of the three;
* `block_id_lists(num_blocks)`: the logical block IDs of one call.

Every family takes the logical block count (every part of a combined geometry
must agree on it) and a `max_width` (or `max_head_units`) knob for wider pages
(`layout_geometries` passes them on); the defaults are what the properties use. `width_unit` gives the smallest width
whose page is a multiple of 4 bytes. The named strategies the properties run
are `ZEROING_CASES`, `DENSE_CASES`, `OVERLAID_CASES` and `LOOSE_CASES`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from hypothesis import strategies as st

from kvsim.models.kv_zeroing.geometry import KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import combine, dense_layout, overlaid_layout, packed_layout, with_mamba_state

from .cases import ZeroingCase

ELEMENT_SIZES = (4, 2, 1)  # fp32/int32 first: shrinking then ends on the simplest dtype


def width_unit(*factors: int) -> int:
    """Smallest width that makes `width * prod(factors)` bytes a multiple of 4 (the fixed planner's assertion)."""
    return 4 // math.gcd(4, math.prod(factors))


@st.composite
def packed_geometries(draw: st.DrawFn, num_blocks: int, max_width: int = 3) -> KVCacheGeometry:
    """Packed per-kernel-block rows: 1-3 layers of `width_unit * 1..max_width` elements per token."""
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs = draw(st.integers(1, 3))
    widths = draw(st.lists(st.integers(1, max_width), min_size=1, max_size=3))
    return packed_layout(num_blocks=num_blocks, kernel_block_size=kbs,
                         widths=[w * width_unit(kbs, el) for w in widths], element_size=el,
                         ratio=draw(st.integers(1, 3)), align=draw(st.sampled_from((4, 8, 16))),
                         row_padding=draw(st.sampled_from((0, 4, 8))), head_offset=draw(st.sampled_from((0, 4, 16))),
                         tail_slack=draw(st.sampled_from((0, 4))))


@st.composite
def dense_geometries(draw: st.DrawFn, num_blocks: int, padded: bool = True,
                     max_head_units: int = 3) -> KVCacheGeometry:
    """Dense per-layer buffers; `padded=False`: no block padding and ratio 1 (the page is the stride)."""
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs, heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ratio = draw(st.integers(1, 3)) if padded else 1
    # With a single kernel block the K/V stride equals the block stride, so upstream's "outer dimension" test
    # (stride > block stride) sees K/V as inner and the fixed planner rejects the page; see the model tests.
    kv = draw(st.sampled_from(("outer", "none", "inner") if num_blocks * ratio > 1 else ("none", "inner")))
    unit = width_unit(kbs, heads, el, 2 if kv == "inner" else 1)
    return dense_layout(num_blocks=num_blocks, kernel_block_size=kbs, heads=heads,
                        head_size=unit * draw(st.integers(1, max_head_units)), element_size=el, kv=kv, ratio=ratio,
                        block_padding=draw(st.sampled_from((0, 4, 8))) if padded else 0,
                        layers=draw(st.integers(1, 2)))


@st.composite
def overlaid_geometries(draw: st.DrawFn, num_blocks: int, max_width: int = 4) -> KVCacheGeometry:
    """Two or three KV-cache groups packed into the same rows, every group's first layer at the row start."""
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs = draw(st.integers(1, 2))
    group = st.lists(st.integers(1, max_width).map(lambda w: w * width_unit(kbs, el)), min_size=1, max_size=2)
    return overlaid_layout(num_blocks=num_blocks, kernel_block_size=kbs, element_size=el,
                           group_widths=draw(st.lists(group, min_size=2, max_size=3)),
                           ratio=draw(st.integers(1, 2)))


def layout_geometries(num_blocks: int, *, packed_width: int = 3, dense_head_units: int = 3,
                      overlaid_width: int = 4) -> st.SearchStrategy[KVCacheGeometry]:
    """One geometry of any family: packed rows, dense buffers or overlaid groups (each family's width knob)."""
    return st.one_of(packed_geometries(num_blocks, max_width=packed_width),
                     dense_geometries(num_blocks, max_head_units=dense_head_units),
                     overlaid_geometries(num_blocks, max_width=overlaid_width))


def block_id_lists(num_blocks: int, min_size: int = 1, max_size: int = 5) -> st.SearchStrategy[tuple[int, ...]]:
    """IDs with duplicates allowed and the last block favoured: that is where the old plan leaves the allocation."""
    one = st.one_of(st.just(num_blocks - 1), st.integers(0, num_blocks - 1))
    return st.lists(one, min_size=min_size, max_size=max_size).map(tuple)


@functools.lru_cache(maxsize=None)
def _case_parts(kinds: str, num_blocks: int) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    """The part lists and block IDs of `zeroing_cases` for one block count, built (and validated) once, not per
    example: the same strategies, so the same draws."""
    part = {"all": layout_geometries(num_blocks),
            "dense": dense_geometries(num_blocks, padded=False),
            "overlaid": overlaid_geometries(num_blocks)}[kinds]
    return st.lists(part, min_size=1, max_size=3), block_id_lists(num_blocks)


@st.composite
def zeroing_cases(draw: st.DrawFn, kinds: str = "all") -> ZeroingCase:
    """Geometries of one to three parts (packed rows, dense buffers, overlaid groups), sometimes a Mamba state."""
    num_blocks = draw(st.integers(1, 4))
    parts, block_ids = _case_parts(kinds, num_blocks)
    geometry = combine(*draw(parts))
    if kinds == "all" and draw(st.booleans()):
        geometry = with_mamba_state(geometry, draw(st.integers(1, 3)))
    return ZeroingCase(geometry, draw(block_ids))


@st.composite
def loose_cases(draw: st.DrawFn) -> ZeroingCase:
    """Packed geometries a torch allocator could produce but the zeroer may not support: misaligned
    offsets and pages, spec blocks that are not a multiple of the kernel block, uneven kernel-block counts."""
    num_blocks = draw(st.integers(1, 3))
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs, ratio = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    extra_kernel_block = draw(st.booleans())
    geometry = packed_layout(num_blocks=num_blocks, kernel_block_size=kbs, element_size=el, ratio=ratio,
                             widths=draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)),
                             align=draw(st.sampled_from((1, 2, 4, 8))), row_padding=el * draw(st.integers(0, 3)),
                             head_offset=el * draw(st.integers(0, 3)), tail_slack=4096 if extra_kernel_block else 0)
    views = geometry.views
    if extra_kernel_block:
        views = tuple(replace(v, shape=(v.shape[0] + 1,) + v.shape[1:]) for v in views)
    group = replace(geometry.groups[0], block_size=geometry.groups[0].block_size + draw(st.integers(0, 1)))
    geometry = KVCacheGeometry(geometry.allocations, (group,), views)
    return ZeroingCase(geometry, draw(block_id_lists(max(geometry.num_blocks, 1))))


ZEROING_CASES = zeroing_cases()
DENSE_CASES = zeroing_cases("dense")
OVERLAID_CASES = zeroing_cases("overlaid")
LOOSE_CASES = loose_cases()
