"""The records of the pd-protocol transition system: messages, actions, work items and effects.

Each is a tagged tuple (`kvsim.engine.actions.tagged`): it compares, hashes
and serialises as the plain tuple it replaced (`("deliver_prefill", ("TINFO", 0))`
is `DeliverPrefill(Tinfo(0))`), so explore paths and pinned counterexamples
are unchanged, and `decode(doc, ACTIONS)` rebuilds the typed value from JSON.
"""

from __future__ import annotations

from kvsim.engine.actions import table, tagged, type_table

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


_message = table({
    Reg: lambda m: "the decode's registration",
    Watermark: lambda m: "a staging WATERMARK",
    Tinfo: lambda m: f"TransferInfo room {m.room}",
    Abort: lambda m: f"ABORT room {m.room}",
    Status: lambda m: f"transfer status {KVPoll(m.status).name} for room {m.room}",
    GarbageFrame: lambda m: "a malformed frame",
}, repr)

describe = table({  # an action (or a message, or an effect) of this model in words
    **{m: _message for m in MESSAGES},
    Init: lambda a: f"prefill manager start-up: {INIT_STEPS.get(a.step, a.step)}",
    DeliverPrefill: lambda a: f"decode → prefill bootstrap thread: {_message(a.message)}",
    DeliverDecode: lambda a: f"prefill → decode thread: {_message(a.message)}",
    Enqueue: lambda a: f"prefill scheduler: room {a.room}'s next chunk joins the transfer queue",
    Work: lambda a: "prefill: the transfer worker runs the head of its queue",
    Clear: lambda a: f"prefill scheduler sees a terminal poll and clears room {a.room}",
    BootstrapTimeout: lambda a: f"prefill: room {a.room}'s bootstrap timeout passes (Failed)",
    DecodeInit: lambda a: f"decode starts room {a.room} (registration, TransferInfo)",
    DecodeAbort: lambda a: f"decode aborts room {a.room} (waiting timeout or cancel): Failed, ABORT to the prefill",
    HeartbeatMiss: lambda a: "decode: a prefill heartbeat is missed",
    Drop: lambda a: f"DROP: {_message(a.message)} to the {a.side} is lost",
    Duplicate: lambda a: f"DUPLICATE: {_message(a.message)} to the {a.side} will arrive twice",
    DuplicateWork: lambda a: f"DUPLICATE: queued work item {a.index} will run twice (stale work)",
    InjectGarbage: lambda a: f"FAULT: a malformed frame reaches the {a.side}",
    CrashPrefill: lambda a: "FAULT: the prefill process dies",
    Sent: lambda e: f"sends {_message(e.message)} to the {e.to}",
    Queued: lambda e: "",  # said by the enqueue itself
    Worked: lambda e: f"room {e.room} chunk {e.chunk}: {e.outcome}",
    Concluded: lambda e: f"decode room {e.room} concludes {KVPoll(e.status).name} ({e.why})",
    PrefillConcluded: lambda e: f"prefill room {e.room} turns {KVPoll(e.status).name}",
    SuccessFailed: lambda e: f"prefill room {e.room}: a concluded Success turns Failed",
    ThreadStarted: lambda e: f"the {e.thread} thread starts",
    ThreadDied: lambda e: f"the {e.thread} thread dies: {e.reason}",
    PrefillDied: lambda e: "the prefill process is gone",
}, repr)
