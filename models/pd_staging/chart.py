"""Who acts in a pd-staging counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` names the
actors, `arrows(system, state, action)` says what one action is on the chart, as
`(sender, receiver, label, fault)` tuples (sender == receiver: a step on one lifeline).

Actors (SGLang, `python/sglang/srt/disaggregation/`): the prefill scheduler, which runs the forward
batches and puts each chunk on every writer's transfer queue; one Mooncake transfer worker per prefill
writer rank (its FIFO queue, `STAGING_REQ`, `CHUNK_READY`, `sender.poll()`); the decode rank's
`DecodeStagingHandler` with its `StagingAllocator` ring.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from ..pd_common.status import KVPoll
from .actions import (UP, Abort, AbortMsg, AckMsg, Batch, Clear, Deadline, DeferDst, Deliver, Drop, Duplicate,
                      HeartbeatFailure, PeerDeath, ReadyMsg, ReleaseTimeout, Reorder, ReqMsg, RspMsg, ScatterDone,
                      StatusMsg, WaitingTimeout, WatermarkMsg, Work)

SCHEDULER, DECODE = "prefill scheduler", "decode (DecodeStagingHandler)"


def writer(w: int) -> str:
    return f"prefill writer {w} (transfer worker)"


def lifelines(system: Any) -> tuple[str, ...]:
    return (SCHEDULER,) + tuple(writer(w) for w in range(system.cfg.writers)) + (DECODE,)


message = table({  # a message in a few words: `STAGING_RSP r0 c1 slot 2`
    WatermarkMsg: lambda m: f"WATERMARK round {m.round} tail {m.tail}",
    StatusMsg: lambda m: f"status r{m.room} {KVPoll(m.status).name}",
    AbortMsg: lambda m: f"ABORT r{m.room}",
    AckMsg: lambda m: f"ABORT_ACK r{m.room}",
    ReqMsg: lambda m: f"STAGING_REQ r{m.room} c{m.chunk_idx}",
    ReadyMsg: lambda m: f"CHUNK_READY r{m.room} c{m.chunk_idx}",
    RspMsg: lambda m: f"STAGING_RSP r{m.room} c{m.chunk_idx}" + (f" slot {m.alloc_id}" if m.alloc_id >= 0
                                                                 else " no slot"),
}, lambda m: m[0])


def _route(side: int, w: int) -> tuple[str, str]:
    return (writer(w), DECODE) if side == UP else (DECODE, writer(w))


_arrows = table({  # an action on the chart, by record type (`writers`: the prefill writer ranks)
    Batch: lambda a, writers: tuple((SCHEDULER, writer(w), f"enqueue r{a.room} chunk", False) for w in range(writers)),
    Work: lambda a, writers: ((writer(a.writer), writer(a.writer), "dequeue head chunk", False),),
    DeferDst: lambda a, writers: ((writer(a.writer), writer(a.writer), "sibling dst defers: re-enqueue chunk", True),),
    Clear: lambda a, writers: ((writer(a.writer), writer(a.writer), f"poll terminal: clear r{a.room}", False),),
    Deliver: lambda a, writers: ((*_route(a.side, a.writer), message(a.msg), False),),
    Reorder: lambda a, writers: ((*_route(a.side, a.writer), "overtakes: " + message(a.msg), True),),
    Drop: lambda a, writers: ((*_route(a.side, a.writer), f"DROP {message(a.msg)}", True),),
    Duplicate: lambda a, writers: ((*_route(a.side, a.writer), f"DUPLICATE {message(a.msg)}", True),),
    ScatterDone: lambda a, writers: ((DECODE, DECODE, f"scatter r{a.room} done, free slot {a.alloc_id}", False),),
    Deadline: lambda a, writers: ((DECODE, DECODE, f"deadline r{a.room}", False),),
    WaitingTimeout: lambda a, writers: ((DECODE, DECODE, f"waiting timeout r{a.room}", False),),
    ReleaseTimeout: lambda a, writers: ((DECODE, DECODE, f"release timeout r{a.room}", False),),
    HeartbeatFailure: lambda a, writers: ((DECODE, DECODE, "heartbeat failure", False),),
    Abort: lambda a, writers: ((DECODE, DECODE, f"abort r{a.room}", True),),
    PeerDeath: lambda a, writers: ((SCHEDULER, SCHEDULER, "prefill node dies", True),),
}, lambda a, writers: ((DECODE, DECODE, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action, system.cfg.writers)
