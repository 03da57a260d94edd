"""Kernel properties of the zeroing kernel against model `kv-zeroing` (research note 2.4.7).

* `zero_kv_blocks_differential`: generated geometries planned by every
  variant (the pre-fix tables write into the arena's red zones, which the
  backend must reproduce too), raw segment tables, random block lists and
  chunk widths that need not divide the page: the backend's bytes equal the
  reference memset's, bit for bit.
* `zero_kv_blocks_sentinel`: the pinned upstream geometries on a buffer full
  of a sentinel byte: the blocks' bytes become 0, every other byte keeps it.
* `zero_kv_blocks_asan_catches_pre_d6af803`: the pre-fix segment table of the
  pinned packed cases through the ASan build; AddressSanitizer must stop the
  kernel at its store (the bug report seen from the kernel), and the fixed
  table must run clean.

The kernel has no variants: these properties hold on every variant of the
model (the variant argument is not read; the cases carry their tables).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kernel_property
from kvsim.models.kv_zeroing.geometry import Arena, owned_bytes, owner_of
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.models.kv_zeroing.zeroer import plan_segments, zero_blocks

from ...runtime import asan
from ...runtime.discovery import BACKEND_NAMES
from .backends import case_document, zero_kv_blocks
from .cases import SENTINEL, KernelCase, PinnedCase, writes_in_bounds

MODEL = "kv-zeroing"


@kernel_property(model=MODEL, strategy="kernel_cases", backends=BACKEND_NAMES)
def zero_kv_blocks_differential(case: KernelCase, variant: Any, backend: str) -> None:
    """For generated geometries, segment tables, block lists and chunk widths, the backend's bytes equal the
    reference memset's bit for bit, including pages that are not a multiple of the chunk width."""
    if backend == "cpu-shim-asan" and not case.in_bounds():
        return  # ASan would stop the run at the first store past an allocation: the other backends compare it
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


@kernel_property(model=MODEL, strategy="sentinel", backends=BACKEND_NAMES)
def zero_kv_blocks_sentinel(case: PinnedCase, variant: Any, backend: str) -> None:
    """On the pinned upstream geometries with every byte set to a sentinel, the zeroed blocks' bytes become 0
    and every neighbour (other layers, padding, other blocks, red zones) keeps the sentinel."""
    arena = Arena.for_geometry(case.geometry)
    table = plan_segments(case.geometry, variant=VARIANTS.fixed, arena=arena)
    target = owned_bytes(case.geometry, arena, case.block_ids)
    got = zero_kv_blocks(backend, np.full(arena.size, SENTINEL, dtype=np.uint8), table, case.block_ids,
                         chunk_width=case.chunk_width, arena=arena)
    for what, bad in (("left nonzero in the zeroed blocks", target & (got != 0)),
                      ("changed from the sentinel outside them", ~target & (got != SENTINEL))):
        if bad.any():
            where = owner_of(case.geometry, arena, int(np.flatnonzero(bad)[0]))
            raise PropertyViolation(f"{case.name}, chunk width {case.chunk_width}: bytes {what}: expected 0, "
                                    f"got {int(bad.sum())} (first at {where})")


@kernel_property(model=MODEL, strategy="overruns", backends=("cpu-shim-asan",), asan_in_child=False)
def zero_kv_blocks_asan_catches_pre_d6af803(case: PinnedCase, variant: Any, backend: str) -> None:
    """The pre-fix segment table of the pinned packed cases, zeroing the last block, stops under
    AddressSanitizer with a heap-buffer-overflow WRITE in zero_kv_blocks.cu; the fixed table runs clean and
    gives the reference bytes."""
    arena = Arena.for_geometry(case.geometry)
    table = plan_segments(case.geometry, variant=VARIANTS[case.variant], arena=arena)
    what = f"{case.name}, {case.variant} table, blocks {case.block_ids}"
    if writes_in_bounds(arena, table, case.block_ids) == case.overrun:
        raise PropertyViolation(f"{what}: expected the model's table to {'overrun' if case.overrun else 'stay in'} "
                                f"its allocation, got the opposite")
    child = asan.run_case("zero_kv_blocks", case_document(arena, table, case.block_ids, fill=SENTINEL))
    if case.overrun:
        asan.expect_overflow(what, child, "WRITE", "zero_kv_blocks.cu")
        return
    expected = np.full(arena.size, SENTINEL, dtype=np.uint8)
    zero_blocks(expected, table, case.block_ids)
    asan.expect_clean(what, child, expected)
