"""Timed simulation of the PD staging transfer (`kvsim simulate pd-staging`), SGLang 05c7ebf (PR #30545).

Many rooms of one geometry between W prefill writer ranks and one decode
rank, on the seeded discrete-event simulator. The simulation is a timing
policy over the transition system (`system.PdStaging`): every change of the
model state is an action applied through `kvsim.engine.sim.Driver`, and what
an action set in motion (messages sent, chunks enqueued or deferred, polls
turned terminal, scatters submitted, deadlines armed, rooms concluded) comes
back as the step's effects. The simulation only decides *when*:

- rooms arrive as a Poisson process; prefill batch ``i`` of a room runs
  ``(i + 1) * chunk_time`` after its arrival; what the initial state has in
  flight for a room (a registration failure's ABORT to every writer) goes on
  the wire as the room arrives;
- each writer's transfer worker takes ``transfer_time`` per chunk and, for a
  chunk the system says it will defer, waits ``STAGING_WATERMARK_WAIT_S``
  before re-enqueueing it (a worker whose whole queue defers parks until a
  message reaches its rank: virtual time spent spinning is unobservable);
- messages go through `kvsim.engine.sim.Channel` (latency, drop, delay,
  duplicate, reorder); the system runs with its timed network (`timed=True`):
  any message in flight may arrive next, and drops and duplicates are the
  fault plan's; a scatter completes ``scatter_time`` after it is submitted;
- upstream timers: the decode waiting timeout (300 s after arrival, before
  all-ranks Success), the staging completion deadline (300 s after Success,
  armed by the system where the variant has it), heartbeats every 5 s with 2
  misses after a prefill death (`crash=prefill@T`); the scheduler clears a
  prefill room as soon as `sender.poll()` is terminal; where the variant has
  the deferred decode KV release, a failed room's slots are freed on its last
  ABORT_ACK or ``DEFERRED_KV_RELEASE_TIMEOUT`` after it was held.

The summary gives each outcome (Success, or Failed and why), the time to
conclude, rooms that never concluded, leaked staging slots and held prefill
rooms at the end, and the invariants of the system on the final state.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Iterable

from kvsim.engine.actions import decode
from kvsim.engine.params import param
from kvsim.engine.sim import Channel, Driver, FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from . import data, mechanisms
from ..pd_common.status import (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE,
                                SGLANG_DISAGGREGATION_WAITING_TIMEOUT, STAGING_WATERMARK_WAIT_S, KVPoll)
from .actions import (ACTIONS, DOWN, UP, Batch, Clear, Concluded, Deadline, DeadlineArmed, Deliver, Drop, Duplicate,
                      Enqueued, HeartbeatFailure, Held, PeerDeath, PollTerminal, ReleaseTimeout, ScatterDone,
                      ScatterSubmitted, Sent, WaitingTimeout, Work)
from .state import TERMINAL
from .system import PdStaging
from .variants import StagingVariant

FAULT_KINDS = ("drop", "delay", "duplicate", "reorder", "crash")
DEFERRED_KV_RELEASE_TIMEOUT = 30.0  # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (environ.py, 0.5.23)
PEERS = ("prefill",)


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate pd-staging --param`: the workload, the geometry and the timings (one place each)."""

    requests: int = param(200, "rooms in the workload", minimum=1, maximum=100_000)
    arrival_rate: float = param(20.0, "mean room arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    writers: int = param(2, "W = P_tp / D_tp prefill writer ranks", minimum=1, maximum=data.HEAD_SLICES)
    page_size: int = param(4, "tokens per KV page", minimum=1, maximum=64)
    chunked_prefill_size: int = param(8, "prefill batch tokens (the grid is its whole pages)", minimum=1,
                                      maximum=data.TOKENS)
    prompt_len: int = param(30, "L: prompt tokens of every room", minimum=1, maximum=data.MAX_PROMPT_LEN)
    decode_prefix_len: int = param(8, "D: decode radix hit, shared by every room", minimum=0,
                                   maximum=data.MAX_PROMPT_LEN - 1)
    prefill_hit: int = param(0, "prefill radix hit", minimum=0, maximum=data.MAX_PROMPT_LEN - 1)
    ring_units: int = param(64, "staging ring size in pages of one writer's heads", minimum=1, maximum=4096)
    chunk_time: float = param(0.02, "seconds of prefill compute per batch", minimum=0.0, maximum=60.0)
    transfer_time: float = param(0.002, "seconds of one staged RDMA write", minimum=0.0, maximum=60.0)
    scatter_time: float = param(0.001, "seconds from scatter submission to its event", minimum=0.0, maximum=60.0)

    def system_config(self) -> data.StagingSystemConfig:
        return data.StagingSystemConfig(
            rooms=self.requests, writers=self.writers, page_size=self.page_size,
            chunked_prefill_size=self.chunked_prefill_size, prompt_len=self.prompt_len,
            decode_prefix_len=self.decode_prefix_len, prefill_hit=self.prefill_hit, ring_units=self.ring_units,
            faults="", fault_budget=0, timed=True)


def simulate(sim: Simulator, recorder: TraceRecorder, variant: StagingVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    run = _Run(sim, recorder, PdStaging(variant, params.system_config()), params, faults)
    t = sim.poisson_arrivals(params.requests, params.arrival_rate, run.arrive)
    # past this every timer has fired: a room still open then would stay open forever (a hang)
    run.horizon = t + 2 * SGLANG_DISAGGREGATION_WAITING_TIMEOUT + 2 * SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL
    for peer, at in faults.crashes:
        sim.schedule(at, run.crash, peer)
    sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, run.heartbeat)
    sim.run()
    return run.summary(), run.driver


# Trace events that are not the action of the same name: a fault the channel drew and the system applied.
_FAULT_ACTIONS = {"fault_drop": "drop", "fault_duplicate": "duplicate"}


def trace_actions(steps: Iterable[dict[str, Any]]) -> list[tuple]:
    """The actions a recorded run applied, in order, decoded from its trace steps (`kvsim.engine.trace`)."""
    actions = []
    for step in steps:
        event = step["event"]
        tag = _FAULT_ACTIONS.get(event, event)
        if tag in ACTIONS and tag.islower():
            actions.append(decode([tag, *step["data"]], ACTIONS))
    return actions


# The order the decode room's effects are acted on within a room (scatter events before the deadline before
# the conclusion), rooms in increasing order.
_ROOM_EFFECTS = {ScatterSubmitted: 0, DeadlineArmed: 1, Held: 2, Concluded: 3}
# `_follow` sorts a step's effects into (sent, room effects, terminal polls, enqueued batches) by record type
_BUCKETS = {Sent: 0, PollTerminal: 2, Enqueued: 3, **dict.fromkeys(_ROOM_EFFECTS, 1)}


def _room_order(e: tuple) -> tuple[int, int]:
    return e.room, _ROOM_EFFECTS[type(e)]


_channel_of = itemgetter(1, 2)  # a `Sent`'s (side, writer), read in C


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: PdStaging, params: SimConfig,
                 faults: FaultPlan) -> None:
        self.sim, self.rec, self.p, self.system = sim, recorder, params, system
        self.driver = Driver(system)
        w = system.cfg.writers
        self.chans = [[self._channel(side, v, faults) for v in range(w)] for side in (UP, DOWN)]
        self.arrived: dict[int, float] = {}
        self.concluded: dict[int, tuple[float, str]] = {}
        self.busy = [False] * w
        self.parked = [False] * w
        self.defers = [0] * w
        self.misses = 0
        self.crashed_at: float | None = None
        self.why = "?"
        self.horizon = 0.0
        self.evidence = mechanisms.Evidence()
        for r, d in enumerate(self.state.decode):  # registration failures (unaligned prefix) at time 0
            if d.status in TERMINAL:
                self.concluded[r] = (0.0, "Failed: prefix not page-aligned")
        # what the initial state has in flight (a registration failure's ABORT to every writer): a room's messages go
        # on the wire as the room arrives, as upstream's decode registers a request and sends its ABORT then
        self.unsent: dict[int, list[tuple[int, int, tuple]]] = {}
        for side, row in zip((UP, DOWN), self.state.chans):
            for v, messages in enumerate(row):
                for m in messages:
                    self.unsent.setdefault(m.room, []).append((side, v, m))

    @property
    def state(self) -> Any:
        return self.driver.state

    def _channel(self, side: int, w: int, faults: FaultPlan) -> Channel:
        deliverable = self.system.deliverable  # `is_enabled` of a Deliver, asked directly: this runs per message
        driver = self.driver

        def deliver(m: tuple) -> None:
            if deliverable(driver.state, side, w, m):
                self.apply(Deliver._new(side, w, m), "prefill reported Failed" if m[0] == "STATUS" else m[0])
                if side == DOWN and self.parked[w]:
                    self._unpark(w)

        def on_fault(kind: str, m: tuple) -> None:
            self.rec.record(self.sim.now, f"fault_{kind}", [side, w, list(m)])
            self.evidence.fault(kind, m)
            if kind == "drop":
                self.driver.apply(Drop(side, w, m))
            elif kind == "duplicate":
                self.driver.apply(Duplicate(side, w, m))

        return Channel(self.sim, faults, deliver, on_fault=on_fault)

    # -- one action of the transition system, and what it sets in motion ---------------------------
    def apply(self, action: tuple, why: str) -> tuple[tuple, ...]:
        self.why = why
        self.rec.record(self.sim.now, action[0], action[1:])  # the fields, written as the JSON list they are
        driver = self.driver
        flags = driver.state.flags
        effects = driver.apply(action)
        # a transition flag raised: remember the room of the step (a step raising none keeps the very tuple)
        if driver.state.flags is not flags and driver.state.flags != flags:
            room = getattr(action, "room", None)
            room = getattr(getattr(action, "msg", None), "room", None) if room is None else room
            for name, _ in self.driver.state.flags:
                if room is not None:
                    self.evidence.flagged.setdefault(name, room)
        if effects:  # most deliveries set nothing in motion
            self._follow(effects)
        return effects

    def _follow(self, effects: tuple[tuple, ...]) -> None:
        """Act on a step's effects: messages onto their channels, then the rooms' effects, then the clears and
        the workers a batch gave work. No other idle worker is tried: a worker is left idle only with nothing to
        dequeue, and only a step that says so (Enqueued; a worker's own Deferred, which `_work` follows) puts
        a chunk on a queue."""
        if len(effects) == 1:  # a step's one effect, followed here as below (a step sets one thing in motion mostly)
            e = effects[0]
            kind = type(e)
            if kind is Sent:  # a worker's CHUNK_READY, a status, a reply: one message
                _, side, w, m = e
                self.chans[side][w].send(m)
                return
            if kind in _FOLLOW_ROOM:  # a scatter submitted, a deadline armed: the room's effect alone
                _FOLLOW_ROOM[kind](self, e)
                return
            if kind not in _BUCKETS:  # a worker's own Deferred (`_work` follows it): nothing here
                return
        sent = [e for e in effects if type(e) is Sent]
        if len(sent) > 1:
            sent.sort(key=_channel_of)  # channel by channel, in send order (the sort is stable)
        chans = self.chans
        for _, side, w, m in sent:
            chans[side][w].send(m)
        if len(sent) == len(effects):  # only messages sent
            return
        room_effects: list = []
        polls: list = []
        batches: list = []
        buckets = (None, room_effects, polls, batches)
        for e in effects:  # one pass: this runs once per event
            b = _BUCKETS.get(type(e))
            if b:
                buckets[b].append(e)
        if room_effects:
            self._follow_rooms(sorted(room_effects, key=_room_order) if len(room_effects) > 1 else room_effects)
        if not polls and not batches:  # no clear to apply, no worker to unpark
            return
        busy, parked = self.busy, self.parked
        clears = sorted((e.writer, e.room) for e in polls)
        enqueued = {e.writer for e in batches}
        i = 0
        for w in range(len(busy)):
            while i < len(clears) and clears[i][0] == w:
                self.apply(Clear._new(w, clears[i][1]), self.why)  # the scheduler's next poll
                i += 1
            if w in enqueued:
                self._unpark(w)  # a new batch: its chunks may be ready
            if not busy[w] and not parked[w]:
                self._kick(w)

    def _follow_rooms(self, effects: list[tuple]) -> None:
        for e in effects:
            _FOLLOW_ROOM[type(e)](self, e)

    # -- what a room effect sets in motion (`_FOLLOW_ROOM`, by record type) ----------------------------------
    def _on_scatter_submitted(self, e: ScatterSubmitted) -> None:
        self.sim.schedule(self.p.scatter_time, self._scatter_done, e.room, e.alloc_id)

    def _on_deadline_armed(self, e: DeadlineArmed) -> None:
        self.sim.schedule(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, self._timer, Deadline(e.room))

    def _on_held(self, e: Held) -> None:
        self.sim.schedule(DEFERRED_KV_RELEASE_TIMEOUT, self._timer, ReleaseTimeout(e.room))

    def _on_concluded(self, e: Concluded) -> None:
        now = self.sim.now
        why = "Success" if e.status == KVPoll.Success else f"Failed: {self.why}"
        self.concluded[e.room] = (now, why)
        if e.status != KVPoll.Success:
            self.evidence.failed[e.room] = self.why
        self.rec.record(now, "conclude", [e.room, why])

    # -- events ------------------------------------------------------------------------------------
    def arrive(self, r: int) -> None:
        self.arrived[r] = self.sim.now
        if r in self.concluded:  # failed before it arrived (its decode room at registration, or every room at a peer
            self.concluded[r] = (self.sim.now, self.concluded[r][1])  # death): it concludes as it arrives
        self.rec.record(self.sim.now, "arrive", r)
        for side, w, m in self.unsent.pop(r, ()):
            self.chans[side][w].send(m)
        for i in range(len(self.system.groups)):
            self.sim.schedule((i + 1) * self.p.chunk_time, self._batch, r)
        self.sim.schedule(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, self._timer, WaitingTimeout(r))

    def _batch(self, r: int) -> None:
        action = Batch._new(r)
        if self.system.is_enabled(self.driver.state, action):
            self.apply(action, "batch")

    def _kick(self, w: int) -> None:
        state = self.driver.state
        if not self.busy[w] and not self.parked[w] and self.system.work_enabled(state, w):
            self.busy[w] = True
            wait = self.system.defers(state, w)
            self.sim.schedule(STAGING_WATERMARK_WAIT_S if wait else self.p.transfer_time, self._work, w)

    def _work(self, w: int) -> None:
        if not self.system.work_enabled(self.driver.state, w):
            self.busy[w] = False
            return
        effects = self.apply(Work._new(w), "work")  # busy stays set: the step's follow-ups must not start this worker
        self.busy[w] = False
        deferred = False
        for e in effects:
            if e[0] == "deferred":
                deferred = True
                break
        self.defers[w] = self.defers[w] + 1 if deferred else 0
        # every queued chunk waited in turn: sleep until a message reaches this rank or a batch adds work
        self.parked[w] = deferred and self.defers[w] >= len(self.driver.state.queues[w])
        self._kick(w)

    def _unpark(self, w: int) -> None:
        if self.parked[w]:
            self.parked[w] = False
            self.defers[w] = 0
            self._kick(w)

    def _scatter_done(self, r: int, aid: int) -> None:
        action = ScatterDone._new(r, aid)
        if self.system.is_enabled(self.driver.state, action):
            self.apply(action, "scatter")

    def _timer(self, action: tuple) -> None:
        if self.system.is_enabled(self.driver.state, action):
            why = {"deadline": "staging completion deadline", "release_timeout": "deferred release timeout"}.get(
                action[0], "waiting timeout")
            self.apply(action, why)
            if isinstance(action, ReleaseTimeout):
                self.evidence.released_by_timeout.add(action.room)

    def crash(self, peer: str) -> None:
        if self.crashed_at is None and self.system.is_enabled(self.state, PeerDeath()):
            self.crashed_at = self.sim.now
            self.rec.record(self.sim.now, "crash", peer)
            self.apply(PeerDeath(), "peer death")

    def heartbeat(self) -> None:
        if self.crashed_at is not None:
            self.misses += 1
            if self.misses == SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE and \
                    self.system.is_enabled(self.state, HeartbeatFailure()):
                self.apply(HeartbeatFailure(), "peer death (heartbeat)")
        if len(self.concluded) < self.p.requests and self.sim.now < self.horizon:
            self.sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, self.heartbeat)

    # -- the report ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        s, system = self.state, self.system
        outcomes: dict[str, int] = {}
        waits = []
        for r in range(self.p.requests):
            at, why = self.concluded.get(r, (None, "never concluded"))
            outcomes[why] = outcomes.get(why, 0) + 1
            if at is not None and r in self.arrived:  # (a request that has not arrived waits for nothing yet)
                waits.append(at - self.arrived[r])
        held = [] if s.dead else sorted({r for rooms in s.prefill for r, p in enumerate(rooms) if p.status is not None})
        leaked = [aid for aid, _ in s.owners]
        violations = [f"{inv.name}: {msg}" for inv in system.invariants if (msg := inv.check(s)) is not None]
        finished = self.sim.stopped_by is None  # end-of-run checks only when the run was not cut by a budget
        if leaked and finished:
            violations.append(f"leaked staging slots: expected none after every room concluded, got {len(leaked)}")
        if held and finished:
            violations.append(f"prefill rooms never cleared (pages held): expected none, got {len(held)} "
                              f"(first: room {held[0]})")
        return {
            "rooms": self.p.requests,
            "outcomes": dict(sorted(outcomes.items())),
            "mean_time_to_conclude": round(sum(waits) / len(waits), 6) if waits else None,
            "worst_time_to_conclude": round(max(waits), 6) if waits else None,
            "leaked_slots": len(leaked),
            "held_prefill_rooms": len(held),
            "violations": violations,
            "named": mechanisms.named(s, system.cfg, self.evidence, system.deferred_release,
                                      held if finished else []),
        }


_FOLLOW_ROOM = {ScatterSubmitted: _Run._on_scatter_submitted, DeadlineArmed: _Run._on_deadline_armed,
                Held: _Run._on_held, Concluded: _Run._on_concluded}
