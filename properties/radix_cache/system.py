"""The radix-cache transition system's stateful property."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "radix-cache"

RADIX_CACHE_INVARIANTS = stateful_property(
    model=MODEL, name="radix_cache_invariants", home=__name__,
    doc="The radix cache's and the paged allocator's invariants hold on every step of Hypothesis-chosen request "
        "sequences (admit with prefix hits and eviction, decode, retract, finish): pool accounting page by page, "
        "lock counts and sizes, the tree's shape, the free list, page-aligned rows, the longest match, no double "
        "free, the request pool's rows, nothing held once all requests ended.")
