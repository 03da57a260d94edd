"""The records of the pd-staging transition system: messages, actions, slot offsets and effects.

All are tagged tuples (`kvsim.engine.actions.tagged`): `msg.room` reads as a
name, while the JSON form stays the list it always was (`["deliver", 0, 0,
["REQ", 0, 0, 1, 0]]`), so explore paths, counterexamples and trace digests
do not change. `ACTIONS` decodes an action (with its message) from JSON.

Messages (upstream names in the research note, section 2.2), one FIFO channel
per writer and direction (`UP`: prefill writer -> decode, `DOWN`: back):
`REQ` is `STAGING_REQ`, `RSP` `STAGING_RSP`, `READY` `CHUNK_READY`, `STATUS`
the transfer status, `WM` `WATERMARK`, `ABORT` the decode's abort.
"""

from __future__ import annotations

from kvsim.engine.actions import table, tagged, type_table

from ..pd_common.status import KVPoll

UP, DOWN = 0, 1  # prefill writer -> decode, decode -> prefill writer

# -- messages -------------------------------------------------------------------------------------------
ReqMsg = tagged("REQ", "room", "chunk_idx", "pages", "writer", name="ReqMsg")
RspMsg = tagged("RSP", "room", "chunk_idx", "writer", "alloc_id", "offset", "round", "end", name="RspMsg")
ReadyMsg = tagged("READY", "room", "chunk_idx", "page_start", "num_pages", "writer", name="ReadyMsg")
StatusMsg = tagged("STATUS", "room", "writer", "status", name="StatusMsg")
WatermarkMsg = tagged("WM", "writer", "round", "tail", name="WatermarkMsg")
AbortMsg = tagged("ABORT", "room", "writer", name="AbortMsg")
AckMsg = tagged("ACK", "room", "writer", name="AckMsg")  # ABORT_ACK: the room's chunks drained (0.5.21+)

# -- what a prefill writer learned from STAGING_RSP about one slot ----------------------------------------
SlotOffset = tagged("slot", "alloc_id", "offset", "round", "end", name="SlotOffset")

# -- actions --------------------------------------------------------------------------------------------
Batch = tagged("batch", "room")
Work = tagged("work", "writer")
Clear = tagged("clear", "writer", "room")
Deliver = tagged("deliver", "side", "writer", "msg")
ScatterDone = tagged("scatter_done", "room", "alloc_id")
Deadline = tagged("deadline", "room")
WaitingTimeout = tagged("waiting_timeout", "room")
HeartbeatFailure = tagged("heartbeat_failure")
# faults
Abort = tagged("abort", "room")
Reorder = tagged("reorder", "side", "writer", "msg")
Drop = tagged("drop", "side", "writer", "msg")
Duplicate = tagged("duplicate", "side", "writer", "msg")
PeerDeath = tagged("peer_death")
DeferDst = tagged("defer_dst", "writer")  # the head chunk is written, then a sibling destination defers
ReleaseTimeout = tagged("release_timeout", "room")  # the deferred release's 30 s deadline passes

ACTIONS = type_table((Batch, Work, Clear, Deliver, ScatterDone, Deadline, WaitingTimeout, HeartbeatFailure, Abort,
                      Reorder, Drop, Duplicate, PeerDeath, ReqMsg, RspMsg, ReadyMsg, StatusMsg, WatermarkMsg,
                      AbortMsg, AckMsg, DeferDst, ReleaseTimeout))

# -- effects: what a step did, for a timing policy (`PdStaging.transition`) ----------------------------------
Sent = tagged("sent", "side", "writer", "msg")  # appended to that channel
Enqueued = tagged("enqueued", "writer")  # a prefill batch put chunks on the writer's transfer queue
Deferred = tagged("deferred", "writer")  # the worker re-enqueued the chunk it dequeued (not ready)
PollTerminal = tagged("poll_terminal", "writer", "room")  # sender.poll() is now terminal: the scheduler clears
ScatterSubmitted = tagged("scatter_submitted", "room", "alloc_id")  # its completion event is pending
DeadlineArmed = tagged("deadline_armed", "room")  # all ranks succeeded: the completion deadline starts
Concluded = tagged("concluded", "room", "status")  # the decode room committed or aborted
Held = tagged("held", "room")  # a failed room's slots are held for its ABORT_ACKs: the release timeout starts


