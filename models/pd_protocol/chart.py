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

from kvsim.engine.actions import table

from ..pd_common.status import KVPoll
from .actions import (PREFILL, Abort, BootstrapTimeout, Clear, CrashPrefill, DecodeAbort, DecodeInit, DeliverDecode,
                      DeliverPrefill, Drop, Duplicate, DuplicateWork, Enqueue, HeartbeatMiss, Init, InjectGarbage,
                      Status, Tinfo, Work)

MANAGER, SCHEDULER, WORKER = "prefill manager (__init__)", "prefill scheduler", "transfer worker queue"
BOOTSTRAP, DECODE_THREAD, DECODE = "bootstrap thread", "decode thread", "decode scheduler"


def lifelines(system: Any) -> tuple[str, ...]:
    return (MANAGER, SCHEDULER, WORKER, BOOTSTRAP, DECODE_THREAD, DECODE)


message = table({  # a message in a few words: `STATUS r0 Success`; the others by their tag
    Status: lambda m: f"STATUS r{m.room} {KVPoll(m.status).name}",
    Tinfo: lambda m: f"TINFO r{m.room}",
    Abort: lambda m: f"ABORT r{m.room}",
}, lambda m: m[0])

# who put a message in flight towards the decode thread: the worker a status frame on Success, else the scheduler
# (a Failed status is its timeout's)
_sender = table({Status: lambda m: WORKER if m.status == int(KVPoll.Success) else SCHEDULER}, lambda m: SCHEDULER)


def _work(a: tuple, state: Any) -> tuple[tuple[str, str, str, bool], ...]:
    head = state.queue[0] if state.queue else None
    return ((WORKER, WORKER, f"send r{head.room} chunk {head.chunk}" if head else "work", False),)


def _channel_fault(a: tuple, state: Any) -> tuple[tuple[str, str, str, bool], ...]:
    """A dropped or duplicated message, on the arrow of the channel it was on."""
    to_prefill = a.side == PREFILL
    sender = DECODE if to_prefill else _sender(a.message)
    return ((sender, BOOTSTRAP if to_prefill else DECODE_THREAD, f"{a.tag.upper()} {message(a.message)}", True),)


def _duplicate_work(a: tuple, state: Any) -> tuple[tuple[str, str, str, bool], ...]:
    item = state.queue[a.index]
    return ((WORKER, WORKER, f"stale work: r{item.room} chunk {item.chunk} runs twice", True),)


def _garbage(a: tuple, state: Any) -> tuple[tuple[str, str, str, bool], ...]:
    sender, receiver = (DECODE, BOOTSTRAP) if a.side == PREFILL else (SCHEDULER, DECODE_THREAD)
    return ((sender, receiver, "GARBAGE frame", True),)


_arrows = table({  # an action on the chart, by record type (`state`: the state it is taken in)
    Init: lambda a, state: ((MANAGER, MANAGER, a.step, False),),
    DeliverPrefill: lambda a, state: ((DECODE, BOOTSTRAP, message(a.message), False),),
    DeliverDecode: lambda a, state: ((_sender(a.message), DECODE_THREAD, message(a.message), False),),
    Enqueue: lambda a, state: ((SCHEDULER, WORKER, f"enqueue r{a.room} chunk", False),),
    Work: _work,
    Clear: lambda a, state: ((SCHEDULER, SCHEDULER, f"clear r{a.room}", False),),
    BootstrapTimeout: lambda a, state: ((SCHEDULER, SCHEDULER, f"bootstrap timeout r{a.room}", False),),
    DecodeInit: lambda a, state: ((DECODE, DECODE, f"init r{a.room}", False),),
    DecodeAbort: lambda a, state: ((DECODE, DECODE, f"waiting timeout r{a.room}", False),),
    HeartbeatMiss: lambda a, state: ((DECODE, DECODE, "heartbeat miss", False),),
    Drop: _channel_fault,
    Duplicate: _channel_fault,
    DuplicateWork: _duplicate_work,
    InjectGarbage: _garbage,
    CrashPrefill: lambda a, state: ((MANAGER, MANAGER, "prefill crashes", True),),
}, lambda a, state: ((DECODE, DECODE, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action, state)
