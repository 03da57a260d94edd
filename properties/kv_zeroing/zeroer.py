"""Properties 2.4.1–2.4.6, 2.4.8 and 2.4.9 of vLLM's packed KV block zeroing (d6af803).

Research note: ../shared/research/vllm.md, section 2. The frame condition
(no byte outside the zeroed blocks changes) is the one the bug breaks; the
bounds, geometry and virtual-splitting properties break with it on packed or
padded layouts. 2.4.7 (kernel vs reference) lives in `gpu_oracle`; 2.4.10
(Triton warmup specialisation) has no Triton kernel here to observe.

Every property judges the planner against `owned_bytes`, which enumerates
view elements and never uses the planner's page-span formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.kv_zeroing import DESCRIPTOR
from kvsim.models.kv_zeroing.geometry import Arena, owned_bytes, owner_of, view_start
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.models.kv_zeroing.zeroer import (SegmentTable, ZeroingVariant, plan_segments, span_mask, write_spans,
                                            zero_blocks)

from .cases import NON_UNIFORM_PAGES, OVERLAID_GROUPS, PINNED, ZEROING_SOMETIMES, ZeroingCase

MODEL = DESCRIPTOR.name


# --- helpers ---------------------------------------------------------------------------------------

_PERIOD = ((np.arange(251) * 131 + 7) % 251 + 1).astype(np.uint8)  # byte i is _PERIOD[i % 251]
_PATTERN = _PERIOD[:0]


def _pattern(size: int) -> np.ndarray:
    """A fill with no zero byte, so every cleared byte is visible: byte `i` is `(131 i + 7) % 251 + 1`.

    Read-only. Byte `i` depends on `i` alone, so every size is a prefix of the longest fill made so far,
    which is made again (its period repeated) only when a larger size comes."""
    global _PATTERN
    if size > _PATTERN.size:
        pattern = np.resize(_PERIOD, max(size, 2 * _PATTERN.size))
        pattern.flags.writeable = False
        _PATTERN = pattern
    return _PATTERN[:size]


@dataclass(frozen=True)
class _Run:
    arena: Arena
    table: SegmentTable
    before: np.ndarray
    after: np.ndarray


def _zero(case: ZeroingCase, variant: ZeroingVariant, block_ids: tuple[int, ...] | None = None) -> _Run:
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

@kv_property(model=MODEL, strategy="ZEROING_CASES", examples=PINNED, sometimes=ZEROING_SOMETIMES)
def zeroed_blocks_are_cleared(case: ZeroingCase, variant: ZeroingVariant) -> None:
    """2.4.1 target cleared: every byte of every attention layer's kernel blocks of the given IDs is zero
    after the call."""
    run = _zero(case, variant)
    left = owned_bytes(case.geometry, run.arena, case.block_ids) & (run.after != 0)
    if left.any():
        raise PropertyViolation(f"nonzero bytes left in blocks {sorted(set(case.block_ids))}: expected 0, "
                                f"got {int(left.sum())} ({_first(case, run.arena, left)})")


@kv_property(model=MODEL, strategy="ZEROING_CASES", examples=PINNED, sometimes=ZEROING_SOMETIMES)
def zeroing_preserves_other_bytes(case: ZeroingCase, variant: ZeroingVariant) -> None:
    """2.4.2 frame condition: no byte outside the zeroed blocks changes (other blocks, other layers of the same
    packed row, padding, Mamba state, memory outside the allocations)."""
    run = _zero(case, variant)
    foreign = (run.after != run.before) & ~owned_bytes(case.geometry, run.arena, case.block_ids)
    if foreign.any():
        outside = int((foreign & ~run.arena.inside()).sum())
        raise PropertyViolation(f"bytes changed outside blocks {sorted(set(case.block_ids))}: expected 0, got "
                                f"{int(foreign.sum())}, {outside} of them outside every allocation "
                                f"({_first(case, run.arena, foreign)})")


@kv_property(model=MODEL, strategy="ZEROING_CASES", examples=PINNED, sometimes=ZEROING_SOMETIMES)
def segments_stay_inside_allocations(case: ZeroingCase, variant: ZeroingVariant) -> None:
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


@kv_property(model=MODEL, strategy="LOOSE_CASES", examples=PINNED)
def segment_geometry_is_valid(case: ZeroingCase, variant: ZeroingVariant) -> None:
    """2.4.4 geometry: the planner either rejects the geometry with a ConfigError naming the field, or every
    segment is 4-byte aligned, spans the layer's logical block stride, and its page fits in one kernel block
    (unless the view has a single kernel block: then upstream's page may span K and V of that block)."""
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
            if 4 * seg.page > view.block_stride_bytes and view.shape[view.block_dim] > 1:
                raise PropertyViolation(f"segment {i} page of layer {layer}: expected <= {view.block_stride_bytes} "
                                        f"bytes (one kernel block), got {4 * seg.page}")
            if 4 * seg.block_stride != view.block_stride_bytes * group.ratio:
                raise PropertyViolation(f"segment {i} block stride of layer {layer}: expected "
                                        f"{view.block_stride_bytes * group.ratio} bytes, got {4 * seg.block_stride}")


@kv_property(model=MODEL, strategy="ZEROING_CASES", examples=PINNED, sometimes=ZEROING_SOMETIMES)
def logical_block_zeroes_its_kernel_blocks(case: ZeroingCase, variant: ZeroingVariant) -> None:
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


@kv_property(model=MODEL, strategy="ZEROING_CASES", examples=PINNED, sometimes=ZEROING_SOMETIMES)
def zeroing_is_idempotent_and_order_free(case: ZeroingCase, variant: ZeroingVariant) -> None:
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


@kv_property(model=MODEL, strategy="DENSE_CASES", examples=(NON_UNIFORM_PAGES,))
def dense_layouts_zero_the_same_bytes(case: ZeroingCase, variant: ZeroingVariant) -> None:
    """2.4.8 no regression: on unpadded layouts with ratio 1 the page is the stride, so this variant's plan and
    both upstream planners write the same bytes: exactly the blocks' own."""
    arena = Arena.for_geometry(case.geometry)
    masks = {v.name: span_mask(arena.size, write_spans(plan_segments(case.geometry, v, arena=arena),
                                                       case.block_ids))
             for v in dict.fromkeys((variant,) + tuple(VARIANTS.values()))}
    expected = owned_bytes(case.geometry, arena, case.block_ids)
    for name, got in masks.items():
        if not np.array_equal(expected, got):
            raise PropertyViolation(f"bytes written by the {name} plan on a dense layout: expected "
                                    f"{int(expected.sum())} (the blocks' own), got {int(got.sum())}")


@kv_property(model=MODEL, strategy="OVERLAID_CASES", examples=(OVERLAID_GROUPS,))
def overlaid_groups_get_the_widest_page(case: ZeroingCase, variant: ZeroingVariant) -> None:
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
