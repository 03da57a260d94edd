"""The PD control protocol as a transition system (SGLang PR #35281), one backend at a time.

One prefill rank and one decode rank share `rooms` requests. The prefill
manager starts up step by step (so a message can arrive between "thread
started" and "field assigned"); its bootstrap thread serves registration,
TransferInfo, ABORT, staging WATERMARK and garbage frames through the real
frame parser of `wire`; its scheduler enqueues `chunks` per room on one
FIFO worker queue, the worker runs them (`rooms.worker_step`), and a
terminal poll clears the room. The decode side initialises each room
(registration, TransferInfo), can abort it (waiting timeout or cancel,
which sends ABORT), takes the prefill's status messages, and runs the
heartbeat checker when the prefill dies.

Messages in flight form a multiset, so any of them may be delivered next
(reordering is built in). Faults are actions with a shared budget: drop a
message, duplicate a queued work item (stale work), inject a garbage frame,
crash the prefill. The clock passing a timeout is an action too.

`transition` returns, besides the next state, what the step did (`actions`:
messages sent, work queued and run, rooms concluded, threads died), which is
all a timing policy such as the timed simulation needs to learn.

Invariants: P1 success and failure are sticky, P2 no resurrection, P3 the
bootstrap and decode threads survive malformed frames, P5 peer death fails the unfinished rooms
after `max_failures` heartbeats, P7 no field read before assignment.
Liveness (P8 without the clock): every room concludes on both sides.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import NamedTuple

from kvsim.engine.actions import Rules
from kvsim.engine.system import Invariant, Sometimes

from . import rooms as R
from .symmetry import room_symmetry
from ..pd_common.status import KVPoll
from ..pd_common.rooms import Rooms, put
from .actions import (DECODE, PREFILL, Abort, BootstrapTimeout, Clear, Concluded, CrashPrefill,
                      DecodeAbort, DecodeInit, DeliverDecode, DeliverPrefill, Drop, Duplicate, DuplicateWork,
                      Enqueue, GarbageFrame, HeartbeatMiss, Init, InjectGarbage, PrefillConcluded, PrefillDied,
                      Queued, Reg, Sent, Status, SuccessFailed, ThreadDied, ThreadStarted, Tinfo, Watermark, Work,
                      WorkItem, Worked)
from .config import UNBOUNDED, ProtocolConfig
from .variants import FIXED, ProtocolVariant
from .wire import encode_abort, encode_status, handle_bootstrap, read_status, status_after

ALIVE, UNSTARTED = "alive", "unstarted"
BOOTSTRAP = "bootstrap"  # the prefill's bootstrap thread (the decode thread is DECODE)
_LIVE_STATUSES = (KVPoll.WaitingForInput, KVPoll.Transferring)


class ProtoState(NamedTuple):
    init_pc: int
    thread: str  # "unstarted", "alive", or why it died
    dead_kind: str  # "", "malformed" or "uninitialised"
    # per room: a tuple up to `Rooms.B` rooms (explore, Hypothesis), a `Rooms` tree past that (the timed
    # simulation), so a step replaces one room in O(log rooms) instead of copying every room
    prefill: tuple[R.PrefillRoom, ...] | Rooms
    queue: tuple[WorkItem, ...]  # FIFO
    sent: tuple[int, ...] | Rooms  # chunks enqueued per room
    decode: tuple[KVPoll, ...] | Rooms
    registered: bool
    to_prefill: tuple[tuple, ...]  # sorted multiset of messages in flight
    to_decode: tuple[tuple, ...]
    peer_dead: bool
    hb_fail: int
    faults_left: int  # UNBOUNDED (-1): no budget
    decode_thread: str = ALIVE


def _add(bag: tuple[tuple, ...], *messages: tuple) -> tuple[tuple, ...]:
    """The sorted bag with `messages` in it: each found by bisection, not by sorting the whole bag again."""
    if not bag and len(messages) == 1:
        return messages
    items = list(bag)
    for m in messages:
        insort(items, m)
    return tuple(items)


def _remove(bag: tuple[tuple, ...], message: tuple) -> tuple[tuple, ...]:
    i = bisect_left(bag, message)
    if i == len(bag) or bag[i] != message:
        raise ValueError(f"{message!r} is not in flight")
    return bag[:i] + bag[i + 1:]


def _holds(bag: tuple[tuple, ...], message: tuple) -> bool:
    i = bisect_left(bag, message)
    return i < len(bag) and bag[i] == message


class PdProtocol:
    liveness = "every_room_concludes"

    def __init__(self, config: ProtocolConfig, variant: ProtocolVariant = FIXED) -> None:
        self.name, self.variant, self.config = "pd-protocol", variant, config
        self.backend = config.backend
        self.init = R.init_sequence(self.backend, variant)
        self.heartbeat = R.has_heartbeat_checker(self.backend, variant)
        self.fields_read_by = {kind: R.fields_read(self.backend, kind) for kind in ("REG", "TINFO", "WATERMARK")}
        # the rooms are interchangeable (`symmetry`): explore stores one representative per orbit
        self.canonical = room_symmetry(config.rooms)
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
        # P1, P2 and P5 speak of rooms that succeed, fail and are cleared: some path must make each
        self.sometimes = (
            Sometimes("a_room_succeeds", lambda s: any(d == KVPoll.Success for d in s.decode),
                      "a decode room reports Success"),
            Sometimes("a_room_fails", lambda s: any(p.failed for p in s.prefill), "a prefill room turns Failed"),
            Sometimes("a_room_is_cleared", lambda s: any(p.cleared for p in s.prefill), "clear() drops a room"),
        )

    # -- contract -----------------------------------------------------------------------------
    def initial_states(self) -> tuple[ProtoState, ...]:
        n = self.config.rooms
        return (ProtoState(0, UNSTARTED, "", Rooms.of((R.NEW_PREFILL_ROOM,) * n), (), Rooms.of((0,) * n),
                           Rooms.of((KVPoll.Bootstrapping,) * n), False, (), (), False, 0, self.config.faults),)

    def done(self, s: ProtoState) -> bool:
        decode_done = all(d in R.TERMINAL for d in s.decode)
        prefill_done = s.peer_dead or all(p.status is None for p in s.prefill)
        return decode_done and prefill_done

    # what enables an action is written once, beside its effect (`RULES` below): `enabled` lists the
    # explorer's actions in its order from the same conditions, and `allows` (one action, in O(1) rooms:
    # what a timing policy asks before it acts) reads the rule of the action's record type
    def _can_init(self, s: ProtoState) -> bool:
        return not s.peer_dead and s.init_pc < len(self.init)

    @staticmethod
    def _prefill_reads(s: ProtoState) -> bool:
        return not s.peer_dead and s.thread == ALIVE

    def _can_enqueue(self, s: ProtoState, r: int) -> bool:
        return not s.peer_dead and s.prefill[r].status in _LIVE_STATUSES and s.sent[r] < self.config.chunks

    @staticmethod
    def _can_clear(s: ProtoState, r: int) -> bool:
        return not s.peer_dead and s.prefill[r].status in R.TERMINAL

    @staticmethod
    def _can_time_out(s: ProtoState, r: int) -> bool:
        return not s.peer_dead and s.prefill[r].status == KVPoll.Bootstrapping

    @staticmethod
    def _can_work(s: ProtoState) -> bool:
        return not s.peer_dead and bool(s.queue)

    @staticmethod
    def _can_decode_init(s: ProtoState, r: int) -> bool:
        return s.decode[r] == KVPoll.Bootstrapping

    @staticmethod
    def _can_decode_abort(s: ProtoState, r: int) -> bool:
        return s.decode[r] == KVPoll.WaitingForInput

    def _can_miss_heartbeat(self, s: ProtoState) -> bool:
        return s.peer_dead and s.hb_fail < self.config.max_failures

    def enabled(self, s: ProtoState) -> list[tuple]:
        acts: list[tuple] = []
        rooms = range(self.config.rooms)
        if self._can_init(s):
            acts.append(Init(self.init[s.init_pc]))
        if self._prefill_reads(s):
            acts += [DeliverPrefill(m) for m in dict.fromkeys(s.to_prefill)]
        if not s.peer_dead:  # every prefill room action needs a live prefill: skip the rooms at once
            for r in rooms:
                if self._can_enqueue(s, r):
                    acts.append(Enqueue(r))
                if self._can_clear(s, r):
                    acts.append(Clear(r))
                if self._can_time_out(s, r):
                    acts.append(BootstrapTimeout(r))
        if self._can_work(s):
            acts.append(Work())
        if s.decode_thread == ALIVE:
            acts += [DeliverDecode(m) for m in dict.fromkeys(s.to_decode)]
        for r in rooms:
            if self._can_decode_init(s, r):
                acts.append(DecodeInit(r))
            if self._can_decode_abort(s, r):
                acts.append(DecodeAbort(r))
        if self._can_miss_heartbeat(s):
            acts.append(HeartbeatMiss())
        if s.faults_left:
            acts += [Drop(PREFILL, m) for m in dict.fromkeys(s.to_prefill)]
            acts += [Drop(DECODE, m) for m in dict.fromkeys(s.to_decode)]
            acts += [Duplicate(PREFILL, m) for m in dict.fromkeys(s.to_prefill)]
            acts += [Duplicate(DECODE, m) for m in dict.fromkeys(s.to_decode)]
            acts += [DuplicateWork(i) for i in range(len(s.queue))]
            acts.append(InjectGarbage(DECODE))
            if not s.peer_dead:
                acts += [InjectGarbage(PREFILL), CrashPrefill()]
        return acts

    def allows(self, s: ProtoState, a: tuple) -> bool:
        """`a in self.enabled(s)`, without listing every room's actions."""
        return RULES.allows(self, s, a)

    def step(self, s: ProtoState, a: tuple) -> ProtoState:
        return self.transition(s, a)[0]

    def transition(self, s: ProtoState, a: tuple) -> tuple[ProtoState, tuple[tuple, ...]]:
        """`step`, and what it did: messages sent, work queued and run, rooms concluded, threads died.

        Each step (the rule of the action's record type, `RULES`) writes the fields it changes into `ch`
        and the state is rebuilt once, at the end.
        """
        effect, a = RULES.effect(a)
        fx: list[tuple] = []
        ch: dict[str, object] = {}
        effect(self, s, a, ch, fx)
        return s._replace(**ch), tuple(fx)

    # -- prefill ------------------------------------------------------------------------------
    def _on_prefill_message(self, s: ProtoState, m: tuple, ch: dict, fx: list) -> None:
        kind = m[0]
        if self.fields_read_by.get(kind):
            assigned = self.init[: s.init_pc]
            missing = [f for f in self.fields_read_by[kind] if f not in assigned]
            if missing:  # AttributeError in a thread without try: it dies for good
                why = f"AttributeError: {missing[0]} read before assignment ({kind})"
                fx.append(ThreadDied(BOOTSTRAP, why))
                ch["thread"], ch["dead_kind"] = why, "uninitialised"
                return
        if kind == "TINFO":
            self._set_prefill(s, m[1], R.on_transfer_info(s.prefill[m[1]], self.backend, self.variant), ch, fx)
        elif kind == "ABORT":
            r = m[1]
            room = s.prefill[r]
            present = {r: room.status} if room.status is not None else {}
            after = handle_bootstrap(encode_abort(r), present, self.backend, self.variant).rooms.get(r)
            self._set_prefill(s, r, room._replace(status=after), ch, fx)
        elif kind == "GARBAGE":
            handled = handle_bootstrap((), {}, self.backend, self.variant)
            if not handled.alive:
                why = f"died on a malformed frame: {handled.reason}"
                fx.append(ThreadDied(BOOTSTRAP, why))
                ch["thread"], ch["dead_kind"] = why, "malformed"
        # registration and watermark change no room

    def _work(self, s: ProtoState, ch: dict, fx: list) -> None:
        (r, chunk), ch["queue"] = s.queue[0], s.queue[1:]
        room, outcome = R.worker_step(s.prefill[r], chunk == self.config.chunks - 1, self.backend, self.variant)
        fx.append(Worked(r, chunk, outcome))
        self._set_prefill(s, r, room, ch, fx)
        if outcome == "completed":
            self._send(s, DECODE, ch, fx, Status(r, int(KVPoll.Success)))

    # -- decode -------------------------------------------------------------------------------
    def _decode_init(self, s: ProtoState, r: int, ch: dict, fx: list) -> None:
        new: list[tuple] = []
        if not s.registered:
            new.append(Reg())
            if self.config.staging:
                new.append(Watermark())
            ch["registered"] = True
        new.append(Tinfo(r))
        self._set_decode(s, r, KVPoll.WaitingForInput, "", ch, fx)
        self._send(s, PREFILL, ch, fx, *new)

    def _on_decode_message(self, s: ProtoState, m: tuple, ch: dict, fx: list) -> None:
        frames = () if m[0] == "GARBAGE" else encode_status(self.backend, m[1], KVPoll(m[2]))
        read = read_status(frames, self.backend, self.variant)
        if not read.alive:
            why = f"died on a malformed frame: {read.reason}"
            fx.append(ThreadDied(DECODE, why))
            ch["decode_thread"] = why
            return
        if read.message is None:
            return  # rejected and dropped
        r = read.message.room
        after = status_after(read.message, s.decode[r], self.backend, self.variant)
        if after is not None:  # None: a concluded receiver drops late news
            self._set_decode(s, r, after, "prefill status", ch, fx)

    # -- helpers and invariants ----------------------------------------------------------------
    # Each writes the fields it changes into `ch`; a step changes a room, or a bag, at most once, so they
    # read the state before the step (`s`), except `_send`, which adds to what the step left in flight.
    @staticmethod
    def _send(s: ProtoState, to: str, ch: dict, fx: list, *messages: tuple) -> None:
        fx += [Sent(to, m) for m in messages]
        side = "to_prefill" if to == PREFILL else "to_decode"
        ch[side] = _add(ch[side] if side in ch else getattr(s, side), *messages)

    @staticmethod
    def _set_prefill(s: ProtoState, r: int, room: R.PrefillRoom, ch: dict, fx: list) -> None:
        before = s.prefill[r]
        if room.status in R.TERMINAL and room.status != before.status:
            fx.append(PrefillConcluded(r, room.status))
            if room.status == KVPoll.Failed and before.succeeded:
                fx.append(SuccessFailed(r))
        ch["prefill"] = put(s.prefill, r, R.note_failure(room))

    @staticmethod
    def _set_decode(s: ProtoState, r: int, status: KVPoll, why: str, ch: dict, fx: list) -> None:
        if status in R.TERMINAL and s.decode[r] not in R.TERMINAL:
            fx.append(Concluded(r, status, why))
        ch["decode"] = put(s.decode, r, status)

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


