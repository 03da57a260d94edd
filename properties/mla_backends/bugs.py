"""The mla-backends lifecycle's stateful property (the bug reports are data, in `bugs.toml`)."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "mla-backends"

WRAPPER_INVARIANTS = stateful_property(
    model=MODEL, name="wrapper_invariants", home=__name__,
    doc="The plan/run lifecycle's invariants hold on every step of Hypothesis-chosen plan, fault and run "
        "sequences (no half-published plan, run never selects, CUDA-graph plans stay).")
