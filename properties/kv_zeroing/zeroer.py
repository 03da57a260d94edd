"""Properties 2.4.1–2.4.6, 2.4.8 and 2.4.9 of vLLM's packed KV block zeroing (d6af803), and its bug report.

Research note: ../shared/research/vllm.md, section 2. The frame condition
(no byte outside the zeroed blocks changes) is the one the bug breaks; the
bounds, geometry and virtual-splitting properties break with it on packed or
padded layouts. 2.4.7 (kernel vs reference) lives in `gpu_oracle`; 2.4.10
(Triton warmup specialisation) has no Triton kernel here to observe.

Every property judges the planner against `owned_bytes`, which enumerates
view elements and never uses the planner's page-span formula.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.engine.registry import REGISTRY, BugReport, ModelSpec
from kvsim.models.kv_zeroing.zeroer import VARIANTS, SegmentTable, plan_segments, span_mask, write_spans, zero_blocks
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry, owned_bytes, owner_of, view_start
from kvsim.models.kv_zeroing.layouts import (combine, deepseek_v4_geometry, dense_layout, last_block_page_geometry,
                                       non_uniform_pages_geometry, overlaid_groups_geometry, overlaid_layout,
                                       packed_layout, with_mamba_state)

MODEL = "kv-zeroing"
SOURCE = "vllm d6af803 (PR #50276)"

REGISTRY.add_model(ModelSpec(
    name=MODEL,
    summary="KVBlockZeroer segment table and zeroing of newly allocated KV blocks, packed layouts included",
    source=SOURCE,
    variants=VARIANTS,
))


@dataclass(frozen=True)
class ZeroingCase:
    """One `zero_block_ids` call: the cache geometry and the logical block IDs handed to it."""

    geometry: KVCacheGeometry
    block_ids: tuple[int, ...]


# --- strategies ------------------------------------------------------------------------------------

ELEMENT_SIZES = (4, 2, 1)  # fp32/int32 first: shrinking then ends on the simplest dtype


def _unit(*factors: int) -> int:
    """Smallest width that makes `width * prod(factors)` bytes a multiple of 4 (the fixed planner's assertion)."""
    return 4 // math.gcd(4, math.prod(factors))


@st.composite
def packed_parts(draw: st.DrawFn, num_blocks: int) -> KVCacheGeometry:
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs = draw(st.integers(1, 3))
    widths = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    return packed_layout(num_blocks=num_blocks, kernel_block_size=kbs, widths=[w * _unit(kbs, el) for w in widths],
                         element_size=el, ratio=draw(st.integers(1, 3)), align=draw(st.sampled_from((4, 8, 16))),
                         row_padding=draw(st.sampled_from((0, 4, 8))), head_offset=draw(st.sampled_from((0, 4, 16))),
                         tail_slack=draw(st.sampled_from((0, 4))))


@st.composite
def dense_parts(draw: st.DrawFn, num_blocks: int, padded: bool = True) -> KVCacheGeometry:
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs, heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ratio = draw(st.integers(1, 3)) if padded else 1
    # With a single kernel block the K/V stride equals the block stride, so upstream's "outer dimension" test
    # (stride > block stride) sees K/V as inner and the fixed planner rejects the page; see the model tests.
    kv = draw(st.sampled_from(("outer", "none", "inner") if num_blocks * ratio > 1 else ("none", "inner")))
    unit = _unit(kbs, heads, el, 2 if kv == "inner" else 1)
    return dense_layout(num_blocks=num_blocks, kernel_block_size=kbs, heads=heads,
                        head_size=unit * draw(st.integers(1, 3)), element_size=el, kv=kv, ratio=ratio,
                        block_padding=draw(st.sampled_from((0, 4, 8))) if padded else 0,
                        layers=draw(st.integers(1, 2)))


@st.composite
def overlaid_parts(draw: st.DrawFn, num_blocks: int) -> KVCacheGeometry:
    el = draw(st.sampled_from(ELEMENT_SIZES))
    kbs = draw(st.integers(1, 2))
    group = st.lists(st.integers(1, 4).map(lambda w: w * _unit(kbs, el)), min_size=1, max_size=2)
    return overlaid_layout(num_blocks=num_blocks, kernel_block_size=kbs, element_size=el,
                           group_widths=draw(st.lists(group, min_size=2, max_size=3)),
                           ratio=draw(st.integers(1, 2)))


def block_id_lists(num_blocks: int) -> st.SearchStrategy[tuple[int, ...]]:
    """IDs with duplicates allowed and the last block favoured: that is where the old plan leaves the allocation."""
    one = st.one_of(st.just(num_blocks - 1), st.integers(0, num_blocks - 1))
    return st.lists(one, min_size=1, max_size=5).map(tuple)


@st.composite
def zeroing_cases(draw: st.DrawFn, kinds: str = "all") -> ZeroingCase:
    """Geometries of one to three parts (packed rows, dense buffers, overlaid groups), sometimes a Mamba state."""
    num_blocks = draw(st.integers(1, 4))
    part = {"all": st.one_of(packed_parts(num_blocks), dense_parts(num_blocks), overlaid_parts(num_blocks)),
            "dense": dense_parts(num_blocks, padded=False),
            "overlaid": overlaid_parts(num_blocks)}[kinds]
    geometry = combine(*draw(st.lists(part, min_size=1, max_size=3)))
    if kinds == "all" and draw(st.booleans()):
        geometry = with_mamba_state(geometry, draw(st.integers(1, 3)))
    return ZeroingCase(geometry, draw(block_id_lists(num_blocks)))


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


# Pinned upstream cases (research note 2.5)
LAST_BLOCK_PAGE = ZeroingCase(last_block_page_geometry(), (3,))
DEEPSEEK_V4 = ZeroingCase(deepseek_v4_geometry(), (5, 99))
NON_UNIFORM_PAGES = ZeroingCase(non_uniform_pages_geometry(), (1, 2))
OVERLAID_GROUPS = ZeroingCase(overlaid_groups_geometry(), (0, 3))
PINNED = (LAST_BLOCK_PAGE, DEEPSEEK_V4, NON_UNIFORM_PAGES, OVERLAID_GROUPS)


# --- helpers ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _pattern(size: int) -> np.ndarray:
    """A fill with no zero byte, so every cleared byte is visible."""
    pattern = ((np.arange(size, dtype=np.int64) * 131 + 7) % 251 + 1).astype(np.uint8)
    pattern.flags.writeable = False
    return pattern


@dataclass(frozen=True)
class _Run:
    arena: Arena
    table: SegmentTable
    before: np.ndarray
    after: np.ndarray


def _zero(case: ZeroingCase, variant: str, block_ids: tuple[int, ...] | None = None) -> _Run:
    arena = Arena.for_geometry(case.geometry)
    table = plan_segments(case.geometry, variant, arena=arena)
    before = _pattern(arena.size)
    after = before.copy()
    zero_blocks(after, table, case.block_ids if block_ids is None else block_ids)
    return _Run(arena, table, before, after)


def _first(case: ZeroingCase, arena: Arena, mask: np.ndarray) -> str:
    addr = int(np.flatnonzero(mask)[0])
    return f"first at {owner_of(case.geometry, arena, addr)}"


# --- properties ------------------------------------------------------------------------------------

@kv_property(model=MODEL, strategy=zeroing_cases(), examples=PINNED)
def zeroed_blocks_are_cleared(case: ZeroingCase, variant: str) -> None:
    """2.4.1 target cleared: every byte of every attention layer's kernel blocks of the given IDs is zero
    after the call."""
    run = _zero(case, variant)
    left = owned_bytes(case.geometry, run.arena, case.block_ids) & (run.after != 0)
    if left.any():
        raise PropertyViolation(f"nonzero bytes left in blocks {sorted(set(case.block_ids))}: expected 0, "
                                f"got {int(left.sum())} ({_first(case, run.arena, left)})")


@kv_property(model=MODEL, strategy=zeroing_cases(), examples=PINNED)
def zeroing_preserves_other_bytes(case: ZeroingCase, variant: str) -> None:
    """2.4.2 frame condition: no byte outside the zeroed blocks changes (other blocks, other layers of the same
    packed row, padding, Mamba state, memory outside the allocations)."""
    run = _zero(case, variant)
    foreign = (run.after != run.before) & ~owned_bytes(case.geometry, run.arena, case.block_ids)
    if foreign.any():
        outside = int((foreign & ~run.arena.inside()).sum())
        raise PropertyViolation(f"bytes changed outside blocks {sorted(set(case.block_ids))}: expected 0, got "
                                f"{int(foreign.sum())}, {outside} of them outside every allocation "
                                f"({_first(case, run.arena, foreign)})")


@kv_property(model=MODEL, strategy=zeroing_cases(), examples=PINNED)
def segments_stay_inside_allocations(case: ZeroingCase, variant: str) -> None:
    """2.4.3 bounds: for every block b < num_blocks and segment s, [s.addr + b*stride, +page) lies in s's allocation."""
    arena = Arena.for_geometry(case.geometry)
    table = plan_segments(case.geometry, variant, arena=arena)
    overruns = []  # (bytes out of bounds, segment index, allocation, end)
    for i, seg in enumerate(table.segments):
        index = arena.allocation_at(seg.addr)
        if index is None:
            raise PropertyViolation(f"segment {i} ({', '.join(seg.layers)}) address: expected inside an "
                                    f"allocation, got {arena.describe(seg.addr)}")
        last = max(seg.span(b)[1] for b in range(table.num_blocks))
        if last > arena.bases[index] + arena.sizes[index]:
            overruns.append((last - arena.bases[index] - arena.sizes[index], i, index, last - arena.bases[index]))
    if overruns:
        over, i, index, end = max(overruns)
        raise PropertyViolation(f"segment {i} ({', '.join(table.segments[i].layers)}) end of block "
                                f"{table.num_blocks - 1}: expected <= {arena.sizes[index]} (end of allocation "
                                f"{index}), got {end} ({over} bytes out of bounds; {len(overruns)} of "
                                f"{len(table.segments)} segments leave their allocation)")


@kv_property(model=MODEL, strategy=loose_cases(), examples=PINNED)
def segment_geometry_is_valid(case: ZeroingCase, variant: str) -> None:
    """2.4.4 geometry: the planner either rejects the geometry with a ConfigError naming the field, or every
    segment is 4-byte aligned, spans the layer's logical block stride, and its page fits in one kernel block."""
    arena = Arena.for_geometry(case.geometry)
    try:
        table = plan_segments(case.geometry, variant, arena=arena)
    except ConfigError as exc:
        if not (exc.field and exc.expected):
            raise PropertyViolation(f"planner error: expected a field and an expected value, got {exc}") from None
        return
    views = {v.layer: v for v in case.geometry.views}
    for i, seg in enumerate(table.segments):
        if seg.addr % 4:
            raise PropertyViolation(f"segment {i} ({', '.join(seg.layers)}) address modulo 4: expected 0, "
                                    f"got {seg.addr % 4} ({arena.describe(seg.addr)})")
        for layer in seg.layers:
            view = views[layer]
            group = case.geometry.groups[view.group]
            if group.block_size % group.kernel_block_size or view.shape[view.block_dim] % group.ratio:
                raise PropertyViolation(f"layer {layer} accepted with block_size {group.block_size}, kernel block "
                                        f"{group.kernel_block_size}, {view.shape[view.block_dim]} kernel blocks: "
                                        f"expected whole kernel blocks per logical block")
            if 4 * seg.page > view.block_stride_bytes:
                raise PropertyViolation(f"segment {i} page of layer {layer}: expected <= {view.block_stride_bytes} "
                                        f"bytes (one kernel block), got {4 * seg.page}")
            if 4 * seg.block_stride != view.block_stride_bytes * group.ratio:
                raise PropertyViolation(f"segment {i} block stride of layer {layer}: expected "
                                        f"{view.block_stride_bytes * group.ratio} bytes, got {4 * seg.block_stride}")


@kv_property(model=MODEL, strategy=zeroing_cases(), examples=PINNED)
def logical_block_zeroes_its_kernel_blocks(case: ZeroingCase, variant: str) -> None:
    """2.4.5 virtual splitting: zeroing logical block b writes exactly the bytes of kernel blocks
    b*ratio .. b*ratio+ratio-1 of every attention layer."""
    arena = Arena.for_geometry(case.geometry)
    table = plan_segments(case.geometry, variant, arena=arena)
    for b in sorted(set(case.block_ids)):
        written = span_mask(arena.size, write_spans(table, [b]))
        expected = owned_bytes(case.geometry, arena, [b])
        if not np.array_equal(written, expected):
            extra, missed = written & ~expected, expected & ~written
            first = _first(case, arena, extra if extra.any() else missed)
            raise PropertyViolation(f"bytes written for logical block {b}: expected {int(expected.sum())}, got "
                                    f"{int(written.sum())} ({int(extra.sum())} extra, {int(missed.sum())} missed; "
                                    f"{first})")


@kv_property(model=MODEL, strategy=zeroing_cases(), examples=PINNED)
def zeroing_is_idempotent_and_order_free(case: ZeroingCase, variant: str) -> None:
    """2.4.6 algebra: zeroing twice, in reverse order, with duplicates doubled, or as a set gives the same bytes."""
    once = _zero(case, variant).after
    ids = case.block_ids
    twice = once.copy()
    zero_blocks(twice, plan_segments(case.geometry, variant, arena=Arena.for_geometry(case.geometry)), ids)
    others = {"twice": twice, "reversed": _zero(case, variant, ids[::-1]).after,
              "with duplicates": _zero(case, variant, ids + ids).after,
              "as a set": _zero(case, variant, tuple(sorted(set(ids)))).after}
    for name, got in others.items():
        if not np.array_equal(once, got):
            raise PropertyViolation(f"bytes differing when zeroing {name}: expected 0, got "
                                    f"{int((once != got).sum())}")


@kv_property(model=MODEL, strategy=zeroing_cases("dense"), examples=(NON_UNIFORM_PAGES,))
def dense_layouts_zero_the_same_bytes(case: ZeroingCase, variant: str) -> None:
    """2.4.8 no regression: on unpadded layouts with ratio 1 the page is the stride, so this variant's plan and
    both upstream planners write the same bytes: exactly the blocks' own."""
    arena = Arena.for_geometry(case.geometry)
    masks = {v: span_mask(arena.size, write_spans(plan_segments(case.geometry, v, arena=arena), case.block_ids))
             for v in dict.fromkeys((variant,) + VARIANTS)}
    expected = owned_bytes(case.geometry, arena, case.block_ids)
    for name, got in masks.items():
        if not np.array_equal(expected, got):
            raise PropertyViolation(f"bytes written by the {name} plan on a dense layout: expected "
                                    f"{int(expected.sum())} (the blocks' own), got {int(got.sum())}")


@kv_property(model=MODEL, strategy=zeroing_cases("overlaid"), examples=(OVERLAID_GROUPS,))
def overlaid_groups_get_the_widest_page(case: ZeroingCase, variant: str) -> None:
    """2.4.9 overlaid groups: where views of several groups start at one address, the segments there clear at
    least the widest of their pages, for every kernel block of every zeroed logical block."""
    arena = Arena.for_geometry(case.geometry)
    table = plan_segments(case.geometry, variant, arena=arena)
    starts: dict[int, list] = {}
    for _, view in case.geometry.attention_views():
        starts.setdefault(view_start(arena, view), []).append(view)
    for b in sorted(set(case.block_ids)):
        written = span_mask(arena.size, write_spans(table, [b]))
        for start, views in starts.items():
            if len(views) < 2:
                continue
            widest = max(views, key=lambda v: int(v.block_byte_offsets()[-1]))
            page = int(widest.block_byte_offsets()[-1]) + 1
            ratio = case.geometry.groups[widest.group].ratio
            for k in range(b * ratio, (b + 1) * ratio):
                lo = start + k * widest.block_stride_bytes
                covered = int(written[lo:lo + page].sum())
                if covered < page:
                    raise PropertyViolation(f"bytes cleared at {arena.describe(lo)} (kernel block {k}, overlaid "
                                            f"{', '.join(v.layer for v in views)}): expected {page} (widest page, "
                                            f"{widest.layer}), got {covered}")


REGISTRY.add_bug(BugReport(
    id="vllm-d6af803-packed-zeroing-stride",
    model=MODEL,
    variant="pre_d6af803",
    property="zeroing_preserves_other_bytes",
    source=SOURCE,
    summary="packed KV views: the page doubled as the block stride, so zeroing a block cleared the rest of the "
            "packed row (other layers, padding, the next block) and wrote past the allocation for the last block",
    max_examples=500,
))
