"""Who acts in a swa-budget counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (SGLang `python/sglang/srt/managers/`): arriving requests, the `Scheduler` (decode steps,
retraction, `resume_retracted_reqs`), and the two-pool SWA token-to-KV allocator it charges.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .scheduler import Arrive, Decode, Resume, Retract

REQUESTS, SCHEDULER, ALLOCATOR = "requests", "Scheduler", "SWA KV allocator (full + swa pools)"


def lifelines(system: Any) -> tuple[str, ...]:
    return (REQUESTS, SCHEDULER, ALLOCATOR)


_arrows = table({  # an action on the chart, by record type (`state`: the state it is taken in)
    Arrive: lambda a, state: ((REQUESTS, SCHEDULER, f"request {state.next_arrival} arrives", False),
                              (SCHEDULER, ALLOCATOR, "prefill: alloc pages", False)),
    Decode: lambda a, state: ((SCHEDULER, ALLOCATOR, "decode step: one token each", False),),
    Retract: lambda a, state: ((SCHEDULER, ALLOCATOR, f"retract request {a.rid}: free pages", False),),
    Resume: lambda a, state: ((SCHEDULER, ALLOCATOR, "resume_retracted_reqs: _pre_alloc", False),),
}, lambda a, state: ((SCHEDULER, SCHEDULER, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action, state)
