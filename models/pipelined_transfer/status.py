"""Request, task and session states of the Python cache transceiver, and the TxSession status derivation.

Research note ../shared/research/trtllm_flashinfer.md, sections 1.5 and 1.6.
`LlmRequestState` keeps the C++ enum's numeric values ("schedulable" is
[10, 14)). `tx_status` derives a TxSession's status in the upstream priority
order; `is_completed` is where the #17526 subtlety lives: between two chunks
every registered KV task is TRANSFERRED, so the derived status reads "all KV
done" mid-prefill, and only the missing aux task stops completion. The model
adds the explicit "final slice submitted" flag upstream lacks
(`PipelinedVariant.final_slice_flag`); without it, a wait that skips a `None`
aux task reports completion early.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class LlmRequestState(enum.IntEnum):
    DISAGG_TRANS_ERROR = -1
    DISAGG_CONTEXT_WAIT_SCHEDULER = 7
    DISAGG_GENERATION_INIT = 8
    DISAGG_GENERATION_TRANS_IN_PROGRESS = 9
    CONTEXT_INIT = 10
    DISAGG_CONTEXT_INIT_AND_TRANS = 11
    DISAGG_GENERATION_TRANS_COMPLETE = 12
    GENERATION_IN_PROGRESS = 13
    GENERATION_TO_COMPLETE = 14
    GENERATION_COMPLETE = 20
    DISAGG_CONTEXT_TRANS_IN_PROGRESS = 21
    DISAGG_CONTEXT_COMPLETE = 22
    DISAGG_GENERATION_WAIT_TOKENS = 23


def schedulable(state: LlmRequestState) -> bool:
    return 10 <= state < 14


class TaskStatus(enum.IntEnum):
    INIT = 0
    TRANSFERRING = 1
    TRANSFERRED = 2
    ERROR = 3


class SessionStatus(enum.IntEnum):
    INIT = 0
    READY = 1
    TRANSFERRING = 2
    KV_TRANSFERRED = 3
    FULLY_TRANSFERRED = 4
    ERROR = 5
    CANCELLED = 6


class WaitResult(enum.IntEnum):
    COMPLETED = 0
    FAILED = 1
    TIMEOUT = 2


TERMINAL_SESSION = (SessionStatus.ERROR, SessionStatus.CANCELLED)


class KVSendTask(NamedTuple):
    slice_id: int  # len(kv_tasks) at send(): 0, 1, 2, ... in submission order
    is_last: bool
    status: TaskStatus


class TxSession(NamedTuple):
    """One sender rank's session for one request (`rid`)."""

    in_map: bool  # registered in the send-session map: has_inflight_transfer
    tasks: tuple[KVSendTask, ...]
    final: bool  # the model's explicit "final slice submitted" flag
    aux: TaskStatus | None  # the AuxSendTask, created by _finalize_send after the last slice
    terminal: SessionStatus | None  # CANCELLED or ERROR once cancel() / set_exception() ran
    sealed: bool  # no further send is accepted
    credits: int  # outstanding write obligations: has_transferring_tasks() <=> credits != 0
    ready: bool = True  # receiver_ready (gen-first: the peer's REQUEST_DATA is here)
    aux_frees: int = 0  # times the aux slot (held from _finalize_send's aux task) was freed at finalization


NEW_TX = TxSession(True, (), False, None, None, False, 0)


def tx_status(tx: TxSession) -> SessionStatus:
    """The derived status, in upstream priority order (section 1.6)."""
    if tx.terminal is not None:
        return tx.terminal
    statuses = [t.status for t in tx.tasks] + ([tx.aux] if tx.aux is not None else [])
    if TaskStatus.ERROR in statuses:
        return SessionStatus.ERROR
    if tx.tasks and all(t.status == TaskStatus.TRANSFERRED for t in tx.tasks):
        return SessionStatus.FULLY_TRANSFERRED if tx.aux == TaskStatus.TRANSFERRED else SessionStatus.KV_TRANSFERRED
    if TaskStatus.TRANSFERRING in statuses:
        return SessionStatus.TRANSFERRING
    return SessionStatus.READY if tx.ready else SessionStatus.INIT


def is_completed(tx: TxSession, final_slice_flag: bool) -> bool:
    """What the context side's completion check reports (gen-first: aux is always needed).

    `final_slice_flag` (the model's fix, #17526 review): complete only once the final slice was submitted and the
    session is FULLY_TRANSFERRED. Without it: a blocking `wait_complete()` that skips a `None` aux task, so
    KV_TRANSFERRED with no aux task yet (between two chunks) reads as complete.
    """
    status = tx_status(tx)
    if final_slice_flag:
        return tx.final and status == SessionStatus.FULLY_TRANSFERRED
    return status == SessionStatus.FULLY_TRANSFERRED or (status == SessionStatus.KV_TRANSFERRED and tx.aux is None)


def cancel(tx: TxSession) -> TxSession:
    """`cancel()`: idempotent; seals, terminal CANCELLED (an earlier terminal status stays)."""
    return tx._replace(sealed=True, terminal=tx.terminal if tx.terminal is not None else SessionStatus.CANCELLED)


def set_exception(tx: TxSession) -> TxSession:
    """`set_exception()`: seals, terminal ERROR; never overrides CANCELLED."""
    return tx._replace(sealed=True, terminal=tx.terminal if tx.terminal is not None else SessionStatus.ERROR)
