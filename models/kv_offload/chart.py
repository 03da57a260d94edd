"""Who acts in a kv-offload counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (vLLM `vllm/v1/kv_offload/`): the scheduler side of the offloading connector, which calls the
CPU `OffloadingManager` (`prepare_store`, `prepare_load`, `touch`, `reset_cache`), and the offloading
worker, whose finished transfer jobs come back as `complete_store` / `complete_load`.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .actions import CompleteLoad, CompleteStore, Finish, Load, Reset, Store, Touch

SCHEDULER, MANAGER, WORKER = "scheduler (connector)", "CPU OffloadingManager", "offloading worker"


def lifelines(system: Any) -> tuple[str, ...]:
    return (SCHEDULER, MANAGER, WORKER)


def _complete_store(a: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    ok = bool(a.success)
    return ((WORKER, MANAGER, f"complete_store(req {a.req}, success={ok})", not ok),)


_arrows = table({  # an action on the chart, by record type
    Store: lambda a: ((SCHEDULER, MANAGER, f"prepare_store(req {a.req})", False),),
    Load: lambda a: ((SCHEDULER, MANAGER, f"prepare_load(req {a.req})", False),),
    Touch: lambda a: ((SCHEDULER, MANAGER, f"touch(req {a.req})", False),),
    Finish: lambda a: ((SCHEDULER, SCHEDULER, f"request {a.req} finished", False),),
    Reset: lambda a: ((SCHEDULER, MANAGER, "reset_cache()", False),),
    CompleteStore: _complete_store,
    CompleteLoad: lambda a: ((WORKER, MANAGER, f"complete_load(req {a.req})", False),),
}, lambda a: ((SCHEDULER, MANAGER, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action)
