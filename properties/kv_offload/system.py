"""The kv-offload transition system's stateful property (the #35846 bug report is in `bugs.toml`)."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "kv-offload"

OFFLOAD_INVARIANTS = stateful_property(
    model=MODEL, name="offload_system_invariants", home=__name__,
    doc="The manager's invariants hold on every step of Hypothesis-chosen request sequences (stores, "
        "completions and failures, loads, touches, finishes): capacity and free list, counters, jobs matching "
        "slots, store, load and failed-store semantics.")
