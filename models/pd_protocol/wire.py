"""Control frames on the prefill bootstrap socket and the loop that serves them (SGLang PR #35281, areas 1 and 3).

Follows the notes on `bootstrap_thread` in `mooncake/conn.py`, `nixl/conn.py`
and `mori/conn.py` before the PR (17313cf4) and after it. A ZMQ multipart
message is a tuple of byte frames; the loop parses it and dispatches it:

- a registration `[b"None", endpoint, session, kv_args]` (NIXL and Mori put
  their guard frame first),
- a `TransferInfo` `[room, endpoint, port, session, dst_kv_indices, required_dst_info_num]`,
- the common `ABORT` `[b"ABORT", room, ip, port]`, which carries **no guard**
  on any backend.

Before the PR the Mooncake and NIXL loops had no `try`: a short frame
(`IndexError`), a non-integer room (`ValueError`), non-ASCII bytes
(`UnicodeDecodeError`) or NIXL's `assert msg[0] == GUARD` killed the thread
for good. Mori caught parse errors but checked its guard before anything
else, so it dropped every `ABORT` as malformed. After the PR every loop
validates first, logs and drops a bad frame and keeps serving, and Mori
dispatches `ABORT` before guard validation.

ABORT semantics (P4): a known room that is not `Success` becomes `Failed`
through the backend's status rule; a `Success` or unknown room is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from kvsim.engine.errors import ConfigError

from ..pd_common.status import KVPoll, update_status
from .variants import FIXED, ProtocolVariant

BACKENDS = ("mooncake", "nixl", "mori")
GUARDS = {"mooncake": None, "nixl": b"NixlMsgGuard", "mori": b"MoriMsgGuard"}
ABORT_TAG = b"ABORT"
REGISTRATION_FRAMES = 4
TRANSFER_INFO_FRAMES = 6
ABORT_FRAMES = 4
STATUS_FRAMES = 3

Frames = tuple[bytes, ...]


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ConfigError("backend", f"one of {', '.join(BACKENDS)}", backend)
    return backend


def _guarded(backend: str, body: Sequence[bytes]) -> Frames:
    guard = GUARDS[check_backend(backend)]
    return ((guard,) if guard else ()) + tuple(body)


def encode_registration(backend: str, endpoint: str = "10.0.0.2", session: str = "s0") -> Frames:
    return _guarded(backend, [b"None", endpoint.encode(), session.encode(), b"kv-args"])


def encode_transfer_info(backend: str, room: int, required: int = 1) -> Frames:
    return _guarded(backend, [str(room).encode(), b"10.0.0.2", b"17000", b"s0", b"0,1,2", str(required).encode()])


def encode_status(backend: str, room: int, status: KVPoll, prefill_rank: int = 0) -> Frames:
    """The prefill → decode status triple `[room, status, prefill_rank]`."""
    return _guarded(backend, [str(room).encode(), str(int(status)).encode(), str(prefill_rank).encode()])


def encode_abort(room: int) -> Frames:
    return (ABORT_TAG, str(room).encode(), b"10.0.0.2", b"17000")


class MalformedFrame(Exception):
    """What upstream raises while parsing (IndexError / ValueError / UnicodeDecodeError / AssertionError)."""


@dataclass(frozen=True)
class Message:
    kind: str  # "register", "transfer_info", "abort" or "status"
    room: int | None = None
    required: int | None = None  # TransferInfo's required_dst_info_num
    status: int | None = None  # a status message's KVPoll value


def _room(frame: bytes) -> int:
    try:
        text = frame.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedFrame("non-ASCII room") from None
    if not text.isdigit():  # int() would also take " 7", "+7" or "٧"; the wire carries plain digits
        raise MalformedFrame(f"non-integer room {text!r}")
    return int(text)


def parse_abort(frames: Frames) -> Message:
    if len(frames) < ABORT_FRAMES:
        raise MalformedFrame(f"ABORT with {len(frames)} frames, expected {ABORT_FRAMES}")
    return Message("abort", _room(frames[1]))


def parse_guarded(frames: Frames, backend: str) -> Message:
    """Registration or TransferInfo after the backend's guard; raises MalformedFrame."""
    guard = GUARDS[backend]
    if guard is not None:
        if not frames or frames[0] != guard:
            raise MalformedFrame("missing or foreign guard frame")
        frames = frames[1:]
    if not frames:
        raise MalformedFrame("empty message")
    if frames[0] == b"None":
        if len(frames) < REGISTRATION_FRAMES:
            raise MalformedFrame(f"registration with {len(frames)} frames, expected {REGISTRATION_FRAMES}")
        return Message("register")
    if len(frames) < TRANSFER_INFO_FRAMES:
        raise MalformedFrame(f"TransferInfo with {len(frames)} frames, expected {TRANSFER_INFO_FRAMES}")
    required = _room(frames[5])
    return Message("transfer_info", _room(frames[0]), required)


