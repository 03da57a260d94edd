"""Who acts in a pd-staging counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` names the
actors, `arrows(system, state, action)` says what one action is on the chart, as
`(sender, receiver, label, fault)` tuples (sender == receiver: a step on one lifeline).

Actors (SGLang, `python/sglang/srt/disaggregation/`): the prefill scheduler, which runs the forward
batches and puts each chunk on every writer's transfer queue; one Mooncake transfer worker per prefill
writer rank (its FIFO queue, `STAGING_REQ`, `CHUNK_READY`, `sender.poll()`); the decode rank's
`DecodeStagingHandler` with its `StagingAllocator` ring.
"""

from __future__ import annotations

from typing import Any

from ..pd_common.status import KVPoll
from .actions import UP

SCHEDULER, DECODE = "prefill scheduler", "decode (DecodeStagingHandler)"
NAMES = {"REQ": "STAGING_REQ", "RSP": "STAGING_RSP", "READY": "CHUNK_READY", "STATUS": "status", "WM": "WATERMARK",
         "ABORT": "ABORT", "ACK": "ABORT_ACK"}


def writer(w: int) -> str:
    return f"prefill writer {w} (transfer worker)"


def lifelines(system: Any) -> tuple[str, ...]:
    return (SCHEDULER,) + tuple(writer(w) for w in range(system.cfg.writers)) + (DECODE,)


def message(m: tuple) -> str:
    """A message in a few words: `STAGING_RSP r0 c1 slot 2`."""
    kind, name = m[0], NAMES.get(m[0], m[0])
    if kind == "WM":
        return f"{name} round {m.round} tail {m.tail}"
    if kind == "STATUS":
        return f"{name} r{m.room} {KVPoll(m.status).name}"
    if kind in ("ABORT", "ACK"):
        return f"{name} r{m.room}"
    text = f"{name} r{m.room} c{m.chunk_idx}"
    if kind == "RSP":
        text += f" slot {m.alloc_id}" if m.alloc_id >= 0 else " no slot"
    return text


def _route(side: int, w: int) -> tuple[str, str]:
    return (writer(w), DECODE) if side == UP else (DECODE, writer(w))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    kind = action[0]
    if kind == "batch":
        return tuple((SCHEDULER, writer(w), f"enqueue r{action.room} chunk", False)
                     for w in range(system.cfg.writers))
    if kind in ("work", "defer_dst"):
        who = writer(action.writer)
        label = "dequeue head chunk" if kind == "work" else "sibling dst defers: re-enqueue chunk"
        return ((who, who, label, kind == "defer_dst"),)
    if kind == "clear":
        return ((writer(action.writer), writer(action.writer), f"poll terminal: clear r{action.room}", False),)
    if kind in ("deliver", "reorder"):
        sender, receiver = _route(action.side, action.writer)
        return ((sender, receiver, ("overtakes: " if kind == "reorder" else "") + message(action.msg),
                 kind == "reorder"),)
    if kind in ("drop", "duplicate"):
        sender, receiver = _route(action.side, action.writer)
        return ((sender, receiver, f"{kind.upper()} {message(action.msg)}", True),)
    if kind == "scatter_done":
        return ((DECODE, DECODE, f"scatter r{action.room} done, free slot {action.alloc_id}", False),)
    if kind in ("deadline", "waiting_timeout", "release_timeout"):
        return ((DECODE, DECODE, f"{kind.replace('_', ' ')} r{action.room}", False),)
    if kind == "heartbeat_failure":
        return ((DECODE, DECODE, "heartbeat failure", False),)
    if kind == "abort":
        return ((DECODE, DECODE, f"abort r{action.room}", True),)
    if kind == "peer_death":
        return ((SCHEDULER, SCHEDULER, "prefill node dies", True),)
    return ((DECODE, DECODE, kind, False),)
