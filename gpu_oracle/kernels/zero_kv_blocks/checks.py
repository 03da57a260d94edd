"""Differential checks of the KV block zeroing kernel against `models.kv_zeroing` (research note 2.4.7).

* `zero_kv_blocks.differential`: Hypothesis-generated geometries planned by
  both variants (the pre-fix tables write into the arena's red zones, which
  the backend must reproduce too), raw segment tables, random block lists
  and chunk widths that need not divide the page: the backend's bytes equal
  the reference memset's, bit for bit.
* `zero_kv_blocks.sentinel`: the pinned upstream geometries on a buffer full
  of a sentinel byte: the blocks' bytes become 0, every other byte keeps it.
* `zero_kv_blocks.asan_catches_pre_d6af803`: the pre-fix segment table of the
  pinned cases through the ASan build; AddressSanitizer must stop the kernel
  at its store (the bug report seen from the kernel), and the fixed table
  must run clean.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.errors import PropertyViolation
from kvsim.models.kv_zeroing.zeroer import VARIANTS, Segment, SegmentTable, plan_segments, zero_blocks
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry, owned_bytes, owner_of
from kvsim.models.kv_zeroing.layouts import (combine, deepseek_v4_geometry, dense_layout, last_block_page_geometry,
                                       non_uniform_pages_geometry, overlaid_groups_geometry, overlaid_layout,
                                       packed_layout)

from ...runtime import asan
from ...runtime.checks import CheckOutcome, hypothesis_check, oracle_check
from .backends import zero_kv_blocks

SENTINEL = 0xA5


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


# --- strategies (same layout families as the model's properties, plus raw tables) ----------------------

def _unit(width_bytes: int) -> int:
    return 4 // math.gcd(4, width_bytes)


@st.composite
def _geometries(draw: st.DrawFn, num_blocks: int) -> KVCacheGeometry:
    el = draw(st.sampled_from((4, 2, 1)))
    kbs, ratio = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    family = draw(st.sampled_from(("packed", "dense", "overlaid")))
    if family == "packed":
        widths = [w * _unit(kbs * el) for w in draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))]
        return packed_layout(num_blocks=num_blocks, kernel_block_size=kbs, widths=widths, element_size=el,
                             ratio=ratio, align=draw(st.sampled_from((4, 16, 64))),
                             row_padding=draw(st.sampled_from((0, 4, 12))),
                             head_offset=draw(st.sampled_from((0, 8))))
    if family == "dense":
        kv = draw(st.sampled_from(("outer", "none", "inner") if num_blocks * ratio > 1 else ("none", "inner")))
        return dense_layout(num_blocks=num_blocks, kernel_block_size=kbs, heads=draw(st.integers(1, 2)),
                            head_size=_unit(kbs * el) * 2 * draw(st.integers(1, 20)), element_size=el, kv=kv,
                            ratio=ratio, block_padding=draw(st.sampled_from((0, 4, 32))))
    group = st.lists(st.integers(1, 20).map(lambda w: w * _unit(kbs * el)), min_size=1, max_size=2)
    return overlaid_layout(num_blocks=num_blocks, kernel_block_size=kbs, element_size=el, ratio=ratio,
                           group_widths=draw(st.lists(group, min_size=2, max_size=3)))


def _ids(num_blocks: int) -> st.SearchStrategy[tuple[int, ...]]:
    one = st.one_of(st.just(num_blocks - 1), st.integers(0, num_blocks - 1))
    return st.lists(one, min_size=0, max_size=6).map(tuple)


_chunk_widths = st.one_of(st.none(), st.integers(1, 64), st.sampled_from((1, 32, 128, 256, 1024)))


@st.composite
def planned_cases(draw: st.DrawFn, variants: tuple[str, ...] = VARIANTS) -> KernelCase:
    num_blocks = draw(st.integers(1, 5))
    geometry = combine(*draw(st.lists(_geometries(num_blocks), min_size=1, max_size=3)))
    arena = Arena.for_geometry(geometry)
    table = plan_segments(geometry, draw(st.sampled_from(variants)), arena=arena)
    return KernelCase(arena, table, draw(_ids(num_blocks)), draw(_chunk_widths),
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
    return KernelCase(arena, table, draw(_ids(num_blocks)), draw(_chunk_widths), draw(st.integers(0, 2**32 - 1)))


def _describe(case: KernelCase) -> dict:
    return {"segments": [(s.addr, s.block_stride, s.page) for s in case.table.segments],
            "variant": case.table.variant, "block_ids": case.block_ids, "chunk_width": case.chunk_width,
            "allocations": list(case.arena.sizes), "geometry": case.geometry}


# --- checks ------------------------------------------------------------------------------------------

@oracle_check("zero_kv_blocks.differential")
def differential(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """For generated geometries, segment tables, block lists and chunk widths, the backend's bytes equal the
    reference memset's bit for bit, including pages that are not a multiple of the chunk width."""
    # Under ASan an out-of-bounds store aborts the run, so only tables that stay in bounds go there.
    variants = ("fixed",) if backend == "cpu-shim-asan" else VARIANTS
    strategy = st.one_of(planned_cases(variants), raw_cases())

    def test(case: KernelCase) -> None:
        memory = case.memory()
        expected = memory.copy()
        zero_blocks(expected, case.table, case.block_ids)
        got = zero_kv_blocks(backend, memory, case.table, case.block_ids, chunk_width=case.chunk_width,
                             arena=case.arena)
        differ = np.flatnonzero(expected != got)
        if len(differ):
            at = int(differ[0])
            raise PropertyViolation(f"bytes differing from the reference memset on {backend}: expected 0, got "
                                    f"{len(differ)} (first at {case.arena.describe(at)}: reference "
                                    f"{expected[at]}, {backend} {got[at]})")

    return hypothesis_check(strategy, test, max_examples, seed, _describe)