def parse_status(frames: Frames, backend: str) -> Message:
    guard = GUARDS[backend]
    if guard is not None:
        if not frames or frames[0] != guard:
            raise MalformedFrame("missing or foreign guard frame")
        frames = frames[1:]
    if len(frames) != STATUS_FRAMES:  # upstream unpacks exactly three values
        raise MalformedFrame(f"status message with {len(frames)} frames, expected {STATUS_FRAMES}")
    status = _room(frames[1])
    if status not in KVPoll._value2member_map_:
        raise MalformedFrame(f"unknown status {status}")
    _room(frames[2])
    return Message("status", _room(frames[0]), status=status)


@dataclass(frozen=True)
class Handled:
    rooms: Mapping[int, KVPoll]
    alive: bool  # False: the control thread died (upstream never restarts it)
    outcome: str  # "abort", "register", "transfer_info", "rejected", "died"
    reason: str = ""


def handle_bootstrap(frames: Frames, rooms: Mapping[int, KVPoll], backend: str,
                     variant: ProtocolVariant = FIXED) -> Handled:
    """One iteration of the prefill bootstrap loop: the rooms after it and whether the thread lives on."""
    check_backend(backend)
    frames = tuple(frames)
    abort_first = backend != "mori" or variant.mori_abort_before_guard  # Mori checked its guard first
    catches = backend == "mori" or variant.bootstrap_loop_catches  # Mori's loop already had a try
    try:
        if abort_first and frames and frames[0] == ABORT_TAG:
            return _abort(parse_abort(frames), rooms, backend, variant)
        if backend == "nixl" and not variant.nixl_guard_validated and (not frames or frames[0] != GUARDS["nixl"]):
            raise MalformedFrame("assert msg[0] == GUARD failed")
        message = parse_guarded(frames, backend)
    except MalformedFrame as exc:
        if catches:
            return Handled(rooms, True, "rejected", str(exc))
        return Handled(rooms, False, "died", str(exc))
    return Handled(rooms, True, message.kind)


def status_update(current: KVPoll | None, new: KVPoll, backend: str,
                  variant: ProtocolVariant = FIXED) -> KVPoll | None:
    """`update_status(room, new)` under the backend's rule, with the variant's later changes to the common rule."""
    return update_status(current, new, "mori" if backend == "mori" else "common",
                         opening_only=variant.common_opening_only, failed_terminal=variant.common_failed_terminal)


def _abort(message: Message, rooms: Mapping[int, KVPoll], backend: str, variant: ProtocolVariant = FIXED) -> Handled:
    room = message.room
    current = rooms.get(room)
    if current is None or current == KVPoll.Success:
        return Handled(rooms, True, "abort", "unknown room" if current is None else "room already Success")
    after = status_update(current, KVPoll.Failed, backend, variant)
    return Handled({**rooms, room: after}, True, "abort")


@dataclass(frozen=True)
class StatusRead:
    """The decode thread's reading of one message: the status message, or why it was rejected or killed it."""

    message: Message | None
    alive: bool
    reason: str = ""


def read_status(frames: Frames, backend: str, variant: ProtocolVariant = FIXED) -> StatusRead:
    """Parse one message on the decode thread (no room is touched yet).

    Before the PR the Mooncake decode thread had no `try` (a bad frame, or an
    unknown message unpacked as a triple, killed it) and the NIXL decode
    thread indexed `msg[0]` of an empty message; Mori caught errors.
    """
    try:
        if backend == "nixl" and not variant.nixl_decode_checks_empty and not frames:
            raise IndexError("msg[0] of an empty message")
        return StatusRead(parse_status(frames, backend), True)
    except (MalformedFrame, IndexError) as exc:
        dies = isinstance(exc, IndexError) or (backend == "mooncake" and not variant.mooncake_decode_loop_catches)
        return StatusRead(None, not dies, str(exc))


def status_after(message: Message, current: KVPoll | None, backend: str,
                 variant: ProtocolVariant = FIXED) -> KVPoll | None:
    """A decode room's status after a prefill status message; None when the thread drops it (unknown, concluded)."""
    if current is None or current in (KVPoll.Success, KVPoll.Failed):
        return None
    return status_update(current, KVPoll(message.status), backend, variant)


def handle_decode(frames: Frames, rooms: Mapping[int, KVPoll], backend: str,
                  variant: ProtocolVariant = FIXED) -> Handled:
    """One iteration of the decode thread: a prefill status message for a decode room."""
    check_backend(backend)
    read = read_status(tuple(frames), backend, variant)
    if read.message is None:
        return Handled(rooms, read.alive, "rejected" if read.alive else "died", read.reason)
    room = read.message.room
    after = status_after(read.message, rooms.get(room), backend, variant)
    if after is None:
        return Handled(rooms, True, "status", "unknown or concluded room: dropped")
    return Handled({**rooms, room: after}, True, "status")
