"""Who acts in a kv-cache-manager counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (vLLM `vllm/v1/core/`): the scheduler, which calls the `KVCacheManager` (`get_computed_blocks`,
`allocate_slots`, `free`, `reset_prefix_cache`), and, with several KV cache groups, the KV connector the scheduler
hands a new request's local computed tokens (`get_num_new_matched_tokens`, #48195).
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .actions import Decode, Finish, Preempt, Reset, Schedule

SCHEDULER, MANAGER, CONNECTOR = "scheduler", "KVCacheManager", "KV connector"


def lifelines(system: Any) -> tuple[str, ...]:
    return (SCHEDULER, MANAGER, CONNECTOR) if len(system.cfg.kinds) > 1 else (SCHEDULER, MANAGER)


def _schedule(a: tuple, system: Any) -> tuple[tuple[str, str, str, bool], ...]:
    arrows = ((SCHEDULER, MANAGER, f"get_computed_blocks + allocate_slots(req {a.req})", False),)
    if len(system.cfg.kinds) > 1:
        arrows = ((SCHEDULER, CONNECTOR, f"local computed tokens of req {a.req}", False),) + arrows
    return arrows


_arrows = table({  # an action on the chart, by record type
    Schedule: _schedule,
    Decode: lambda a, system: ((SCHEDULER, MANAGER, f"allocate_slots(req {a.req}, 1)", False),),
    Finish: lambda a, system: ((SCHEDULER, MANAGER, f"free(req {a.req}): finished", False),),
    Preempt: lambda a, system: ((SCHEDULER, MANAGER, f"free(req {a.req}): preempted", False),),
    Reset: lambda a, system: ((SCHEDULER, MANAGER, "reset_prefix_cache()", False),),
}, lambda a, system: ((SCHEDULER, MANAGER, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action, system)
