"""The pipelined-transfer records in words, for bug reports (`kvsim repro ID --report`).

The records themselves (actions, the fabric write, the result frame, the effects) are in `state`; `ACTIONS`
decodes an action from its JSON form.
"""

from __future__ import annotations

from kvsim.engine.actions import table

from .state import (ACTIONS, NO_SLICE_ID, Cancel, CancelAck, Compute, CtxConcluded, Deliver, DestReleased,
                    Dispatched, DropAck, DropCancel, DropFrame, DupFrame, Fence, Frame, FrameSent, GenCancel, GenPost,
                    GenRelease, PagesFreed, PeerInfo, Poll, Promote, RemoteCancel, RxConcluded, RxStall, RxTimeout,
                    Settled, Shutdown, Silent, StallReport, Stalled, Timeout, Write, WriteDone, WriteFail)
from .status import LlmRequestState

__all__ = ["ACTIONS", "describe"]


def _write(w: tuple) -> str:
    if w.is_aux:
        return "the aux task (first tokens)"
    blocks = sorted(b for b, _ in w.cells)
    span = f"blocks {blocks}" if blocks else "no block"
    return f"slice {w.slice_id}{' (is_last)' if w.is_last else ''}, {span}"


def _frame(f: tuple) -> str:
    what = "aux" if f.is_aux else f"sender slice {f.sender_slice_id} -> receiver slice {f.receiver_slice_id}"
    if f.sender_slice_id == NO_SLICE_ID and not f.is_aux:
        what = "no slice"
    last = ", is_last" if f.is_last else ""
    return f"{'SUCCESS' if f.ok else 'FAILED'} result from rank {f.peer_rank} ({what}{last})"


describe = table({  # an action, a fabric write, a result frame or an effect of this model in words
    PeerInfo: lambda a: f"request {a.rid}: rank {a.rank} has the receiver's peer info",
    Promote: lambda a: f"request {a.rid}: every rank has the peer info; promoted to CONTEXT_INIT",
    Compute: lambda a: (f"request {a.rid}: a forward step finishes its next prefill chunk; respond_and_send_async on "
                        f"every rank"),
    WriteDone: lambda a: f"request {a.rid}: rank {a.rank}'s fabric write #{a.index} in flight completes",
    WriteFail: lambda a: f"FAULT: request {a.rid}: rank {a.rank}'s fabric write #{a.index} in flight fails",
    Deliver: lambda a: f"request {a.rid}: the receiver takes rank {a.rank}'s next result frame",
    DropFrame: lambda a: (f"FAULT: request {a.rid}: rank {a.rank}'s next result frame (a completion notification) "
                          f"is lost"),
    DupFrame: lambda a: f"FAULT: request {a.rid}: rank {a.rank}'s next result frame will arrive twice",
    Poll: lambda a: f"request {a.rid}: the collective context poll",
    Timeout: lambda a: f"request {a.rid}: kv_transfer_timeout_ms passes; the request is flagged and cancelled",
    StallReport: lambda a: f"request {a.rid}: still unresolved at twice the timeout: reported stalled, pages kept",
    Fence: lambda a: f"request {a.rid}: the drain deadline fences the transfer (writes aborted)",
    RxTimeout: lambda a: f"request {a.rid}: the receiver's deadline passes",
    Silent: lambda a: f"FAULT: request {a.rid}: the receiving peer stops answering",
    Cancel: lambda a: f"FAULT: request {a.rid} is cancelled",
    Shutdown: lambda a: "FAULT: shutdown: every open request is cancelled",
    GenCancel: lambda a: (f"FAULT: request {a.rid}: the generation side cancels its receive; CANCEL_SESSION to every "
                          f"context rank"),
    DropCancel: lambda a: f"FAULT: request {a.rid}: the CANCEL_SESSION to rank {a.rank} is lost",
    GenPost: lambda a: (f"request {a.rid}: the generation side takes its destination pages from the pool and posts "
                        f"the receive (REQUEST_DATA)"),
    RemoteCancel: lambda a: f"request {a.rid}: CANCEL_SESSION reaches rank {a.rank}",
    GenRelease: lambda a: f"request {a.rid}: the receiver returns its destination pages to the pool",
    CancelAck: lambda a: f"request {a.rid}: rank {a.rank} drained; its cancel-ACK reaches the receiver",
    DropAck: lambda a: f"FAULT: request {a.rid}: rank {a.rank} drained, but its cancel-ACK is lost",
    RxStall: lambda a: (f"request {a.rid}: the receiver's wait for a cancel-ACK passes its deadline: reported stalled, "
                        f"destination pages kept"),
    DestReleased: lambda e: f"request {e.rid}'s destination pages {list(e.pages)} are free",
    Write: _write,
    Frame: _frame,
    Dispatched: lambda e: f"rank {e.rank} dispatches {_write(e.write)}",
    Settled: lambda e: f"rank {e.rank}'s write of {_write(e.write)} {'lands' if e.ok else 'fails'}",
    FrameSent: lambda e: f"rank {e.rank} sends a {_frame(e.frame)}",
    RxConcluded: lambda e: f"the receiver concludes request {e.rid}: {LlmRequestState(e.state).name}",
    CtxConcluded: lambda e: f"the context side concludes request {e.rid}: {LlmRequestState(e.state).name}",
    PagesFreed: lambda e: f"request {e.rid}'s KV pages are released",
    Stalled: lambda e: "",  # said by the stall report itself
}, repr)