# -- the rules: each action's precondition beside its effect, by record type --------------------------------
# An effect is `effect(system, state, action, ch, fx)`: it writes the fields it changes into `ch` and what it
# did into `fx` (`PdProtocol.transition`); a precondition is `when(system, state, action)`.
RULES = Rules()


@RULES.rule(Work, when=lambda self, s, a: self._can_work(s))
def _work(self: PdProtocol, s: ProtoState, a: tuple, ch: dict, fx: list) -> None:
    self._work(s, ch, fx)


@RULES.rule(Enqueue, when=lambda self, s, a: self._can_enqueue(s, a.room))
def _enqueue(self: PdProtocol, s: ProtoState, a: Enqueue, ch: dict, fx: list) -> None:
    r = a.room
    chunk = s.sent[r]
    fx.append(Queued(r, chunk))
    ch["queue"], ch["sent"] = s.queue + (WorkItem(r, chunk),), put(s.sent, r, chunk + 1)


@RULES.rule(DeliverPrefill, when=lambda self, s, a: self._prefill_reads(s) and _holds(s.to_prefill, a.message))
def _deliver_prefill(self: PdProtocol, s: ProtoState, a: DeliverPrefill, ch: dict, fx: list) -> None:
    ch["to_prefill"] = _remove(s.to_prefill, a.message)
    self._on_prefill_message(s, a.message, ch, fx)


