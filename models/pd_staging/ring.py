"""The decode-side staging ring (`StagingAllocator`) and the prefill write gate.

Follows sglang 05c7ebf (PR #30545): `StagingAllocator` (decode side, owned by
`DecodeStagingHandler`) and the prefill write gate `is_watermark_ready`,
under `python/sglang/srt/disaggregation/`, as read in the research note
../shared/research/sglang.md, sections 2.2 and 2.3 ("Ring `assign` and
`free`", "Prefill write gate"). Unchanged by 05c7ebf; one later change is a
variant flag (`free` takes the variant record).

The ring overcommits: `assign` wraps to offset 0 of a new round even while
allocations of the previous round are still live there. Safety comes from
the prefill side, which writes an allocation of round ``r > 0`` only once the
decode watermark (round and offset of the oldest live allocation, or the
head when none is live) says round ``r - 1`` no longer holds data under it.

The empty-ring case: at 05c7ebf (`fixed`) a free that empties the ring keeps
the stale head, so a wrapping allocation that ends past the old head waits
for a free that never comes. SGLang #37166 (0.5.19 and later; the
`fresh_round_when_empty` flag, on in `sglang_0_5_23`) starts a fresh round
instead: round + 1, head 0, watermark (round + 1, 0).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from operator import attrgetter
from typing import Iterable, Sequence

from kvsim.engine.errors import ConfigError, check_int

from .variants import FIXED, StagingVariant

Watermark = tuple[int, int]  # (wm_round, wm_tail), compared lexicographically


@dataclass(frozen=True)
class Allocation:
    alloc_id: int
    offset: int
    size: int
    round: int

    @property
    def end(self) -> int:
        return self.offset + self.size


_alloc_id = attrgetter("alloc_id")


def is_watermark_ready(alloc_round: int, end: int, watermark: Watermark) -> bool:
    """May prefill write an allocation of round `alloc_round` that ends at `end`?

    Round 0 never overwrites anything. Otherwise round ``r - 1`` must be
    entirely behind the watermark, or the watermark is in round ``r - 1`` at or
    past `end`.
    """
    if alloc_round == 0:
        return True
    wm_round, wm_tail = watermark
    prev = alloc_round - 1
    return prev < wm_round or (prev == wm_round and end <= wm_tail)


def merge_remote_watermark(known: Watermark, received: Watermark) -> Watermark:
    """`remote_watermarks[session]` only moves forward: a late WATERMARK cannot undo progress."""
    return max(known, received)


@dataclass(frozen=True)
class StagingAllocator:
    """Ring of `total` bytes. `allocations` are the live ones in assignment order (`alloc_order`
    with freed ids dropped: upstream pops freed ids lazily from the front, same oldest-live)."""

    total: int
    head: int = 0
    round: int = 0
    allocations: tuple[Allocation, ...] = ()
    next_id: int = 0
    watermark: Watermark = (0, 0)

    def __post_init__(self) -> None:
        check_int(self.total, "total", minimum=1)
        check_int(self.head, "head", minimum=0, maximum=self.total)

    def assign(self, size: int) -> tuple[Allocation | None, StagingAllocator]:
        """Allocate `size` bytes; None (ALLOC_OVERSIZED) only when `size > total`."""
        check_int(size, "size", minimum=1)
        if size > self.total:
            return None, self
        if size <= self.total - self.head:
            alloc = Allocation(self.next_id, self.head, size, self.round)
            head, rnd = self.head + size, self.round
        else:
            # overcommit: wrap even if the previous round still holds live data at [0, size)
            alloc = Allocation(self.next_id, 0, size, self.round + 1)
            head, rnd = size, self.round + 1
        return alloc, _ring(self.total, head, rnd, self.allocations + (alloc,), self.next_id + 1, self.watermark)

    def free(self, alloc_id: int, variant: StagingVariant = FIXED) -> StagingAllocator:
        """Free a live allocation and move the watermark to the oldest live one (or, when none is live,
        to the head at 05c7ebf, or to a fresh round's start since #37166)."""
        i = self._index(alloc_id)  # ids are unique: dropping that one is dropping every match
        if i is None:
            raise ConfigError("alloc_id", f"a live allocation id (one of {list(self.live_ids)})", alloc_id)
        live = self.allocations[:i] + self.allocations[i + 1:]
        total, head, rnd, next_id = self.total, self.head, self.round, self.next_id
        if live:
            return _ring(total, head, rnd, live, next_id, (live[0].round, live[0].offset))
        if variant.fresh_round_when_empty:  # #37166: the whole prior round is reusable; start the next at 0
            return _ring(total, 0, rnd + 1, live, next_id, (rnd + 1, 0))
        return _ring(total, head, rnd, live, next_id, (rnd, head))  # stale head (the #37166 hazard)

    @property
    def live_ids(self) -> tuple[int, ...]:
        return tuple(a.alloc_id for a in self.allocations)

    def get(self, alloc_id: int) -> Allocation:
        i = self._index(alloc_id)
        if i is None:
            raise ConfigError("alloc_id", "a live allocation id", alloc_id)
        return self.allocations[i]

    def _index(self, alloc_id: int) -> int | None:
        """Where the live allocation `alloc_id` is, or None. Ids are unique, and `assign` appends increasing
        ids, so a binary search finds it; a ring built with its allocations in another order is searched."""
        allocations = self.allocations
        i = bisect_left(allocations, alloc_id, key=_alloc_id)
        if i < len(allocations) and allocations[i].alloc_id == alloc_id:
            return i
        return next((i for i, a in enumerate(allocations) if a.alloc_id == alloc_id), None)

    def ready(self, alloc: Allocation) -> bool:
        return is_watermark_ready(alloc.round, alloc.end, self.watermark)


def _ring(total: int, head: int, rnd: int, allocations: tuple[Allocation, ...], next_id: int,
          watermark: Watermark) -> StagingAllocator:
    """`StagingAllocator(total, head, rnd, ...)` without `__init__`'s frame and checks: the ring `assign` or `free`
    makes from a valid one (its head within the ring); a timed simulation assigns and frees a slot per chunk. Each
    field set as the frozen dataclass's `__init__` sets it, in order (the instance keeps its attributes inline, no
    `__dict__` made: a stored state's ring is as small as the constructor's)."""
    ring = _object_new(StagingAllocator)
    _set(ring, "total", total)
    _set(ring, "head", head)
    _set(ring, "round", rnd)
    _set(ring, "allocations", allocations)
    _set(ring, "next_id", next_id)
    _set(ring, "watermark", watermark)
    return ring


_object_new, _set = object.__new__, object.__setattr__


@dataclass(frozen=True)
class RingStep:
    """One applied op: what it did and the ring after it."""

    op: str  # "assign" or "free"
    arg: int  # bytes asked, or the id freed
    alloc: Allocation | None
    ring: StagingAllocator


def apply_ring_ops(ring: StagingAllocator, ops: Iterable[tuple[str, int]],
                   variant: StagingVariant = FIXED) -> list[RingStep]:
    """Apply `("assign", size)` and `("free", pick)` ops in turn (frees as `variant` frees).

    `pick` selects a live allocation by position, modulo the number live, so
    any generated sequence is valid; a free with nothing live is skipped.
    """
    steps: list[RingStep] = []
    for op, arg in ops:
        if op == "assign":
            alloc, ring = ring.assign(arg)
            steps.append(RingStep(op, arg, alloc, ring))
        elif op == "free":
            if not ring.allocations:
                continue
            victim = ring.allocations[arg % len(ring.allocations)]
            ring = ring.free(victim.alloc_id, variant)
            steps.append(RingStep(op, victim.alloc_id, victim, ring))
        else:
            raise ConfigError("op", "'assign' or 'free'", op)
    return steps


def overlaps(a: Allocation, b: Allocation) -> bool:
    return a.offset < b.end and b.offset < a.end


def unsafe_ready_pairs(ring: StagingAllocator) -> list[tuple[Allocation, Allocation]]:
    """(ready allocation, older-round live allocation it overlaps): writes the gate lets through into live data."""
    return [(a, b) for a in ring.allocations if ring.ready(a)
            for b in ring.allocations if b.round < a.round and overlaps(a, b)]


def same_round_overlaps(allocs: Sequence[Allocation]) -> list[tuple[Allocation, Allocation]]:
    return [(a, b) for i, a in enumerate(allocs) for b in allocs[i + 1:] if a.round == b.round and overlaps(a, b)]
