"""The radix-cache-swa transition system's stateful property (the unified cache's SWA component,
`models/radix_cache/swa_system.py`)."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "radix-cache-swa"

UNIFIED_SWA_INVARIANTS = stateful_property(
    model=MODEL, name="unified_swa_invariants", home=__name__,
    doc="The unified radix cache's Full and SWA lock counts and pools hold on every step of Hypothesis-chosen "
        "request sequences (admit with prefix hits and eviction of either pool, decode with the early release of "
        "the SWA window lock, retract, finish): per-node lock order full >= swa, full lock counts, SWA window "
        "locks released past the window, per-pool accounting, unlocked-only eviction, no double free.")
