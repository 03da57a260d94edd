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

from kvsim.engine.actions import tagged, type_table

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


def _message(m: tuple) -> str:
    kind = m[0]
    if kind == "REQ":
        return f"STAGING_REQ room {m[1]} chunk {m[2]} ({m[3]} page{'s' if m[3] != 1 else ''})"
    if kind == "RSP":
        slot = f"slot {m[4]}, offset {m[5]}, round {m[6]}" if m[4] >= 0 else "no slot: the chunk does not fit the ring"
        return f"STAGING_RSP room {m[1]} chunk {m[2]} ({slot})"
    if kind == "READY":
        return f"CHUNK_READY room {m[1]} chunk {m[2]} (suffix pages [{m[3]}, {m[3] + m[4]}))"
    if kind == "STATUS":
        return f"transfer status {KVPoll(m[3]).name} for room {m[1]}"
    if kind == "WM":
        return f"WATERMARK (round {m[2]}, tail {m[3]})"
    if kind == "ABORT":
        return f"ABORT room {m[1]}"
    if kind == "ACK":
        return f"ABORT_ACK room {m[1]}"
    return repr(m)


def describe(record: tuple) -> str:
    """An action (or a message, or a `Sent`/`Deferred`/`Concluded` effect) of this model in words."""
    kind = record[0]
    if kind in ("REQ", "RSP", "READY", "STATUS", "WM", "ABORT", "ACK"):
        return _message(record)
    if kind == "batch":
        return f"prefill: a forward batch of room {record[1]}; its next chunk joins every writer's transfer queue"
    if kind == "work":
        return f"prefill writer {record[1]}: the transfer worker takes the head of its queue"
    if kind == "clear":
        return f"prefill writer {record[1]}: the scheduler sees a terminal poll and clears room {record[2]}"
    if kind == "deliver":
        return f"{_route(record[1], record[2])}: {_message(record[3])}"
    if kind == "scatter_done":
        return f"decode: the scatter of room {record[1]} from slot {record[2]} completes; the slot is freed"
    if kind == "deadline":
        return f"decode: room {record[1]}'s staging completion deadline passes"
    if kind == "waiting_timeout":
        return f"decode: room {record[1]}'s waiting timeout passes"
    if kind == "heartbeat_failure":
        return "decode: the prefill's heartbeat fails; unfinished rooms fail"
    if kind == "abort":
        return f"ABORT (fault): decode aborts room {record[1]}"
    if kind == "reorder":
        return f"REORDER: {_route(record[1], record[2])}: {_message(record[3])} overtakes the messages ahead of it"
    if kind == "drop":
        return f"DROP: {_route(record[1], record[2])}: {_message(record[3])} is lost"
    if kind == "duplicate":
        return f"DUPLICATE: {_route(record[1], record[2])}: {_message(record[3])} will arrive twice"
    if kind == "peer_death":
        return "FAULT: the prefill node dies"
    if kind == "defer_dst":
        return (f"prefill writer {record[1]}: the transfer worker writes the head chunk to this decode rank, then "
                f"a sibling destination is not ready: the whole chunk is re-enqueued")
    if kind == "release_timeout":
        return f"decode: room {record[1]}'s deferred KV release times out (30 s); its slots are freed"
    if kind == "held":
        return f"room {record[1]}'s staging slots are held until every prefill writer acknowledges the abort"
    if kind == "sent":
        who = f"prefill writer {record[2]} sends" if record[1] == UP else f"sends prefill writer {record[2]}"
        return f"{who} {_message(record[3])}"
    if kind == "deferred":
        return "re-enqueues the chunk (a destination is not ready: its slot offset or watermark)"
    if kind == "scatter_submitted":
        return f"scatter of room {record[1]} from slot {record[2]} submitted"
    if kind == "concluded":
        return f"decode room {record[1]} concludes {KVPoll(record[2]).name}"
    if kind == "enqueued":
        return ""  # said by the batch itself
    if kind == "poll_terminal":
        return f"writer {record[1]}'s poll of room {record[2]} turns terminal"
    if kind == "deadline_armed":
        return f"all ranks reported Success for room {record[1]}: the completion deadline starts"
    return repr(record)