# -- describe: one action, message or effect in words, for bug reports (`kvsim repro ID --report`) ----------
def _route(side: int, writer: int) -> str:
    return f"prefill writer {writer} → decode" if side == UP else f"decode → prefill writer {writer}"


def _rsp(m: tuple) -> str:
    slot = (f"slot {m.alloc_id}, offset {m.offset}, round {m.round}" if m.alloc_id >= 0
            else "no slot: the chunk does not fit the ring")
    return f"STAGING_RSP room {m.room} chunk {m.chunk_idx} ({slot})"


def _sent(e: tuple) -> str:
    who = f"prefill writer {e.writer} sends" if e.side == UP else f"sends prefill writer {e.writer}"
    return f"{who} {_message(e.msg)}"


_message = table({
    ReqMsg: lambda m: f"STAGING_REQ room {m.room} chunk {m.chunk_idx} ({m.pages} page{'s' if m.pages != 1 else ''})",
    RspMsg: _rsp,
    ReadyMsg: lambda m: (f"CHUNK_READY room {m.room} chunk {m.chunk_idx} "
                         f"(suffix pages [{m.page_start}, {m.page_start + m.num_pages}))"),
    StatusMsg: lambda m: f"transfer status {KVPoll(m.status).name} for room {m.room}",
    WatermarkMsg: lambda m: f"WATERMARK (round {m.round}, tail {m.tail})",
    AbortMsg: lambda m: f"ABORT room {m.room}",
    AckMsg: lambda m: f"ABORT_ACK room {m.room}",
}, repr)

describe = table({  # an action (or a message, or a `Sent`/`Deferred`/`Concluded` effect) of this model in words
    **{m: _message for m in (ReqMsg, RspMsg, ReadyMsg, StatusMsg, WatermarkMsg, AbortMsg, AckMsg)},
    Batch: lambda a: f"prefill: a forward batch of room {a.room}; its next chunk joins every writer's transfer queue",
    Work: lambda a: f"prefill writer {a.writer}: the transfer worker takes the head of its queue",
    Clear: lambda a: f"prefill writer {a.writer}: the scheduler sees a terminal poll and clears room {a.room}",
    Deliver: lambda a: f"{_route(a.side, a.writer)}: {_message(a.msg)}",
    ScatterDone: lambda a: f"decode: the scatter of room {a.room} from slot {a.alloc_id} completes; the slot is freed",
    Deadline: lambda a: f"decode: room {a.room}'s staging completion deadline passes",
    WaitingTimeout: lambda a: f"decode: room {a.room}'s waiting timeout passes",
    HeartbeatFailure: lambda a: "decode: the prefill's heartbeat fails; unfinished rooms fail",
    Abort: lambda a: f"ABORT (fault): decode aborts room {a.room}",
    Reorder: lambda a: (f"REORDER: {_route(a.side, a.writer)}: {_message(a.msg)} overtakes the messages "
                        f"ahead of it"),
    Drop: lambda a: f"DROP: {_route(a.side, a.writer)}: {_message(a.msg)} is lost",
    Duplicate: lambda a: f"DUPLICATE: {_route(a.side, a.writer)}: {_message(a.msg)} will arrive twice",
    PeerDeath: lambda a: "FAULT: the prefill node dies",
    DeferDst: lambda a: (f"prefill writer {a.writer}: the transfer worker writes the head chunk to this decode rank, "
                         f"then a sibling destination is not ready: the whole chunk is re-enqueued"),
    ReleaseTimeout: lambda a: f"decode: room {a.room}'s deferred KV release times out (30 s); its slots are freed",
    Held: lambda e: f"room {e.room}'s staging slots are held until every prefill writer acknowledges the abort",
    Sent: _sent,
    Deferred: lambda e: "re-enqueues the chunk (a destination is not ready: its slot offset or watermark)",
    ScatterSubmitted: lambda e: f"scatter of room {e.room} from slot {e.alloc_id} submitted",
    Concluded: lambda e: f"decode room {e.room} concludes {KVPoll(e.status).name}",
    Enqueued: lambda e: "",  # said by the batch itself
    PollTerminal: lambda e: f"writer {e.writer}'s poll of room {e.room} turns terminal",
    DeadlineArmed: lambda e: f"all ranks reported Success for room {e.room}: the completion deadline starts",
}, repr)
