"""States and records of the pipelined-transfer transition system: immutable, hashable, tagged where they travel.

Request phase and ownership are separate components (part 3 of the research
note): `Req.ctx` is the `LlmRequestState`; who may still touch the pages is
the sessions' credits and the writes in flight; whether the pages are free is
`Req.freed`. No invariant infers one from the other.
"""

from __future__ import annotations

from typing import NamedTuple

from kvsim.engine.actions import tagged, type_table

from .status import LlmRequestState, TxSession

NO_SLICE_ID = -1  # a result no KVSendTask owns (the aux task's frame)
ACK_NONE, ACK_RECEIVED, ACK_LOST = 0, 1, 2  # `Rx.acks`: a context rank's cancel-ACK not sent, received, lost

# -- what travels -------------------------------------------------------------------------------------
# A fabric write of one rank: a KV slice (cells: (block, fill) snapshots of its source) or the aux task.
Write = tagged("write", "slice_id", "is_last", "is_aux", "cells")
# The result frame sent to the receiver per (task, writer rank).
Frame = tagged("frame", "peer_rank", "sender_slice_id", "receiver_slice_id", "is_last", "is_aux", "ok")

# -- actions ------------------------------------------------------------------------------------------
PeerInfo = tagged("peer_info", "rid", "rank")  # PeerInfoArrives: that rank has the receiver's peer info
Promote = tagged("promote", "rid")  # consensus over the ranks: DISAGG_CONTEXT_WAIT_SCHEDULER -> CONTEXT_INIT
Compute = tagged("compute", "rid")  # the forward step of the next prefill chunk, then respond_and_send_async
WriteDone = tagged("write_done", "rid", "rank", "index")  # the fabric write at `index` settles with success
Deliver = tagged("deliver", "rid", "rank")  # the head result frame of that rank reaches the receiver
Poll = tagged("poll", "rid")  # the collective context poll (intersection / union consensus over ranks)
Timeout = tagged("timeout", "rid")  # elapsed > kv_transfer_timeout_ms: flag, cancel
StallReport = tagged("stall_report", "rid")  # still unresolved at 2x timeout: reported once, pages kept
Fence = tagged("fence", "rid")  # proposed drain deadline: abort the writes in flight, then release
RxTimeout = tagged("rx_timeout", "rid")  # proposed receive deadline (#17665)
# faults
WriteFail = tagged("write_fail", "rid", "rank", "index")
DropFrame = tagged("drop_frame", "rid", "rank")
DupFrame = tagged("dup_frame", "rid", "rank")
Silent = tagged("silent", "rid")  # the receiving peer never answers again
Cancel = tagged("cancel", "rid")  # a user cancel of the context request
Shutdown = tagged("shutdown")
GenCancel = tagged("gen_cancel", "rid")  # the generation side cancels: CANCEL_SESSION to every context rank
DropCancel = tagged("drop_cancel", "rid", "rank")  # that rank's CANCEL_SESSION message is lost
# the generation side
GenPost = tagged("gen_post", "rid")  # pages from the free list, receive posted, REQUEST_DATA to the ranks
RemoteCancel = tagged("remote_cancel", "rid", "rank")  # CANCEL_SESSION reaches that rank (pre-cancel if no session)
GenRelease = tagged("gen_release", "rid")  # the receiver's destination pages go back to the free list
CancelAck = tagged("cancel_ack", "rid", "rank")  # that rank drained after the error: its cancel-ACK reaches the receiver
DropAck = tagged("drop_ack", "rid", "rank")  # fault (`drop`): that rank drained, but its cancel-ACK is lost
RxStall = tagged("rx_stall", "rid")  # the receiver's wait for a missing cancel-ACK passes its deadline: stall, pages kept

ACTIONS = type_table((PeerInfo, Promote, Compute, WriteDone, Deliver, Poll, Timeout, StallReport, Fence, RxTimeout,
                      WriteFail, DropFrame, DupFrame, Silent, Cancel, Shutdown, GenCancel, DropCancel, GenPost,
                      RemoteCancel, GenRelease, CancelAck, DropAck, RxStall, Write, Frame))

# -- effects (`transition`): what a step did, for a timing policy -------------------------------------
Dispatched = tagged("dispatched", "rid", "rank", "write")  # a write joined that rank's fabric queue
Settled = tagged("settled", "rid", "rank", "write", "ok")
FrameSent = tagged("frame_sent", "rid", "rank", "frame")
RxConcluded = tagged("rx_concluded", "rid", "state")
CtxConcluded = tagged("ctx_concluded", "rid", "state")
PagesFreed = tagged("pages_freed", "rid")
Stalled = tagged("stalled", "rid")
DestReleased = tagged("dest_released", "rid", "pages")  # the receiver's pages are free (reallocatable)


class Req(NamedTuple):
    """The context side's view of one request (executor and collective decisions, shared by the ranks)."""

    ctx: LlmRequestState
    computed: int  # prefill chunks computed
    stopping: bool  # cancel pending or failed: intermediate chunks are skipped
    clock: bool  # the timeout clock runs
    timed_out: bool
    stalled: bool  # reported stalled (2x timeout), pages not released
    retired: bool  # py_kv_send_session_retired: cancel_request returned True; never recreated
    freed: int  # how many times its pages were released (E1: at most once)
    pinned: bool  # start_transfer pinned its blocks
    silent: bool  # its receiving peer went silent
    notices: int  # cancel notifications sent to the receiver
    peer_info: tuple[bool, ...]  # per rank: the receiver's REQUEST_DATA (peer info) is here


class Rx(NamedTuple):
    """The receiver's RxSession: one KVRecvTask (slice 0) over the whole prompt, and its destination pages."""

    state: LlmRequestState  # 8 until posted, 9, then 12 or -1
    finals: tuple[int, ...]  # per writer rank: final-slice SUCCESS results counted (last_slice_count = sum)
    auxes: tuple[int, ...]  # per writer rank: aux results counted
    crashed: bool  # a result frame named a task the receiver does not have
    dest: tuple[int, ...]  # destination cells [rank * blocks + block]: fill level written
    pages: tuple[int, ...]  # the pool page of each destination cell (group * blocks + block); () before posting
    releases: int  # how many times those pages went back to the free list (E1: at most once)
    cancel_to: tuple[bool, ...]  # per context rank: a CANCEL_SESSION from the generation side in flight
    gen_cancelled: bool  # the generation side cancelled (cancel_request on the receive session)
    acks: tuple[int, ...]  # per context rank: its cancel-ACK (ACK_NONE, ACK_RECEIVED, ACK_LOST)
    stalled: bool  # reported stalled waiting for a cancel-ACK that never came (pages kept)

    @property
    def held(self) -> bool:
        """Its destination pages are allocated to it (posted, not yet released)."""
        return bool(self.pages) and not self.releases


class PtState(NamedTuple):
    reqs: tuple[Req, ...]
    tx: tuple[tuple[TxSession | None, ...], ...]  # [rid][rank]; None: never created
    flight: tuple[tuple[tuple, ...], ...]  # [rid][rank]: writes in flight, in dispatch order
    frames: tuple[tuple[tuple, ...], ...]  # [rid][rank]: result frames in flight (a FIFO socket)
    rx: tuple[Rx, ...]
    faults_left: int
    flags: tuple[tuple[str, str], ...]  # (invariant, message) of what a transition did


def put(seq: tuple, i: int, value) -> tuple:
    return seq[:i] + (value,) + seq[i + 1:]
