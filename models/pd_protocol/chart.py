"""Who acts in a pd-protocol counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (SGLang `python/sglang/srt/disaggregation/`, Mooncake/NIXL/Mori connectors): the prefill
manager's constructor (its start-up steps), the prefill scheduler, its transfer worker queue, the
bootstrap thread that reads the decode's frames, the decode thread that reads status frames, and the
decode scheduler (registration, TransferInfo, timeouts, heartbeat).
"""

from __future__ import annotations

from typing import Any

from ..pd_common.status import KVPoll
from .actions import PREFILL

MANAGER, SCHEDULER, WORKER = "prefill manager (__init__)", "prefill scheduler", "transfer worker queue"
BOOTSTRAP, DECODE_THREAD, DECODE = "bootstrap thread", "decode thread", "decode scheduler"


def lifelines(system: Any) -> tuple[str, ...]:
    return (MANAGER, SCHEDULER, WORKER, BOOTSTRAP, DECODE_THREAD, DECODE)


def message(m: tuple) -> str:
    if m[0] == "STATUS":
        return f"STATUS r{m.room} {KVPoll(m.status).name}"
    if m[0] in ("TINFO", "ABORT"):
        return f"{m[0]} r{m.room}"
    return m[0]


def _sender(m: tuple) -> str:
    """Who put a status frame in flight: the worker on Success, the scheduler's timeout on Failed."""
    return WORKER if m[0] == "STATUS" and m.status == int(KVPoll.Success) else SCHEDULER


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    kind = action[0]
    if kind == "init":
        return ((MANAGER, MANAGER, action.step, False),)
    if kind == "deliver_prefill":
        return ((DECODE, BOOTSTRAP, message(action.message), False),)
    if kind == "deliver_decode":
        return ((_sender(action.message), DECODE_THREAD, message(action.message), False),)
    if kind == "enqueue":
        return ((SCHEDULER, WORKER, f"enqueue r{action.room} chunk", False),)
    if kind == "work":
        head = state.queue[0] if state.queue else None
        return ((WORKER, WORKER, f"send r{head.room} chunk {head.chunk}" if head else "work", False),)
    if kind == "clear":
        return ((SCHEDULER, SCHEDULER, f"clear r{action.room}", False),)
    if kind == "bootstrap_timeout":
        return ((SCHEDULER, SCHEDULER, f"bootstrap timeout r{action.room}", False),)
    if kind == "decode_init":
        return ((DECODE, DECODE, f"init r{action.room}", False),)
    if kind == "decode_abort":
        return ((DECODE, DECODE, f"waiting timeout r{action.room}", False),)
    if kind == "heartbeat_miss":
        return ((DECODE, DECODE, "heartbeat miss", False),)
    if kind in ("drop", "duplicate"):
        to_prefill = action.side == PREFILL
        sender = DECODE if to_prefill else _sender(action.message)
        return ((sender, BOOTSTRAP if to_prefill else DECODE_THREAD, f"{kind.upper()} {message(action.message)}",
                 True),)
    if kind == "duplicate_work":
        item = state.queue[action.index]
        return ((WORKER, WORKER, f"stale work: r{item.room} chunk {item.chunk} runs twice", True),)
    if kind == "garbage":
        if action.side == PREFILL:
            return ((DECODE, BOOTSTRAP, "GARBAGE frame", True),)
        return ((SCHEDULER, DECODE_THREAD, "GARBAGE frame", True),)
    if kind == "crash_prefill":
        return ((MANAGER, MANAGER, "prefill crashes", True),)
    return ((DECODE, DECODE, kind, False),)