@RULES.rule(DeliverDecode, when=lambda self, s, a: s.decode_thread == ALIVE and _holds(s.to_decode, a.message))
def _deliver_decode(self: PdProtocol, s: ProtoState, a: DeliverDecode, ch: dict, fx: list) -> None:
    ch["to_decode"] = _remove(s.to_decode, a.message)
    self._on_decode_message(s, a.message, ch, fx)


@RULES.rule(Clear, when=lambda self, s, a: self._can_clear(s, a.room))
def _clear(self: PdProtocol, s: ProtoState, a: Clear, ch: dict, fx: list) -> None:
    self._set_prefill(s, a.room, R.clear(s.prefill[a.room]), ch, fx)


@RULES.rule(DecodeInit, when=lambda self, s, a: self._can_decode_init(s, a.room))
def _decode_init(self: PdProtocol, s: ProtoState, a: DecodeInit, ch: dict, fx: list) -> None:
    self._decode_init(s, a.room, ch, fx)


@RULES.rule(Init, when=lambda self, s, a: self._can_init(s) and a.step == self.init[s.init_pc])
def _init(self: PdProtocol, s: ProtoState, a: Init, ch: dict, fx: list) -> None:
    if a.step == R.START_THREAD:
        fx.append(ThreadStarted(BOOTSTRAP))
        ch["thread"] = ALIVE
    ch["init_pc"] = s.init_pc + 1


