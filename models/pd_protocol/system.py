"""The PD control protocol as a transition system (SGLang PR #35281), one backend at a time.

One prefill rank and one decode rank share `rooms` requests. The prefill
manager starts up step by step (so a message can arrive between "thread
started" and "field assigned"); its bootstrap thread serves registration,
TransferInfo, ABORT, staging WATERMARK and garbage frames through the real
frame parser of `pd_wire`; its scheduler enqueues `chunks` per room on one
FIFO worker queue, the worker runs them (`pd_rooms.worker_step`), and a
terminal poll clears the room. The decode side initialises each room
(registration, TransferInfo), can abort it (waiting timeout or cancel,
which sends ABORT), takes the prefill's status messages, and runs the
heartbeat checker when the prefill dies.

Messages in flight form a multiset, so any of them may be delivered next
(reordering is built in). Faults are actions with a shared budget: drop a
message, duplicate a queued work item (stale work), inject a garbage frame,
crash the prefill. The clock passing a timeout is an action too.

Invariants: P1 success and failure are sticky, P2 no resurrection, P3 the
bootstrap and decode threads survive malformed frames, P5 peer death fails the unfinished rooms
after `max_failures` heartbeats, P7 no field read before assignment.
Liveness (P8 without the clock): every room concludes on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.engine.errors import ConfigError, check_int
from kvsim.engine.system import Invariant

from . import rooms as R
from ..pd_common.status import SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE, KVPoll
from .wire import VARIANTS, check_backend, encode_abort, encode_status, handle_bootstrap, handle_decode

ALIVE, UNSTARTED = "alive", "unstarted"


@dataclass(frozen=True)
class ProtocolConfig:
    backend: str
    rooms: int = 1
    chunks: int = 2
    faults: int = 1
    staging: bool = False  # decode sends a staging WATERMARK after registering
    max_failures: int = SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE

    def __post_init__(self) -> None:
        check_backend(self.backend)
        check_int(self.rooms, "rooms", minimum=1, maximum=3)
        check_int(self.chunks, "chunks", minimum=1, maximum=4)
        check_int(self.faults, "faults", minimum=0, maximum=3)
        check_int(self.max_failures, "max_failures", minimum=1)


class ProtoState(NamedTuple):
    init_pc: int
    thread: str  # "unstarted", "alive", or why it died
    dead_kind: str  # "", "malformed" or "uninitialised"
    prefill: tuple[R.PrefillRoom, ...]
    queue: tuple[tuple[int, int], ...]  # (room, chunk) in FIFO order
    sent: tuple[int, ...]  # chunks enqueued per room
    decode: tuple[KVPoll, ...]
    registered: bool
    to_prefill: tuple[tuple, ...]  # sorted multiset of messages in flight
    to_decode: tuple[tuple, ...]
    peer_dead: bool
    hb_fail: int
    faults_left: int
    decode_thread: str = ALIVE


def _add(bag: tuple[tuple, ...], *messages: tuple) -> tuple[tuple, ...]:
    return tuple(sorted(bag + messages))


def _remove(bag: tuple[tuple, ...], message: tuple) -> tuple[tuple, ...]:
    i = bag.index(message)
    return bag[:i] + bag[i + 1:]


class PdProtocol:
    liveness = "every_room_concludes"

    def __init__(self, config: ProtocolConfig, variant: str = "fixed") -> None:
        if variant not in VARIANTS:
            raise ConfigError("variant", f"one of {', '.join(VARIANTS)}", variant)
        self.name, self.variant, self.config = "pd-protocol", variant, config
        self.backend = config.backend
        self.init = R.init_sequence(self.backend, variant)
        self.heartbeat = R.has_heartbeat_checker(self.backend, variant)
        self.invariants = (
            Invariant("bootstrap_thread_survives_malformed", lambda s: _dead(s, "malformed"),
                      "P3: no frame kills the bootstrap thread"),
            Invariant("decode_thread_survives_malformed", _decode_dead,
                      "P3: no frame kills the decode thread"),
            Invariant("no_field_read_before_assignment", lambda s: _dead(s, "uninitialised"),
                      "P7: no control thread reads a manager field before it is assigned"),
            Invariant("success_is_sticky", self._sticky, "P1: a room that concluded Success never turns Failed"),
            Invariant("failed_is_sticky", self._failed_sticky, "P1: a Failed room never becomes non-Failed"),
            Invariant("no_resurrection", self._no_resurrection, "P2: nothing recreates a cleared room"),
            Invariant("peer_death_fails_unfinished_rooms", self._peer_death,
                      "P5: max_failures missed heartbeats fail every non-Success decode room"),
        )

    # -- contract -----------------------------------------------------------------------------
    def initial_states(self) -> tuple[ProtoState, ...]:
        n = self.config.rooms
        return (ProtoState(0, UNSTARTED, "", (R.NEW_PREFILL_ROOM,) * n, (), (0,) * n,
                           (KVPoll.Bootstrapping,) * n, False, (), (), False, 0, self.config.faults),)

    def done(self, s: ProtoState) -> bool:
        decode_done = all(d in R.TERMINAL for d in s.decode)
        prefill_done = s.peer_dead or all(p.status is None for p in s.prefill)
        return decode_done and prefill_done

    def enabled(self, s: ProtoState) -> list[tuple]:
        acts: list[tuple] = []
        rooms = range(self.config.rooms)
        if not s.peer_dead:
            if s.init_pc < len(self.init):
                acts.append(("init", self.init[s.init_pc]))
            if s.thread == ALIVE:
                acts += [("deliver_prefill", m) for m in dict.fromkeys(s.to_prefill)]
            for r in rooms:
                room = s.prefill[r]
                if room.status in (KVPoll.WaitingForInput, KVPoll.Transferring) and s.sent[r] < self.config.chunks:
                    acts.append(("enqueue", r))
                if room.status in R.TERMINAL:
                    acts.append(("clear", r))
                if room.status == KVPoll.Bootstrapping:
                    acts.append(("bootstrap_timeout", r))
            if s.queue:
                acts.append(("work",))
        if s.decode_thread == ALIVE:
            acts += [("deliver_decode", m) for m in dict.fromkeys(s.to_decode)]
        for r in rooms:
            if s.decode[r] == KVPoll.Bootstrapping:
                acts.append(("decode_init", r))
            if s.decode[r] == KVPoll.WaitingForInput:
                acts.append(("decode_abort", r))
        if s.peer_dead and s.hb_fail < self.config.max_failures:
            acts.append(("heartbeat_miss",))
        if s.faults_left:
            acts += [("drop", "prefill", m) for m in dict.fromkeys(s.to_prefill)]
            acts += [("drop", "decode", m) for m in dict.fromkeys(s.to_decode)]
            acts += [("duplicate", "prefill", m) for m in dict.fromkeys(s.to_prefill)]
            acts += [("duplicate", "decode", m) for m in dict.fromkeys(s.to_decode)]
            acts += [("duplicate_work", i) for i in range(len(s.queue))]
            acts.append(("garbage", "decode"))
            if not s.peer_dead:
                acts += [("garbage", "prefill"), ("crash_prefill",)]
        return acts

    def step(self, s: ProtoState, a: tuple) -> ProtoState:
        kind = a[0]
        if kind == "init":
            return s._replace(init_pc=s.init_pc + 1, thread=ALIVE if a[1] == R.START_THREAD else s.thread)
        if kind == "deliver_prefill":
            return self._on_prefill_message(s._replace(to_prefill=_remove(s.to_prefill, a[1])), a[1])
        if kind == "deliver_decode":
            return self._on_decode_message(s._replace(to_decode=_remove(s.to_decode, a[1])), a[1])
        if kind == "enqueue":
            r = a[1]
            sent = s.sent[:r] + (s.sent[r] + 1,) + s.sent[r + 1:]
            return s._replace(queue=s.queue + ((r, s.sent[r]),), sent=sent)
        if kind == "work":
            return self._work(s)
        if kind == "clear":
            return self._set_prefill(s, a[1], R.clear(s.prefill[a[1]]))
        if kind == "bootstrap_timeout":
            r = a[1]
            s = self._set_prefill(s, r, R.bootstrap_timeout(s.prefill[r], self.backend))
            return s._replace(to_decode=_add(s.to_decode, ("STATUS", r, int(KVPoll.Failed))))
        if kind == "decode_init":
            return self._decode_init(s, a[1])
        if kind == "decode_abort":
            r = a[1]
            s = self._set_decode(s, r, KVPoll.Failed)
            return s._replace(to_prefill=_add(s.to_prefill, ("ABORT", r)))
        if kind == "heartbeat_miss":
            s = s._replace(hb_fail=s.hb_fail + 1)
            if s.hb_fail == self.config.max_failures and self.heartbeat:
                s = s._replace(decode=R.handle_node_failure(s.decode))
            return s
        return self._fault(s._replace(faults_left=s.faults_left - 1), a)

    # -- prefill ------------------------------------------------------------------------------
    def _on_prefill_message(self, s: ProtoState, m: tuple) -> ProtoState:
        assigned = self.init[: s.init_pc]
        missing = [f for f in R.fields_read(self.backend, m[0]) if f not in assigned]
        if missing:  # AttributeError in a thread without try: it dies for good
            return s._replace(thread=f"AttributeError: {missing[0]} read before assignment ({m[0]})",
                              dead_kind="uninitialised")
        if m[0] == "GARBAGE":
            handled = handle_bootstrap((), {}, self.backend, self.variant)
            if not handled.alive:
                return s._replace(thread=f"died on a malformed frame: {handled.reason}", dead_kind="malformed")
            return s
        if m[0] == "TINFO":
            return self._set_prefill(s, m[1], R.on_transfer_info(s.prefill[m[1]], self.backend))
        if m[0] == "ABORT":
            r = m[1]
            present = {r: s.prefill[r].status} if s.prefill[r].status is not None else {}
            after = handle_bootstrap(encode_abort(r), present, self.backend, self.variant).rooms.get(r)
            return self._set_prefill(s, r, s.prefill[r]._replace(status=after))
        return s  # registration and watermark change no room

    def _work(self, s: ProtoState) -> ProtoState:
        (r, chunk), queue = s.queue[0], s.queue[1:]
        room, outcome = R.worker_step(s.prefill[r], chunk == self.config.chunks - 1, self.backend, self.variant)
        s = self._set_prefill(s._replace(queue=queue), r, room)
        if outcome == "completed":
            s = s._replace(to_decode=_add(s.to_decode, ("STATUS", r, int(KVPoll.Success))))
        return s

    # -- decode -------------------------------------------------------------------------------
    def _decode_init(self, s: ProtoState, r: int) -> ProtoState:
        new = [("TINFO", r)]
        if not s.registered:
            new.append(("REG",))
            if self.config.staging:
                new.append(("WATERMARK",))
        s = self._set_decode(s, r, KVPoll.WaitingForInput)
        return s._replace(registered=True, to_prefill=_add(s.to_prefill, *new))

    def _on_decode_message(self, s: ProtoState, m: tuple) -> ProtoState:
        frames = () if m[0] == "GARBAGE" else encode_status(self.backend, m[1], KVPoll(m[2]))
        handled = handle_decode(frames, dict(enumerate(s.decode)), self.backend, self.variant)
        if not handled.alive:
            return s._replace(decode_thread=f"died on a malformed frame: {handled.reason}")
        return s._replace(decode=tuple(handled.rooms[r] for r in range(self.config.rooms)))

    # -- faults -------------------------------------------------------------------------------
    def _fault(self, s: ProtoState, a: tuple) -> ProtoState:
        kind = a[0]
        side = "to_prefill" if len(a) > 1 and a[1] == "prefill" else "to_decode"
        if kind == "drop":
            return s._replace(**{side: _remove(getattr(s, side), a[2])})
        if kind == "duplicate":
            return s._replace(**{side: _add(getattr(s, side), a[2])})
        if kind == "duplicate_work":
            return s._replace(queue=s.queue + (s.queue[a[1]],))
        if kind == "garbage":
            return s._replace(**{side: _add(getattr(s, side), ("GARBAGE",))})
        if kind == "crash_prefill":
            return s._replace(peer_dead=True, to_prefill=(), queue=())
        raise ValueError(f"unknown action {a!r}")

    # -- helpers and invariants ----------------------------------------------------------------
    @staticmethod
    def _set_prefill(s: ProtoState, r: int, room: R.PrefillRoom) -> ProtoState:
        return s._replace(prefill=s.prefill[:r] + (R.note_failure(room),) + s.prefill[r + 1:])

    @staticmethod
    def _set_decode(s: ProtoState, r: int, status: KVPoll) -> ProtoState:
        return s._replace(decode=s.decode[:r] + (status,) + s.decode[r + 1:])

    @staticmethod
    def _sticky(s: ProtoState) -> str | None:
        for r, room in enumerate(s.prefill):
            if room.succeeded and room.status == KVPoll.Failed:
                return f"prefill room {r}: concluded Success, expected to stay Success or be cleared, got Failed"
        return None

    @staticmethod
    def _failed_sticky(s: ProtoState) -> str | None:
        for r, room in enumerate(s.prefill):
            if room.failed and room.status not in (KVPoll.Failed, None):
                return f"prefill room {r}: was Failed, expected to stay Failed or be cleared, got {room.status.name}"
        return None

    @staticmethod
    def _no_resurrection(s: ProtoState) -> str | None:
        for r, room in enumerate(s.prefill):
            if room.cleared and room.status is not None:
                return f"prefill room {r}: cleared, expected absent, got {room.status.name}"
        return None

    def _peer_death(self, s: ProtoState) -> str | None:
        if s.peer_dead and s.hb_fail >= self.config.max_failures:
            waiting = [r for r, d in enumerate(s.decode) if d not in R.TERMINAL]
            if waiting:
                return (f"decode rooms {waiting} after {s.hb_fail} missed heartbeats from a dead prefill: "
                        f"expected Failed, got {[s.decode[r].name for r in waiting]}")
        return None


def _decode_dead(s: ProtoState) -> str | None:
    return f"decode thread: expected alive, got {s.decode_thread}" if s.decode_thread != ALIVE else None


def _dead(s: ProtoState, kind: str) -> str | None:
    return f"bootstrap thread: expected alive, got {s.thread}" if s.dead_kind == kind else None
