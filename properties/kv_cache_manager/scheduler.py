"""The kv-cache-manager-pd transition system's stateful property (the P/D life cycle, `models/kv_cache_manager/
scheduler.py`)."""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "kv-cache-manager-pd"

PD_SCHEDULER_INVARIANTS = stateful_property(
    model=MODEL, name="pd_scheduler_invariants", home=__name__,
    doc="The P/D life cycle's invariants hold on every step of Hypothesis-chosen schedules (prefill, decode, "
        "outputs returning late, preemption under pressure, delivery): a request finished into the producing "
        "connector still owns the blocks request_finished got, ref counts, the free queue, pool accounting, "
        "nothing held once every request is done.")
