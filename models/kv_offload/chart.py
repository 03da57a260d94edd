"""Who acts in a kv-offload counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (vLLM `vllm/v1/kv_offload/`): the scheduler side of the offloading connector, which calls the
CPU `OffloadingManager` (`prepare_store`, `prepare_load`, `touch`, `reset_cache`), and the offloading
worker, whose finished transfer jobs come back as `complete_store` / `complete_load`.
"""

from __future__ import annotations

from typing import Any

SCHEDULER, MANAGER, WORKER = "scheduler (connector)", "CPU OffloadingManager", "offloading worker"


def lifelines(system: Any) -> tuple[str, ...]:
    return (SCHEDULER, MANAGER, WORKER)


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    kind = action[0]
    if kind == "store":
        return ((SCHEDULER, MANAGER, f"prepare_store(req {action.req})", False),)
    if kind == "load":
        return ((SCHEDULER, MANAGER, f"prepare_load(req {action.req})", False),)
    if kind == "touch":
        return ((SCHEDULER, MANAGER, f"touch(req {action.req})", False),)
    if kind == "finish":
        return ((SCHEDULER, SCHEDULER, f"request {action.req} finished", False),)
    if kind == "reset":
        return ((SCHEDULER, MANAGER, "reset_cache()", False),)
    if kind == "complete_store":
        ok = bool(action.success)
        return ((WORKER, MANAGER, f"complete_store(req {action.req}, success={ok})", not ok),)
    if kind == "complete_load":
        return ((WORKER, MANAGER, f"complete_load(req {action.req})", False),)
    return ((SCHEDULER, MANAGER, kind, False),)
