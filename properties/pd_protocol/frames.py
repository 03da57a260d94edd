"""P3 and P4: the bootstrap and decode threads over byte frames (SGLang PR #35281, areas 1 and 3).

The cases come from `strategies.frame_traffic`, `status_traffic` and
`abort_traffic`, which read the model parameter `backend`.
"""

from __future__ import annotations

from typing import Any, Callable

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol.variants import ProtocolVariant
from kvsim.models.pd_protocol.wire import encode_abort, handle_bootstrap, handle_decode

MODEL = "pd-protocol"


@kv_property(model=MODEL, strategy="frame_traffic")
def control_loop_survives_any_frames(case: Any, variant: ProtocolVariant) -> None:
    """P3: after any byte-level messages the bootstrap thread is alive, and a rejected message changes no room."""
    _loop_survives(case, variant, handle_bootstrap, "bootstrap thread", "every later room on this rank stalls")


@kv_property(model=MODEL, strategy="status_traffic")
def decode_loop_survives_any_frames(case: Any, variant: ProtocolVariant) -> None:
    """P3 on the decode side: after any byte-level messages the decode thread is alive; a rejected one changes no room."""
    _loop_survives(case, variant, handle_decode, "decode thread", "no later status reaches any room")


def _loop_survives(case: Any, variant: ProtocolVariant, handler: Callable[..., Any], thread: str,
                   consequence: str) -> None:
    backend, rooms, messages = case
    for n, frames in enumerate(messages):
        handled = handler(frames, rooms, backend, variant)
        if not handled.alive:
            raise PropertyViolation(f"{backend} {thread} after message {n} {frames!r}: expected alive, "
                                    f"got dead ({handled.reason}); {consequence}")
        if handled.outcome == "rejected" and handled.rooms != rooms:
            raise PropertyViolation(f"rooms after rejected message {n}: expected unchanged {rooms}, got {handled.rooms}")
        rooms = handled.rooms


def _name(status: KVPoll | None) -> str:
    return "absent" if status is None else status.name


@kv_property(model=MODEL, strategy="abort_traffic")
def abort_fails_known_unfinished_rooms(case: Any, variant: ProtocolVariant) -> None:
    """P4: ABORT makes a known non-Success room Failed in one step; Success and unknown rooms are unchanged; idempotent."""
    backend, rooms, targets = case
    for room in targets:
        before = rooms.get(room)
        after = handle_bootstrap(encode_abort(room), rooms, backend, variant)
        again = handle_bootstrap(encode_abort(room), after.rooms, backend, variant)
        want = before if before in (None, KVPoll.Success) else KVPoll.Failed
        got = after.rooms.get(room)
        if got != want:
            raise PropertyViolation(f"{backend} room {room} after ABORT: expected {_name(want)}, got {_name(got)} "
                                    f"(was {_name(before)}; {after.outcome} {after.reason})")
        others = {k: v for k, v in after.rooms.items() if k != room}
        if others != {k: v for k, v in rooms.items() if k != room}:
            raise PropertyViolation(f"other rooms after ABORT of room {room}: expected unchanged, got {others}")
        if again.rooms != after.rooms:
            raise PropertyViolation(f"rooms after a second ABORT of room {room}: expected {after.rooms}, got {again.rooms}")
        rooms = after.rooms
