"""Who acts in a kv-cache-manager counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (vLLM `vllm/v1/core/`): the scheduler, which calls the `KVCacheManager` (`get_computed_blocks`,
`allocate_slots`, `free`, `reset_prefix_cache`), and, with several KV cache groups, the KV connector the scheduler
hands a new request's local computed tokens (`get_num_new_matched_tokens`, #48195). For the P/D life cycle
(`kv-cache-manager-pd`, `scheduler.py`) also the model runner, whose step outputs come back late (async
scheduling), and the producing KV connector, which `request_finished` hands a finished request's blocks and which
reports `finished_sending` once the decode side has read them. A stale output that is processed (not dropped, as
before #50297) is drawn as a fault.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from . import scheduler as pd
from .actions import Decode, Finish, Preempt, Reset, Schedule

SCHEDULER, MANAGER, CONNECTOR = "scheduler", "KVCacheManager", "KV connector"
RUNNER, PRODUCER = "model runner", "KV connector (producer)"


def lifelines(system: Any) -> tuple[str, ...]:
    if isinstance(system, pd.ProducerSchedulerSystem):
        return (SCHEDULER, MANAGER, RUNNER, PRODUCER)
    return (SCHEDULER, MANAGER, CONNECTOR) if len(system.cfg.kinds) > 1 else (SCHEDULER, MANAGER)


def _schedule(a: tuple, system: Any) -> tuple[tuple[str, str, str, bool], ...]:
    arrows = ((SCHEDULER, MANAGER, f"get_computed_blocks + allocate_slots(req {a.req})", False),)
    if len(system.cfg.kinds) > 1:
        arrows = ((SCHEDULER, CONNECTOR, f"local computed tokens of req {a.req}", False),) + arrows
    return arrows


_arrows = table({  # an action of kv-cache-manager on the chart, by record type
    Schedule: _schedule,
    Decode: lambda a, system: ((SCHEDULER, MANAGER, f"allocate_slots(req {a.req}, 1)", False),),
    Finish: lambda a, system: ((SCHEDULER, MANAGER, f"free(req {a.req}): finished", False),),
    Preempt: lambda a, system: ((SCHEDULER, MANAGER, f"free(req {a.req}): preempted", False),),
    Reset: lambda a, system: ((SCHEDULER, MANAGER, "reset_prefix_cache()", False),),
}, lambda a, system: ((SCHEDULER, MANAGER, a[0], False),))


def _output(a: Any, system: Any, state: Any) -> tuple[tuple[str, str, str, bool], ...]:
    req = state.requests[a.req]
    stale = req.stale > 0
    label = f"output of req {a.req}" + (" (stale: dropped)" if stale and req.drop_stale else
                                        " (stale: processed)" if stale else "")
    out = [(RUNNER, SCHEDULER, label, stale and not req.drop_stale)]
    for e in system.transition(state, a)[1]:
        if isinstance(e, pd.Handed):
            out.append((SCHEDULER, PRODUCER, f"request_finished(req {e.req}, blocks {list(e.blocks)})", False))
    return tuple(out)


_pd_arrows = table({  # an action of the P/D life cycle (kv-cache-manager-pd) on the chart, by record type
    pd.Schedule: lambda a, system, s: (
        (SCHEDULER, MANAGER, f"get_computed_blocks, allocate_slots(req {a.req})", False),
        (SCHEDULER, RUNNER, f"step: prefill req {a.req}", False)),
    pd.Decode: lambda a, system, s: ((SCHEDULER, MANAGER, f"allocate_slots(req {a.req})", False),
                                     (SCHEDULER, RUNNER, f"step: decode req {a.req}", False)),
    pd.Output: _output,
    pd.Preempt: lambda a, system, s: ((SCHEDULER, MANAGER, f"preempt req {a.req}: free", False),),
    pd.Deliver: lambda a, system, s: ((PRODUCER, SCHEDULER, f"finished_sending(req {a.req})", False),
                                      (SCHEDULER, MANAGER, f"free(req {a.req})", False)),
}, lambda a, system, s: ((SCHEDULER, MANAGER, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    if isinstance(system, pd.ProducerSchedulerSystem):
        return _pd_arrows(action, system, state)
    return _arrows(action, system)