@RULES.rule(BootstrapTimeout, when=lambda self, s, a: self._can_time_out(s, a.room))
def _bootstrap_timeout(self: PdProtocol, s: ProtoState, a: BootstrapTimeout, ch: dict, fx: list) -> None:
    r = a.room
    self._set_prefill(s, r, R.bootstrap_timeout(s.prefill[r], self.backend, self.variant), ch, fx)
    self._send(s, DECODE, ch, fx, Status(r, int(KVPoll.Failed)))


@RULES.rule(DecodeAbort, when=lambda self, s, a: self._can_decode_abort(s, a.room))
def _decode_abort(self: PdProtocol, s: ProtoState, a: DecodeAbort, ch: dict, fx: list) -> None:
    r = a.room
    self._set_decode(s, r, KVPoll.Failed, "waiting timeout", ch, fx)
    self._send(s, PREFILL, ch, fx, Abort(r))


@RULES.rule(HeartbeatMiss, when=lambda self, s, a: self._can_miss_heartbeat(s))
def _heartbeat_miss(self: PdProtocol, s: ProtoState, a: HeartbeatMiss, ch: dict, fx: list) -> None:
    ch["hb_fail"] = hb_fail = s.hb_fail + 1
    if hb_fail == self.config.max_failures and self.heartbeat:
        after = R.handle_node_failure(s.decode)
        fx += [Concluded(r, new, "peer death (heartbeat)")
               for r, (old, new) in enumerate(zip(s.decode, after)) if old != new]
        ch["decode"] = Rooms.of(after)


