"""Who acts in a kv-cache-manager counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (vLLM `vllm/v1/core/`): the scheduler, which calls the `KVCacheManager`; for the P/D life cycle
(`kv-cache-manager-pd`, `scheduler.py`) also the model runner, whose step outputs come back late (async
scheduling), and the producing KV connector, which `request_finished` hands a finished request's blocks and which
reports `finished_sending` once the decode side has read them. A stale output that is processed (not dropped, as
before #50297) is drawn as a fault.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .scheduler import Decode, Deliver, Handed, Output, Preempt, ProducerSchedulerSystem, Schedule

SCHEDULER, MANAGER, RUNNER, CONNECTOR = "scheduler", "KVCacheManager", "model runner", "KV connector (producer)"


def lifelines(system: Any) -> tuple[str, ...]:
    if isinstance(system, ProducerSchedulerSystem):
        return (SCHEDULER, MANAGER, RUNNER, CONNECTOR)
    return (SCHEDULER, MANAGER)


def _output(a: Any, system: Any, state: Any) -> tuple[tuple[str, str, str, bool], ...]:
    req = state.requests[a.req]
    stale = req.stale > 0
    label = f"output of req {a.req}" + (" (stale: dropped)" if stale and req.drop_stale else
                                        " (stale: processed)" if stale else "")
    out = [(RUNNER, SCHEDULER, label, stale and not req.drop_stale)]
    for e in system.transition(state, a)[1]:
        if isinstance(e, Handed):
            out.append((SCHEDULER, CONNECTOR, f"request_finished(req {e.req}, blocks {list(e.blocks)})", False))
    return tuple(out)


_pd_arrows = table({  # an action of the P/D life cycle on the chart, by record type
    Schedule: lambda a, system, s: ((SCHEDULER, MANAGER, f"get_computed_blocks, allocate_slots(req {a.req})", False),
                                    (SCHEDULER, RUNNER, f"step: prefill req {a.req}", False)),
    Decode: lambda a, system, s: ((SCHEDULER, MANAGER, f"allocate_slots(req {a.req})", False),
                                  (SCHEDULER, RUNNER, f"step: decode req {a.req}", False)),
    Output: _output,
    Preempt: lambda a, system, s: ((SCHEDULER, MANAGER, f"preempt req {a.req}: free", False),),
    Deliver: lambda a, system, s: ((CONNECTOR, SCHEDULER, f"finished_sending(req {a.req})", False),
                                   (SCHEDULER, MANAGER, f"free(req {a.req})", False)),
}, lambda a, system, s: _call(a))


def _call(a: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    """A kv-cache-manager action: the scheduler's call on the manager for a request (or reset_prefix_cache)."""
    return ((SCHEDULER, MANAGER, a[0] + "".join(f" req {r}" for r in a[1:]), False),)


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    if isinstance(system, ProducerSchedulerSystem):
        return _pd_arrows(action, system, state)
    return _call(action)
