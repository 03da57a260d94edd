"""Per-room steps of the PD control plane, the building blocks of the protocol transition system (`system`).

Follows the room lifecycle of research note ../shared/research/sglang.md
section 1.3 and the worker and start-up behaviour of PR #35281 (section 4):
`transfer_worker` (NIXL), `_run_chunk` (Mori), the Mooncake worker's entry
check, `clear()`, `_handle_node_failure`, and the order in which each
manager assigns its fields and starts its bootstrap thread.

Three flags of `ProtocolVariant` are read here, each where the PR changed the
code: the NIXL worker's `assert room in transfer_infos` (whose catch-all fails
a concluded room), Mori's missing heartbeat checker, and Mooncake's start-up
order.
"""

from __future__ import annotations

from typing import NamedTuple

from ..pd_common.status import KVPoll
from .variants import FIXED, ProtocolVariant
from .wire import check_backend, status_update

TERMINAL = (KVPoll.Success, KVPoll.Failed)


def status_rule(backend: str) -> str:
    return "mori" if check_backend(backend) == "mori" else "common"


class PrefillRoom(NamedTuple):
    status: KVPoll | None  # request_status[room]; None when absent
    infos: bool  # transfer_infos[room] present
    cleared: bool  # clear() ran for this room (P2 watches what happens after)
    succeeded: bool  # the room concluded Success at some point (P1 watches what happens after)
    failed: bool = False  # the room was Failed at some point (P1's other half)


NEW_PREFILL_ROOM = PrefillRoom(KVPoll.Bootstrapping, False, False, False)


def note_failure(room: PrefillRoom) -> PrefillRoom:
    """Remember that a room was Failed, so a later status that un-fails it is visible."""
    return room._replace(failed=True) if room.status == KVPoll.Failed and not room.failed else room


def on_transfer_info(room: PrefillRoom, backend: str, variant: ProtocolVariant = FIXED) -> PrefillRoom:
    """A decode TransferInfo arrived (one destination: required_dst_info_num == 1)."""
    if room.status is None or room.cleared:
        return room  # stale metadata for a finished room: every backend drops it
    return room._replace(infos=True, status=status_update(room.status, KVPoll.WaitingForInput, backend, variant))


def worker_step(room: PrefillRoom, last: bool, backend: str,
                variant: ProtocolVariant = FIXED) -> tuple[PrefillRoom, str]:
    """A transfer worker dequeues one chunk of this room: (room after, outcome)."""
    stale = room.status is None or not room.infos or room.status == KVPoll.Failed
    if stale:
        if backend == "nixl" and not variant.nixl_stale_work_checked and room.status != KVPoll.Failed:
            # `assert room in self.transfer_infos` fails; the catch-all records a failure and calls
            # update_status(room, Failed), which overrides a concluded Success still present
            return room._replace(status=status_update(room.status, KVPoll.Failed, "nixl", variant)), "failed_stale"
        return room, "dropped"  # Mooncake's entry check, NIXL's .get(room), Mori's stale check
    status = status_update(room.status, KVPoll.Transferring, backend, variant)
    if last:
        # last chunk (with aux and state) delivered: conclude and tear the transfer state down
        return room._replace(status=KVPoll.Success, infos=False, succeeded=True), "completed"
    return room._replace(status=status), "sent"


def clear(room: PrefillRoom) -> PrefillRoom:
    """The scheduler saw a terminal poll: release the pages and pop request_status and transfer_infos."""
    return PrefillRoom(None, False, True, room.succeeded, room.failed)


def bootstrap_timeout(room: PrefillRoom, backend: str, variant: ProtocolVariant = FIXED) -> PrefillRoom:
    return room._replace(status=status_update(room.status, KVPoll.Failed, backend, variant))


def has_heartbeat_checker(backend: str, variant: ProtocolVariant = FIXED) -> bool:
    """Mori decode started no heartbeat checker before the PR."""
    return check_backend(backend) != "mori" or variant.mori_heartbeat_checker


def handle_node_failure(decode: tuple[KVPoll, ...]) -> tuple[KVPoll, ...]:
    """`_handle_node_failure(addr)`: every non-Success room of the dead prefill becomes Failed."""
    return tuple(s if s == KVPoll.Success else KVPoll.Failed for s in decode)


START_THREAD, SESSION_STATE, STAGING_CTX = "start_thread", "session_state", "staging_ctx"


def init_sequence(backend: str, variant: ProtocolVariant = FIXED) -> tuple[str, ...]:
    """The prefill manager's constructor, step by step; a message may arrive right after the thread starts.

    Mooncake before the PR started the bootstrap thread before creating `session_failures`,
    `failed_sessions` and `session_lock`; after it those come first. `_staging_ctx` is assigned after
    the thread starts in both (the reviewer's residual). The NIXL and Mori orders are not in the notes;
    they are modelled as safe (fields first).
    """
    if check_backend(backend) == "mooncake" and not variant.mooncake_fields_before_thread:
        return (START_THREAD, SESSION_STATE, STAGING_CTX)
    return (SESSION_STATE, START_THREAD, STAGING_CTX)


def fields_read(backend: str, message_kind: str) -> tuple[str, ...]:
    """Manager fields the Mooncake bootstrap thread reads for a message (registration takes session_lock)."""
    if backend != "mooncake":
        return ()
    return {"REG": (SESSION_STATE,), "TINFO": (SESSION_STATE,), "WATERMARK": (STAGING_CTX,)}.get(message_kind, ())
