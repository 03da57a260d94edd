"""The records of the pd-protocol transition system: messages, actions, work items and effects.

Each is a tagged tuple (`kvsim.engine.actions.tagged`): it compares, hashes
and serialises as the plain tuple it replaced (`("deliver_prefill", ("TINFO", 0))`
is `DeliverPrefill(Tinfo(0))`), so explore paths and pinned counterexamples
are unchanged, and `decode(doc, ACTIONS)` rebuilds the typed value from JSON.
"""

from __future__ import annotations

from kvsim.engine.actions import tagged, type_table

from ..pd_common.status import KVPoll

# -- messages in flight (the tag is the message kind the bootstrap and decode threads dispatch on) ----
Reg = tagged("REG")  # the decode's registration (once per decode)
Watermark = tagged("WATERMARK")  # the staging watermark after registration (`staging`)
Tinfo = tagged("TINFO", "room")  # a TransferInfo for one room
Abort = tagged("ABORT", "room")  # decode cancelled or timed out the room
Status = tagged("STATUS", "room", "status")  # prefill -> decode status (a KVPoll value)
GarbageFrame = tagged("GARBAGE", name="GarbageFrame")  # bytes that no longer parse
MESSAGES = (Reg, Watermark, Tinfo, Abort, Status, GarbageFrame)

PREFILL, DECODE = "prefill", "decode"  # the receiving side of a message, for faults and `Sent`

# -- actions ------------------------------------------------------------------------------------------
Init = tagged("init", "step")  # the prefill manager's next start-up step
DeliverPrefill = tagged("deliver_prefill", "message")  # the bootstrap thread reads one message
DeliverDecode = tagged("deliver_decode", "message")  # the decode thread reads one message
Enqueue = tagged("enqueue", "room")  # the prefill scheduler queues the room's next chunk
Work = tagged("work")  # the transfer worker runs the head of its queue
Clear = tagged("clear", "room")  # the scheduler saw a terminal poll and cleared the room
BootstrapTimeout = tagged("bootstrap_timeout", "room")
DecodeInit = tagged("decode_init", "room")  # the decode side starts a room (registration, TransferInfo)
DecodeAbort = tagged("decode_abort", "room")  # waiting timeout or cancel: Failed, and ABORT to the prefill
HeartbeatMiss = tagged("heartbeat_miss")
# faults (each takes one unit of the fault budget)
Drop = tagged("drop", "side", "message")
Duplicate = tagged("duplicate", "side", "message")
DuplicateWork = tagged("duplicate_work", "index")  # a queued work item runs twice (stale work)
InjectGarbage = tagged("garbage", "side", name="InjectGarbage")
CrashPrefill = tagged("crash_prefill")
FAULTS = frozenset(t.tag for t in (Drop, Duplicate, DuplicateWork, InjectGarbage, CrashPrefill))

ACTIONS = type_table((Init, DeliverPrefill, DeliverDecode, Enqueue, Work, Clear, BootstrapTimeout, DecodeInit,
                      DecodeAbort, HeartbeatMiss, Drop, Duplicate, DuplicateWork, InjectGarbage, CrashPrefill)
                     + MESSAGES)


class WorkItem(tuple):
    """`(room, chunk)`: one chunk on the transfer worker's FIFO queue.

    A plain pair in JSON and in state fingerprints (explored states export as before), read by name.
    """

    __slots__ = ()

    def __new__(cls, room: int, chunk: int) -> "WorkItem":
        return tuple.__new__(cls, (room, chunk))

    def __getnewargs__(self) -> tuple[int, int]:
        return tuple(self)  # type: ignore[return-value]

    @property
    def room(self) -> int:
        return self[0]

    @property
    def chunk(self) -> int:
        return self[1]


