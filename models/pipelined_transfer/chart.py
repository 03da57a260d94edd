"""Who acts in a pipelined-transfer counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (TensorRT-LLM's Python cache transceiver, #15727): the context executor (`PyExecutor`: the
forward steps, the collective context poll, the transfer timeout, cancels), one `TxSession` per
sender TP rank (its `KVSendTask`s and fabric writes), and the generation side's `KVRecvTask`.
"""

from __future__ import annotations

from typing import Any

EXECUTOR, RECEIVER = "context executor (PyExecutor)", "receiver (KVRecvTask)"


def rank(k: int) -> str:
    return f"sender rank {k} (TxSession)"


def lifelines(system: Any) -> tuple[str, ...]:
    return (EXECUTOR,) + tuple(rank(k) for k in range(system.cfg.ranks)) + (RECEIVER,)


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    kind, rid = action[0], (action[1] if len(action) > 1 else None)
    if kind == "peer_info":
        return ((RECEIVER, rank(action.rank), f"req {rid}: peer info", False),)
    if kind == "promote":
        return ((EXECUTOR, EXECUTOR, f"req {rid}: CONTEXT_INIT", False),)
    if kind == "compute":
        return tuple((EXECUTOR, rank(k), f"req {rid}: respond_and_send_async", False) for k in range(system.cfg.ranks))
    if kind == "write_done":
        return ((rank(action.rank), RECEIVER, f"req {rid}: write #{action.index} lands", False),)
    if kind == "write_fail":
        return ((rank(action.rank), RECEIVER, f"req {rid}: write #{action.index} FAILS", True),)
    if kind == "deliver":
        return ((rank(action.rank), RECEIVER, f"req {rid}: result frame", False),)
    if kind == "drop_frame":
        return ((rank(action.rank), RECEIVER, f"req {rid}: result frame LOST", True),)
    if kind == "dup_frame":
        return ((rank(action.rank), RECEIVER, f"req {rid}: result frame DUPLICATED", True),)
    if kind in ("poll", "timeout", "stall_report", "fence"):
        return ((EXECUTOR, EXECUTOR, f"req {rid}: {kind.replace('_', ' ')}", False),)
    if kind == "rx_timeout":
        return ((RECEIVER, RECEIVER, f"req {rid}: receive deadline", False),)
    if kind == "silent":
        return ((RECEIVER, RECEIVER, f"req {rid}: peer goes silent", True),)
    if kind == "cancel":
        return ((EXECUTOR, EXECUTOR, f"req {rid}: cancelled", True),)
    if kind == "shutdown":
        return ((EXECUTOR, EXECUTOR, "shutdown", True),)
    if kind == "gen_post":
        return tuple((RECEIVER, rank(k), f"req {rid}: REQUEST_DATA", False) for k in range(system.cfg.ranks))
    if kind == "gen_cancel":
        return ((RECEIVER, RECEIVER, f"req {rid}: receive cancelled", True),)
    if kind == "remote_cancel":
        return ((RECEIVER, rank(action.rank), f"req {rid}: CANCEL_SESSION", False),)
    if kind == "drop_cancel":
        return ((RECEIVER, rank(action.rank), f"req {rid}: CANCEL_SESSION LOST", True),)
    if kind == "cancel_ack":
        return ((rank(action.rank), RECEIVER, f"req {rid}: cancel-ACK", False),)
    if kind == "drop_ack":
        return ((rank(action.rank), RECEIVER, f"req {rid}: cancel-ACK LOST", True),)
    if kind == "rx_stall":
        return ((RECEIVER, RECEIVER, f"req {rid}: ACK deadline: stalled", False),)
    if kind == "gen_release":
        return ((RECEIVER, RECEIVER, f"req {rid}: destination pages released", False),)
    return ((EXECUTOR, EXECUTOR, kind, False),)