def pinned_cases() -> list[tuple[str, KVCacheGeometry, tuple[int, ...]]]:
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


@oracle_check("zero_kv_blocks.sentinel")
def sentinel(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """On the pinned upstream geometries with every byte set to a sentinel, the zeroed blocks' bytes become 0
    and every neighbour (other layers, padding, other blocks, red zones) keeps the sentinel."""
    examples = 0
    for name, geometry, ids in pinned_cases():
        arena = Arena.for_geometry(geometry)
        table = plan_segments(geometry, "fixed", arena=arena)
        target = owned_bytes(geometry, arena, ids)
        for chunk_width in (None, 3):  # 3 divides no power-of-two page: the mask does the work
            examples += 1
            got = zero_kv_blocks(backend, np.full(arena.size, SENTINEL, dtype=np.uint8), table, ids,
                                 chunk_width=chunk_width, arena=arena)
            for what, bad in (("left nonzero in the zeroed blocks", target & (got != 0)),
                              ("changed from the sentinel outside them", ~target & (got != SENTINEL))):
                if bad.any():
                    where = owner_of(geometry, arena, int(np.flatnonzero(bad)[0]))
                    return CheckOutcome(examples, "failed", f"{name}, chunk width {chunk_width}: bytes {what}: "
                                        f"expected 0, got {int(bad.sum())} (first at {where})")
    return CheckOutcome(examples, "passed", "")


@oracle_check("zero_kv_blocks.asan_catches_pre_d6af803", backends=("cpu-shim-asan",), asan_in_child=False)
def asan_catches_pre_fix(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """The pre-fix segment table of the pinned packed cases, zeroing the last block, stops under
    AddressSanitizer with a heap-buffer-overflow WRITE in zero_kv_blocks.cu; the fixed table runs clean and
    gives the reference bytes."""
    examples, caught = 0, []
    for geometry, ids in ((last_block_page_geometry(), (3,)), (deepseek_v4_geometry(), (99,))):
        arena = Arena.for_geometry(geometry)
        for variant in ("pre_d6af803", "fixed"):
            examples += 1
            table = plan_segments(geometry, variant, arena=arena)
            child = asan.run_case(arena, table, ids, fill=SENTINEL)
            if variant == "pre_d6af803":
                report = child.report
                if report is None or report.kind != "heap-buffer-overflow" or report.access != "WRITE" \
                        or not report.file.endswith("zero_kv_blocks.cu"):
                    return CheckOutcome(examples, "failed", f"pre-fix table, blocks {ids}: expected an ASan "
                                        f"heap-buffer-overflow WRITE in zero_kv_blocks.cu, got {child.explain()}")
                caught.append(str(report))
                continue
            expected = np.full(arena.size, SENTINEL, dtype=np.uint8)
            zero_blocks(expected, table, ids)
            digest = hashlib.sha256(expected.tobytes()).hexdigest()
            if not child.clean or child.output is None or child.output["sha256"] != digest:
                return CheckOutcome(examples, "failed", f"fixed table, blocks {ids}: expected a clean run with "
                                    f"the reference bytes, got {child.explain()}")
    return CheckOutcome(examples, "passed", f"caught: {caught[0]}")
