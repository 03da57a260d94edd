"""The pipelined-transfer records in words, for bug reports (`kvsim repro ID --report`).

The records themselves (actions, the fabric write, the result frame, the effects) are in `state`; `ACTIONS`
decodes an action from its JSON form.
"""

from __future__ import annotations

from .state import ACTIONS, NO_SLICE_ID
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


def describe(record: tuple) -> str:
    """An action, a fabric write, a result frame or an effect of this model in words."""
    kind = record[0]
    if kind == "peer_info":
        return f"request {record[1]}: rank {record[2]} has the receiver's peer info"
    if kind == "promote":
        return f"request {record[1]}: every rank has the peer info; promoted to CONTEXT_INIT"
    if kind == "compute":
        return (f"request {record[1]}: a forward step finishes its next prefill chunk; respond_and_send_async on "
                f"every rank")
    if kind == "write_done":
        return f"request {record[1]}: rank {record[2]}'s fabric write #{record[3]} in flight completes"
    if kind == "write_fail":
        return f"FAULT: request {record[1]}: rank {record[2]}'s fabric write #{record[3]} in flight fails"
    if kind == "deliver":
        return f"request {record[1]}: the receiver takes rank {record[2]}'s next result frame"
    if kind == "drop_frame":
        return f"FAULT: request {record[1]}: rank {record[2]}'s next result frame (a completion notification) is lost"
    if kind == "dup_frame":
        return f"FAULT: request {record[1]}: rank {record[2]}'s next result frame will arrive twice"
    if kind == "poll":
        return f"request {record[1]}: the collective context poll"
    if kind == "timeout":
        return f"request {record[1]}: kv_transfer_timeout_ms passes; the request is flagged and cancelled"
    if kind == "stall_report":
        return f"request {record[1]}: still unresolved at twice the timeout: reported stalled, pages kept"
    if kind == "fence":
        return f"request {record[1]}: the drain deadline fences the transfer (writes aborted)"
    if kind == "rx_timeout":
        return f"request {record[1]}: the receiver's deadline passes"
    if kind == "silent":
        return f"FAULT: request {record[1]}: the receiving peer stops answering"
    if kind == "cancel":
        return f"FAULT: request {record[1]} is cancelled"
    if kind == "shutdown":
        return "FAULT: shutdown: every open request is cancelled"
    if kind == "gen_cancel":
        return (f"FAULT: request {record[1]}: the generation side cancels its receive; CANCEL_SESSION to every "
                f"context rank")
    if kind == "drop_cancel":
        return f"FAULT: request {record[1]}: the CANCEL_SESSION to rank {record[2]} is lost"
    if kind == "gen_post":
        return (f"request {record[1]}: the generation side takes its destination pages from the pool and posts "
                f"the receive (REQUEST_DATA)")
    if kind == "remote_cancel":
        return f"request {record[1]}: CANCEL_SESSION reaches rank {record[2]}"
    if kind == "gen_release":
        return f"request {record[1]}: the receiver returns its destination pages to the pool"
    if kind == "cancel_ack":
        return f"request {record[1]}: rank {record[2]} drained; its cancel-ACK reaches the receiver"
    if kind == "drop_ack":
        return f"FAULT: request {record[1]}: rank {record[2]} drained, but its cancel-ACK is lost"
    if kind == "rx_stall":
        return (f"request {record[1]}: the receiver's wait for a cancel-ACK passes its deadline: reported stalled, "
                f"destination pages kept")
    if kind == "dest_released":
        return f"request {record[1]}'s destination pages {list(record[2])} are free"
    if kind == "write":
        return _write(record)
    if kind == "frame":
        return _frame(record)
    if kind == "dispatched":
        return f"rank {record[2]} dispatches {_write(record[3])}"
    if kind == "settled":
        return f"rank {record[2]}'s write of {_write(record[3])} {'lands' if record[4] else 'fails'}"
    if kind == "frame_sent":
        return f"rank {record[2]} sends a {_frame(record[3])}"
    if kind == "rx_concluded":
        return f"the receiver concludes request {record[1]}: {LlmRequestState(record[2]).name}"
    if kind == "ctx_concluded":
        return f"the context side concludes request {record[1]}: {LlmRequestState(record[2]).name}"
    if kind == "pages_freed":
        return f"request {record[1]}'s KV pages are released"
    if kind == "stalled":
        return ""  # said by the stall report itself
    return repr(record)