# -- effects: what a step did, for a timing policy (`PdProtocol.transition`) ---------------------------
Sent = tagged("sent", "to", "message")  # a message was put in flight towards `to`
Queued = tagged("queued", "room", "chunk")  # a chunk joined the worker queue
Worked = tagged("worked", "room", "chunk", "outcome")  # the worker ran a chunk ("completed", "sent", "dropped", ...)
Concluded = tagged("concluded", "room", "status", "why")  # a decode room reached Success or Failed
PrefillConcluded = tagged("prefill_concluded", "room", "status")  # a prefill room turned terminal: clear() is due
SuccessFailed = tagged("success_failed", "room")  # P1 broken: a concluded Success room turned Failed
ThreadStarted = tagged("thread_started", "thread")
ThreadDied = tagged("thread_died", "thread", "reason")
PrefillDied = tagged("prefill_died")


# -- describe: one action, message or effect in words, for bug reports (`kvsim repro ID --report`) ----------
INIT_STEPS = {"session_state": "creates session_lock and failed_sessions",
              "start_thread": "starts the bootstrap thread",
              "staging_ctx": "assigns _staging_ctx"}


def _message(m: tuple) -> str:
    kind = m[0]
    if kind == "REG":
        return "the decode's registration"
    if kind == "WATERMARK":
        return "a staging WATERMARK"
    if kind == "TINFO":
        return f"TransferInfo room {m[1]}"
    if kind == "ABORT":
        return f"ABORT room {m[1]}"
    if kind == "STATUS":
        return f"transfer status {KVPoll(m[2]).name} for room {m[1]}"
    if kind == "GARBAGE":
        return "a malformed frame"
    return repr(m)


def describe(record: tuple) -> str:
    """An action (or a message, or an effect) of this model in words."""
    kind = record[0]
    if kind in ("REG", "WATERMARK", "TINFO", "ABORT", "STATUS", "GARBAGE"):
        return _message(record)
    if kind == "init":
        return f"prefill manager start-up: {INIT_STEPS.get(record[1], record[1])}"
    if kind == "deliver_prefill":
        return f"decode → prefill bootstrap thread: {_message(record[1])}"
    if kind == "deliver_decode":
        return f"prefill → decode thread: {_message(record[1])}"
    if kind == "enqueue":
        return f"prefill scheduler: room {record[1]}'s next chunk joins the transfer queue"
    if kind == "work":
        return "prefill: the transfer worker runs the head of its queue"
    if kind == "clear":
        return f"prefill scheduler sees a terminal poll and clears room {record[1]}"
    if kind == "bootstrap_timeout":
        return f"prefill: room {record[1]}'s bootstrap timeout passes (Failed)"
    if kind == "decode_init":
        return f"decode starts room {record[1]} (registration, TransferInfo)"
    if kind == "decode_abort":
        return f"decode aborts room {record[1]} (waiting timeout or cancel): Failed, ABORT to the prefill"
    if kind == "heartbeat_miss":
        return "decode: a prefill heartbeat is missed"
    if kind == "drop":
        return f"DROP: {_message(record[2])} to the {record[1]} is lost"
    if kind == "duplicate":
        return f"DUPLICATE: {_message(record[2])} to the {record[1]} will arrive twice"
    if kind == "duplicate_work":
        return f"DUPLICATE: queued work item {record[1]} will run twice (stale work)"
    if kind == "garbage":
        return f"FAULT: a malformed frame reaches the {record[1]}"
    if kind == "crash_prefill":
        return "FAULT: the prefill process dies"
    if kind == "sent":
        return f"sends {_message(record[2])} to the {record[1]}"
    if kind == "queued":
        return ""  # said by the enqueue itself
    if kind == "worked":
        return f"room {record[1]} chunk {record[2]}: {record[3]}"
    if kind == "concluded":
        return f"decode room {record[1]} concludes {KVPoll(record[2]).name} ({record[3]})"
    if kind == "prefill_concluded":
        return f"prefill room {record[1]} turns {KVPoll(record[2]).name}"
    if kind == "success_failed":
        return f"prefill room {record[1]}: a concluded Success turns Failed"
    if kind == "thread_started":
        return f"the {record[1]} thread starts"
    if kind == "thread_died":
        return f"the {record[1]} thread dies: {record[2]}"
    if kind == "prefill_died":
        return "the prefill process is gone"
    return repr(record)
