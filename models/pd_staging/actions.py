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

UP, DOWN = 0, 1  # prefill writer -> decode, decode -> prefill writer

# -- messages -------------------------------------------------------------------------------------------
ReqMsg = tagged("REQ", "room", "chunk_idx", "pages", "writer", name="ReqMsg")
RspMsg = tagged("RSP", "room", "chunk_idx", "writer", "alloc_id", "offset", "round", "end", name="RspMsg")
ReadyMsg = tagged("READY", "room", "chunk_idx", "page_start", "num_pages", "writer", name="ReadyMsg")
StatusMsg = tagged("STATUS", "room", "writer", "status", name="StatusMsg")
WatermarkMsg = tagged("WM", "writer", "round", "tail", name="WatermarkMsg")
AbortMsg = tagged("ABORT", "room", "writer", name="AbortMsg")

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

ACTIONS = type_table((Batch, Work, Clear, Deliver, ScatterDone, Deadline, WaitingTimeout, HeartbeatFailure, Abort,
                      Reorder, Drop, Duplicate, PeerDeath, ReqMsg, RspMsg, ReadyMsg, StatusMsg, WatermarkMsg,
                      AbortMsg))

# -- effects: what a step did, for a timing policy (`PdStaging.transition`) ----------------------------------
Sent = tagged("sent", "side", "writer", "msg")  # appended to that channel
Enqueued = tagged("enqueued", "writer")  # a prefill batch put chunks on the writer's transfer queue
Deferred = tagged("deferred", "writer")  # the worker re-enqueued the chunk it dequeued (not ready)
PollTerminal = tagged("poll_terminal", "writer", "room")  # sender.poll() is now terminal: the scheduler clears
ScatterSubmitted = tagged("scatter_submitted", "room", "alloc_id")  # its completion event is pending
DeadlineArmed = tagged("deadline_armed", "room")  # all ranks succeeded: the completion deadline starts
Concluded = tagged("concluded", "room", "status")  # the decode room committed or aborted
