"""Who acts in a swa-budget counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (SGLang `python/sglang/srt/managers/`): arriving requests, the `Scheduler` (decode steps,
retraction, `resume_retracted_reqs`), and the two-pool SWA token-to-KV allocator it charges.
"""

from __future__ import annotations

from typing import Any

REQUESTS, SCHEDULER, ALLOCATOR = "requests", "Scheduler", "SWA KV allocator (full + swa pools)"


def lifelines(system: Any) -> tuple[str, ...]:
    return (REQUESTS, SCHEDULER, ALLOCATOR)


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    kind = action[0]
    if kind == "arrive":
        return ((REQUESTS, SCHEDULER, f"request {state.next_arrival} arrives", False),
                (SCHEDULER, ALLOCATOR, "prefill: alloc pages", False))
    if kind == "decode":
        return ((SCHEDULER, ALLOCATOR, "decode step: one token each", False),)
    if kind == "retract":
        return ((SCHEDULER, ALLOCATOR, f"retract request {action.rid}: free pages", False),)
    if kind == "resume":
        return ((SCHEDULER, ALLOCATOR, "resume_retracted_reqs: _pre_alloc", False),)
    return ((SCHEDULER, SCHEDULER, kind, False),)
