"""Hypothesis strategies of the zeroing kernel's properties (imported only when one runs).

The layout families and block lists are the model's own strategies
(`kvsim.properties.kv_zeroing.strategies`), drawn with wider pages (rows up to
40 width units) and empty block lists allowed; with chunk widths that need not
divide the page they exercise the kernel's mask and its chunk loop. Raw
segment tables come straight from the kernel's contract.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.models.kv_zeroing.geometry import Arena
from kvsim.models.kv_zeroing.layouts import combine
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.models.kv_zeroing.zeroer import Segment, SegmentTable, plan_segments
from kvsim.properties.kv_zeroing.strategies import block_id_lists, layout_geometries

from .cases import KernelCase, overrun_cases, sentinel_cases


_chunk_widths = st.one_of(st.none(), st.integers(1, 64), st.sampled_from((1, 32, 128, 256, 1024)))


@st.composite
def planned_cases(draw: st.DrawFn) -> KernelCase:
    """Geometries of one to three parts, planned by every variant of the model (pre-fix tables included)."""
    num_blocks = draw(st.integers(1, 5))
    part = layout_geometries(num_blocks, packed_width=40, dense_head_units=40, overlaid_width=20)
    geometry = combine(*draw(st.lists(part, min_size=1, max_size=3)))
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, variant=draw(st.sampled_from(tuple(VARIANTS.values()))), arena=arena)
    return KernelCase(arena, table, draw(block_id_lists(num_blocks, min_size=0, max_size=6)), draw(_chunk_widths),
                      draw(st.integers(0, 2**32 - 1)), geometry)


@st.composite
def raw_cases(draw: st.DrawFn) -> KernelCase:
    """Segment tables straight from the kernel's contract: any aligned address, stride and page (pages may
    overlap each other or the next block; zeros are idempotent, so the result is still defined)."""
    num_blocks = draw(st.integers(1, 5))
    rows = draw(st.lists(st.tuples(st.integers(0, 64), st.integers(1, 80), st.integers(1, 80)),
                         min_size=1, max_size=5))
    words = max(a + (num_blocks - 1) * s + p for a, s, p in rows) + draw(st.integers(0, 8))
    arena = Arena(bases=(64,), sizes=(4 * words,), size=4 * words + 128)
    table = SegmentTable(tuple(Segment(64 + 4 * a, s, p) for a, s, p in rows), num_blocks)
    return KernelCase(arena, table, draw(block_id_lists(num_blocks, min_size=0, max_size=6)), draw(_chunk_widths),
                      draw(st.integers(0, 2**32 - 1)))


kernel_cases = st.one_of(planned_cases(), raw_cases())
sentinel = st.sampled_from(sentinel_cases())
overruns = st.sampled_from(overrun_cases())
