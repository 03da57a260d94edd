"""Who acts in a pipelined-transfer counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (TensorRT-LLM's Python cache transceiver, #15727): the context executor (`PyExecutor`: the
forward steps, the collective context poll, the transfer timeout, cancels), one `TxSession` per
sender TP rank (its `KVSendTask`s and fabric writes), and the generation side's `KVRecvTask`.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .state import (Cancel, CancelAck, Compute, Deliver, DropAck, DropCancel, DropFrame, DupFrame, Fence, GenCancel,
                    GenPost, GenRelease, PeerInfo, Poll, Promote, RemoteCancel, RxStall, RxTimeout, Shutdown, Silent,
                    StallReport, Timeout, WriteDone, WriteFail)

EXECUTOR, RECEIVER = "context executor (PyExecutor)", "receiver (KVRecvTask)"


def rank(k: int) -> str:
    return f"sender rank {k} (TxSession)"


def lifelines(system: Any) -> tuple[str, ...]:
    return (EXECUTOR,) + tuple(rank(k) for k in range(system.cfg.ranks)) + (RECEIVER,)


def _executor(a: tuple, ranks: int) -> tuple[tuple[str, str, str, bool], ...]:
    """A step of the executor's own (the poll, the timeout, the stall report, the fence), named by its tag."""
    return ((EXECUTOR, EXECUTOR, f"req {a.rid}: {a.tag.replace('_', ' ')}", False),)


_arrows = table({  # an action on the chart, by record type (`ranks`: the sender ranks)
    PeerInfo: lambda a, ranks: ((RECEIVER, rank(a.rank), f"req {a.rid}: peer info", False),),
    Promote: lambda a, ranks: ((EXECUTOR, EXECUTOR, f"req {a.rid}: CONTEXT_INIT", False),),
    Compute: lambda a, ranks: tuple((EXECUTOR, rank(k), f"req {a.rid}: respond_and_send_async", False)
                                    for k in range(ranks)),
    WriteDone: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: write #{a.index} lands", False),),
    WriteFail: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: write #{a.index} FAILS", True),),
    Deliver: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: result frame", False),),
    DropFrame: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: result frame LOST", True),),
    DupFrame: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: result frame DUPLICATED", True),),
    Poll: _executor,
    Timeout: _executor,
    StallReport: _executor,
    Fence: _executor,
    RxTimeout: lambda a, ranks: ((RECEIVER, RECEIVER, f"req {a.rid}: receive deadline", False),),
    Silent: lambda a, ranks: ((RECEIVER, RECEIVER, f"req {a.rid}: peer goes silent", True),),
    Cancel: lambda a, ranks: ((EXECUTOR, EXECUTOR, f"req {a.rid}: cancelled", True),),
    Shutdown: lambda a, ranks: ((EXECUTOR, EXECUTOR, "shutdown", True),),
    GenPost: lambda a, ranks: tuple((RECEIVER, rank(k), f"req {a.rid}: REQUEST_DATA", False) for k in range(ranks)),
    GenCancel: lambda a, ranks: ((RECEIVER, RECEIVER, f"req {a.rid}: receive cancelled", True),),
    RemoteCancel: lambda a, ranks: ((RECEIVER, rank(a.rank), f"req {a.rid}: CANCEL_SESSION", False),),
    DropCancel: lambda a, ranks: ((RECEIVER, rank(a.rank), f"req {a.rid}: CANCEL_SESSION LOST", True),),
    CancelAck: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: cancel-ACK", False),),
    DropAck: lambda a, ranks: ((rank(a.rank), RECEIVER, f"req {a.rid}: cancel-ACK LOST", True),),
    RxStall: lambda a, ranks: ((RECEIVER, RECEIVER, f"req {a.rid}: ACK deadline: stalled", False),),
    GenRelease: lambda a, ranks: ((RECEIVER, RECEIVER, f"req {a.rid}: destination pages released", False),),
}, lambda a, ranks: ((EXECUTOR, EXECUTOR, a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action, system.cfg.ranks)