# -- faults: each takes one unit of the budget ---------------------------------------------------------------
def _spend(s: ProtoState, ch: dict) -> None:
    ch["faults_left"] = s.faults_left if s.faults_left == UNBOUNDED else s.faults_left - 1


def _bag(a: tuple) -> str:
    return "to_prefill" if a.side == PREFILL else "to_decode"


@RULES.rule(Drop, when=lambda self, s, a: bool(s.faults_left) and _holds(getattr(s, _bag(a)), a.message))
def _drop(self: PdProtocol, s: ProtoState, a: Drop, ch: dict, fx: list) -> None:
    _spend(s, ch)
    ch[_bag(a)] = _remove(getattr(s, _bag(a)), a.message)


@RULES.rule(Duplicate, when=lambda self, s, a: bool(s.faults_left) and _holds(getattr(s, _bag(a)), a.message))
def _duplicate(self: PdProtocol, s: ProtoState, a: Duplicate, ch: dict, fx: list) -> None:
    _spend(s, ch)
    ch[_bag(a)] = _add(getattr(s, _bag(a)), a.message)


@RULES.rule(DuplicateWork, when=lambda self, s, a: bool(s.faults_left) and 0 <= a.index < len(s.queue))
def _duplicate_work(self: PdProtocol, s: ProtoState, a: DuplicateWork, ch: dict, fx: list) -> None:
    _spend(s, ch)
    item = s.queue[a.index]
    fx.append(Queued(item.room, item.chunk))
    ch["queue"] = s.queue + (item,)


@RULES.rule(InjectGarbage, when=lambda self, s, a: bool(s.faults_left) and (a.side == DECODE or not s.peer_dead))
def _inject_garbage(self: PdProtocol, s: ProtoState, a: InjectGarbage, ch: dict, fx: list) -> None:
    _spend(s, ch)
    ch[_bag(a)] = _add(getattr(s, _bag(a)), GarbageFrame())


@RULES.rule(CrashPrefill, when=lambda self, s, a: bool(s.faults_left) and not s.peer_dead)
def _crash_prefill(self: PdProtocol, s: ProtoState, a: CrashPrefill, ch: dict, fx: list) -> None:
    _spend(s, ch)
    fx.append(PrefillDied())
    ch["peer_dead"], ch["to_prefill"], ch["queue"] = True, (), ()
