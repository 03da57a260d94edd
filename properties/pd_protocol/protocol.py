"""The room lifecycle transition system (P1, P2, P3, P5, P7 as invariants; P8 as liveness) as a stateful property.

`protocol_invariants` runs `PdProtocol` under the generic Hypothesis state
machine; the bug reports found by `explore` are in `bugs.toml` (each names the
invariant that fails, with the parameters of the smallest configuration that
holds it).
"""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "pd-protocol"

PROTOCOL_INVARIANTS = stateful_property(
    model=MODEL, name="protocol_invariants", home=__name__,
    doc="P1, P2, P3, P5 and P7 hold on every step of Hypothesis-chosen interleavings of messages, "
        "timeouts and faults (one backend; --param backend=...).")
