"""pipelined-transfer: the stateful property; the bug reports of section 1.12 (explore-driven) are in `bugs.toml`."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "pipelined-transfer"

TRANSFER_INVARIANTS = stateful_property(
    model=MODEL, name="transfer_invariants", home=__name__,
    doc="S1-S3, S5-S9, E1 and E2 hold on every step of Hypothesis-chosen interleavings of forward steps, "
        "fabric writes, result frames, collective polls, timeouts and faults.")
