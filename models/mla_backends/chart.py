"""Who acts in an mla-backends counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (FlashInfer #4031): the caller (the attention layer's `plan()` and `run()` calls), the
`BatchMLAPagedAttentionWrapper`, and the backend it selects, lowers and publishes.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .wrapper import Advance, Fail, Plan, Run, Select

CALLER, WRAPPER, BACKEND = "caller (attention layer)", "BatchMLAPagedAttentionWrapper", "selected backend"


def lifelines(system: Any) -> tuple[str, ...]:
    return (CALLER, WRAPPER, BACKEND)


def _select(a: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    fault = a.fault
    label = "select backend" if fault is None else f"select backend: {fault[0]} at candidate {fault[1]}"
    return ((WRAPPER, BACKEND, label, fault is not None),)


_arrows = table({  # an action on the chart, by record type
    Plan: lambda a: ((CALLER, WRAPPER, f"plan(request {a.request})", False),),
    Select: _select,
    Advance: lambda a: ((WRAPPER, BACKEND, "next plan stage", False),),
    Fail: lambda a: ((BACKEND, WRAPPER, f"stage fails: {a.kind}", True),),
    Run: lambda a: ((CALLER, WRAPPER, f"run(lse={a.lse_mode})", False), (WRAPPER, BACKEND, "dispatch", False)),
}, lambda a: ((WRAPPER, WRAPPER, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action)
