"""The kv-cache-manager transition system's stateful property."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "kv-cache-manager"

CACHE_MANAGER_INVARIANTS = stateful_property(
    model=MODEL, name="cache_manager_invariants", home=__name__,
    doc="The block pool's invariants hold on every step of Hypothesis-chosen request sequences (schedule with "
        "prefix-cache hits, decode, finish, preempt, reset_prefix_cache): ref counts, the free queue and its "
        "eviction order, pool accounting, the cached map, the KV events, nothing held once all requests ended.")
