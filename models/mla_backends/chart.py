"""Who acts in an mla-backends counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (FlashInfer #4031): the caller (the attention layer's `plan()` and `run()` calls), the
`BatchMLAPagedAttentionWrapper`, and the backend it selects, lowers and publishes.
"""

from __future__ import annotations

from typing import Any

CALLER, WRAPPER, BACKEND = "caller (attention layer)", "BatchMLAPagedAttentionWrapper", "selected backend"


def lifelines(system: Any) -> tuple[str, ...]:
    return (CALLER, WRAPPER, BACKEND)


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    kind = action[0]
    if kind == "plan":
        return ((CALLER, WRAPPER, f"plan(request {action.request})", False),)
    if kind == "select":
        fault = action.fault
        label = "select backend" if fault is None else f"select backend: {fault[0]} at candidate {fault[1]}"
        return ((WRAPPER, BACKEND, label, fault is not None),)
    if kind == "advance":
        return ((WRAPPER, BACKEND, "next plan stage", False),)
    if kind == "fail":
        return ((BACKEND, WRAPPER, f"stage fails: {action.kind}", True),)
    if kind == "run":
        return ((CALLER, WRAPPER, f"run(lse={action.lse_mode})", False),
                (WRAPPER, BACKEND, "dispatch", False))
    return ((WRAPPER, WRAPPER, kind, False),)
