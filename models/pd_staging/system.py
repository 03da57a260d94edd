"""The PD staging transfer as a transition system (SGLang 05c7ebf, PR #30545), Mooncake flavour.

Research note ../shared/research/sglang.md, sections 1 and 2 (2.4 state
machines, 2.5 pre-fix behaviour, 2.7 faults). Upstream files: the Mooncake
prefill manager's transfer worker and `sender.poll()` (`mooncake/conn.py`),
the decode `DecodeStagingHandler` (`advance_scatter`,
`poll_and_all_reduce_with_staging`, `register_decode_req`,
`unregister_decode_req`), and the `StagingAllocator` ring, all under
`python/sglang/srt/disaggregation/`.

One decode rank; W prefill writer ranks (W = P_tp / D_tp), each with its own
FIFO transfer queue, per-room status, `_staging_outstanding` count, learned
slot offsets (`STAGING_RSP`) and remote watermark. The scheduler's prefill
batches run the step-1 send planner (`plan.send_batch`) and
enqueue the same chunks on every writer; the first batch prefetches every
slot with `STAGING_REQ`. The decode allocates slots on the ring, fans in
`CHUNK_READY` per slot, scatters at absolute rows, completes scatters as
events (freeing the slot and broadcasting `WATERMARK`), and concludes.
Messages travel on FIFO channels, one per writer and direction (a ZMQ
PUSH->PULL pair keeps order); a message overtaking the ones before it
(delay, reorder), a drop and a duplicate are faults, actions with a shared
budget (see `data.FAULT_KINDS`), as are a decode abort and the
prefill node's death. The clock passing a timeout is an action too.
KV bytes are tracked cell by cell (`data`), so the invariants
(`checks`) look at data.

Variants differ only where 05c7ebf changed code (`variants.StagingVariant`):
the send planner, the scatter row offset, the prefix check and the write gate
(step-1 functions taking the variant), plus, here: the last chunk
(`CHUNK_READY` vs the blind tail scatter of the last allocated slot on
Success), the outstanding count in the worker, teardown and poll, and the
staging completion deadline. After 05c7ebf: the ring's fresh round when a free
empties it (#37166, `fresh_round_when_empty`, read in `ring.StagingAllocator.free`);
the deferred decode KV release (#35049/#35360, `deferred_decode_kv_release`,
read in `_conclude`; the prefill's ABORT_ACK once a room drained, `_maybe_ack`);
PP prefill writers (`pp_prefill_writers`: STAGING_RSP to the requester's stage
only, read in `_on_decode`). In every release: the transfer worker's whole-chunk
re-enqueue when a sibling destination defers (`whole_chunk_reenqueue`, read in
`_work`; the `defer_dst` action, with `dsts >= 2`).

This module holds the contract (initial states, enabled actions, steps) and the
state helpers; the prefill side's steps are `prefill.PrefillSide`, the decode
side's `decode.DecodeSide`.

`transition(state, action)` returns the step's effects (`actions`: messages
sent, chunks enqueued or deferred, polls turned terminal, scatters submitted,
deadlines armed, rooms concluded), which is all a timing policy needs to know.
"""

from __future__ import annotations

from functools import cached_property

from kvsim.engine.actions import Rules
from kvsim.engine.system import Invariant, Sometimes

from . import checks
from . import data
from ..pd_common.rooms import Rooms, put
from ..pd_common.status import FAILED, SUCCESS, KVPoll
from .actions import (DOWN, UP, Batch, Clear, Deadline, DeferDst, Deliver, Drop, Duplicate, HeartbeatFailure,
                      PeerDeath, PollTerminal, ReleaseTimeout, Reorder, ScatterDone, Sent, WaitingTimeout, Work)
from .actions import Abort as AbortAction
from .decode import DecodeSide
from .plan import staging_prefix_accepted
from .prefill import PrefillSide
from .ring import StagingAllocator, is_watermark_ready
from .symmetry import RoomSymmetry, room_symmetry
from .state import (ALLOC_OVERSIZED, NOT_ALLOCATED, TERMINAL, DecodeRoom, PrefillRoom, StagingState, remove,
                    set_chans, set_decode, set_prefill)
from .variants import FIXED, StagingVariant

Effects = list  # what a step did, collected as it goes (see `actions`)


class PdStaging(PrefillSide, DecodeSide):
    liveness = "every_room_concludes"

    def __init__(self, variant: StagingVariant = FIXED,
                 config: data.StagingSystemConfig = data.StagingSystemConfig()) -> None:
        self.name, self.variant, self.cfg = "pd-staging", variant, config
        self.groups = tuple(g for g in data.send_groups(config, variant) if g)
        self.slot_pages = config.slot_pages
        self.k = len(self.slot_pages)
        self.stage_writers = data.writers_are_stages(config, variant, check=False)  # PP stages write (0.5.23)
        # the deferred decode KV release: the release's mechanism and its environment switch
        self.deferred_release = variant.deferred_decode_kv_release and config.deferred_release
        self.invariants: tuple[Invariant, ...] = checks.invariants(self)
        self.sometimes: tuple[Sometimes, ...] = checks.reachable()

    # -- contract -----------------------------------------------------------------------------
    def initial_states(self) -> tuple[StagingState, ...]:
        c, n, w, k = self.cfg, self.cfg.rooms, self.cfg.writers, self.k
        data.writers_are_stages(c, self.variant)  # W >= 2 with dsts >= 2 needs PP prefill writers
        accepted = staging_prefix_accepted(c.decode_prefix_len, c.page_size, self.variant)
        proom = PrefillRoom(KVPoll.WaitingForInput, 0, True, (None,) * k, None)
        droom = DecodeRoom(KVPoll.WaitingForInput, True, (NOT_ALLOCATED,) * k, ((),) * k, (), (False,) * w,
                           False, data.blank_rows(data.own_rows(c) * w))
        ring = StagingAllocator(c.total_units)
        memory = (data.GARBAGE,) * (ring.total * c.page_size)
        per_room = Rooms.of  # past 32 rooms (the timed simulation) a tree a step updates without copying every room
        s = StagingState(per_room((0,) * n), (per_room((proom,) * n),) * w, ((),) * w, ((0, 0),) * w,
                         per_room((droom,) * n), ring, memory, (), data.initial_prefix(c), (((),) * w,) * 2, False,
                         c.fault_budget, ())
        if not accepted:  # register_decode_req: _staging_failed, so Failed on the first poll
            for r in range(n):
                s = self._conclude(s, r, KVPoll.Failed, [])
        return (s,)

    # -- symmetry: interchangeable rooms, a dead prefill's quotient (`symmetry`; explore reduces by them) --
    @cached_property
    def symmetry(self) -> RoomSymmetry | None:
        return room_symmetry(self)

    @property
    def canonical(self):  # one representative per orbit, or None where the rooms are not interchangeable
        return None if self.symmetry is None else self.symmetry.canonical

    def done(self, s: StagingState) -> bool:
        if any(d.status not in TERMINAL for d in s.decode):
            return False
        return s.dead or (all(p.status is None for rooms in s.prefill for p in rooms) and not any(s.queues))

    def _faults(self, s: StagingState) -> tuple[str, ...]:
        return self.cfg.fault_kinds if s.faults_left else ()

    def batch_enabled(self, s: StagingState, r: int) -> bool:
        """The scheduler may run room r's next prefill batch (every writer still holds the room)."""
        return not s.dead and s.batches[r] < len(self.groups) and all(p[r].status is not None for p in s.prefill)

    def work_enabled(self, s: StagingState, w: int) -> bool:
        """Writer w's transfer worker has a chunk to dequeue."""
        return not s.dead and bool(s.queues[w])

    def deliverable(self, s: StagingState, side: int, w: int, m: tuple) -> bool:
        """`m` may arrive now: the channel's head, or (timed network) any message in flight."""
        if side == DOWN and s.dead:
            return False  # nobody left to receive decode's messages
        chan = s.chans[side][w]
        return bool(chan) and (chan[0] == m or (self.cfg.timed and m in chan))

    def poll_concludes(self, p: PrefillRoom) -> bool:
        """`sender.poll()` is terminal; 05c7ebf reports Transferring while chunks are outstanding."""
        if p.status == FAILED:
            return True
        return p.status == SUCCESS and (not self.variant.staging_outstanding or p.outstanding <= 0)

    def defers(self, s: StagingState, w: int) -> bool:
        """The transfer worker's next dequeue re-enqueues writer w's head chunk: no offset yet, or not ready."""
        chunk = s.queues[w][0]
        p = s.prefill[w][chunk.room]
        if p.status is None or p.status == FAILED or not p.infos:
            return False  # skipped or dropped, not deferred
        if chunk.dst_done:
            return False  # (proposed fix) this destination was written on an earlier pass
        off = p.offsets[chunk.chunk_idx] if chunk.chunk_idx < self.k else None
        return off is None or (off.alloc_id != ALLOC_OVERSIZED
                               and not is_watermark_ready(off.round, off.end, s.watermarks[w]))

    def room_actions(self, s: StagingState, r: int, faults: tuple[str, ...] = ()) -> list[tuple]:
        """The decode room's own actions: scatter completions, its timers, an abort."""
        d, c = s.decode[r], self.cfg
        if d.held and ("release_timeout" in faults or c.timed):
            return [ReleaseTimeout(r)]  # the deferred release's deadline passes without every ABORT_ACK
        if d.status in TERMINAL:
            return []
        acts: list[tuple] = [ScatterDone(r, aid) for aid in d.events]
        if d.all_success and self.variant.completion_deadline and c.timeouts:
            acts.append(Deadline(r))  # the clock passes completion_timeout after Success
        if not d.all_success and c.timeouts:
            acts.append(WaitingTimeout(r))
        if "abort" in faults:
            acts.append(AbortAction(r))
        return acts

    def defer_dst_enabled(self, s: StagingState, w: int) -> bool:
        """A sibling destination of writer w's head chunk may defer after this decode rank was written."""
        if self.cfg.dsts < 2 or not self.work_enabled(s, w) or self.defers(s, w):
            return False
        chunk = s.queues[w][0]
        p = s.prefill[w][chunk.room]
        return p.status is not None and p.status != KVPoll.Failed and p.infos and not chunk.dst_done

    def enabled(self, s: StagingState) -> list[tuple]:
        c, acts = self.cfg, []
        faults = self._faults(s)
        if not s.dead:
            for r in range(c.rooms):
                if self.batch_enabled(s, r):
                    acts.append(Batch(r))
            for w in range(c.writers):
                if self.work_enabled(s, w):
                    acts.append(Work(w))
                    if "defer_dst" in faults and self.defer_dst_enabled(s, w):
                        acts.append(DeferDst(w))
                for r, p in enumerate(s.prefill[w]):
                    if self.poll_concludes(p):
                        acts.append(Clear(w, r))
        for side in (UP, DOWN):
            if side == DOWN and s.dead:
                continue  # nobody left to receive decode's messages
            for w, chan in enumerate(s.chans[side]):
                if not chan:
                    continue
                if c.timed:  # the timed network: whatever is in flight may arrive next
                    acts += [Deliver(side, w, m) for m in dict.fromkeys(chan)]
                    continue
                acts.append(Deliver(side, w, chan[0]))
                if "reorder" in faults:  # a later message overtakes the head (delay of the head)
                    acts += [Reorder(side, w, m) for m in dict.fromkeys(chan[1:]) if m != chan[0]]
        for r in range(len(s.decode)):
            acts += self.room_actions(s, r, faults)
        if s.dead and any(d.status not in TERMINAL and not d.all_success for d in s.decode):
            acts.append(HeartbeatFailure())
        for side in (UP, DOWN):
            for w, chan in enumerate(s.chans[side]):
                for m in dict.fromkeys(chan):
                    if c.timed or f"drop_{m[0].lower()}" in faults:
                        acts.append(Drop(side, w, m))
                    if c.timed or f"dup_{m[0].lower()}" in faults:
                        acts.append(Duplicate(side, w, m))
        if (c.timed or "peer_death" in faults) and not s.dead:
            acts.append(PeerDeath())
        return acts

    def is_enabled(self, s: StagingState, a: tuple) -> bool:
        """`a in enabled(s)`, answered from the rule of `a`'s record type (`RULES`)."""
        return RULES.allows(self, s, a)

    def step(self, s: StagingState, a: tuple) -> StagingState:
        return self.transition(s, a)[0]

    def transition(self, s: StagingState, a: tuple) -> tuple[StagingState, tuple[tuple, ...]]:
        """`step`, and what it did (`actions`: Sent, Enqueued, Deferred, PollTerminal, ScatterSubmitted, ...)."""
        effect = _EFFECTS.get(type(a))  # the typed record's rule, read here: a timed simulation steps per event
        if effect is None:
            effect, a = RULES.effect(a)
        fx: Effects = []
        return effect(self, s, a, fx), tuple(fx)

    # -- helpers -------------------------------------------------------------------------------
    def _send(self, s: StagingState, side: int, w: int, fx: Effects, *messages: tuple) -> StagingState:
        if side == UP and s.dead:
            return s  # a dead prefill sends nothing
        for m in messages:
            fx.append(Sent._new(side, w, m))
        return self._set_chan(s, side, w, s.chans[side][w] + messages)

    def _send_each(self, s: StagingState, side: int, fx: Effects, sends: list[tuple[int, tuple]]) -> StagingState:
        """`_send` of each (writer, message) in turn, the state rebuilt once (a reply to every writer)."""
        if side == UP and s.dead or not sends:
            return s  # a dead prefill sends nothing
        chans = list(s.chans)
        row = list(chans[side])
        for w, m in sends:
            fx.append(Sent._new(side, w, m))
            row[w] += (m,)
        chans[side] = tuple(row)
        return set_chans(s, tuple(chans))

    def _take(self, s: StagingState, side: int, w: int, m: tuple) -> StagingState:
        """`s` with the first `m` of channel [side][w] taken out (a delivery: mostly the channel's head)."""
        return self._set_chan(s, side, w, remove(s.chans[side][w], m))

    @staticmethod
    def _set_chan(s: StagingState, side: int, w: int, chan: tuple) -> StagingState:
        """`s` with channel [side][w] replaced: `s._replace(chans=put(s.chans, side, put(s.chans[side], w, chan)))`
        in one frame (the channels are plain tuples; every delivery and send sets one)."""
        chans = list(s.chans)
        row = list(chans[side])
        row[w] = chan
        chans[side] = tuple(row)
        return set_chans(s, tuple(chans))

    def _set_prefill(self, s: StagingState, w: int, r: int, p: PrefillRoom, fx: Effects) -> StagingState:
        rooms = s.prefill[w]
        new = put(rooms, r, p)
        if new is rooms:
            return s  # the room as it was: the state as it was
        if self.poll_concludes(p):
            fx.append(PollTerminal(w, r))
        writers = list(s.prefill)  # `s._replace(prefill=put(s.prefill, w, new))`, the outer level here
        writers[w] = new
        return set_prefill(s, tuple(writers))

    @staticmethod
    def _set_decode(s: StagingState, r: int, d: DecodeRoom) -> StagingState:
        return set_decode(s, put(s.decode, r, d))


# -- the rules: each action's precondition beside its effect, by record type --------------------------------
# An effect is `effect(system, state, action, fx) -> state`, appending what it did to `fx`; a precondition is
# `when(system, state, action)`. An action whose condition only `enabled` states (a fault, a clear) is enabled
# when `enabled` lists it.
RULES = Rules()
_EFFECTS = RULES.effects  # `transition` reads a typed record's effect here


def _listed(self: PdStaging, s: StagingState, a: tuple) -> bool:
    return a in self.enabled(s)


def _room_action(self: PdStaging, s: StagingState, a: tuple) -> bool:
    return a in self.room_actions(s, a.room)


def _spend(self: PdStaging, s: StagingState) -> StagingState:
    """A fault spends the path's budget (the timed network's fault plan has none)."""
    return s if self.cfg.timed else s._replace(faults_left=s.faults_left - 1)


@RULES.rule(Batch, when=lambda self, s, a: self.batch_enabled(s, a.room))
def _batch(self: PdStaging, s: StagingState, a: Batch, fx: Effects) -> StagingState:
    return self._batch(s, a.room, fx)


@RULES.rule(Work, when=lambda self, s, a: self.work_enabled(s, a.writer))
def _work(self: PdStaging, s: StagingState, a: Work, fx: Effects) -> StagingState:
    return self._work(s, a.writer, fx)


@RULES.rule(Clear, when=_listed)
def _clear(self: PdStaging, s: StagingState, a: Clear, fx: Effects) -> StagingState:
    w, r = a.writer, a.room
    p = s.prefill[w][r]
    # clear() pops request_status and transfer_infos; _staging_outstanding is the worker's to pop
    return self._set_prefill(s, w, r, PrefillRoom(None, p.outstanding, False, (None,) * self.k, p.status, p.ack),
                             fx)


@RULES.rule(Deliver, when=lambda self, s, a: self.deliverable(s, a.side, a.writer, a.msg))
def _receive(self: PdStaging, s: StagingState, a: tuple, fx: Effects) -> StagingState:
    """A delivery (and a reordered one): the message leaves its channel and its receiver handles it."""
    _, side, w, m = a  # a Deliver or a Reorder: (tag, side, writer, msg)
    s = self._take(s, side, w, m)
    return self._on_decode(s, m, fx) if side == UP else self._on_prefill(s, m, fx)


@RULES.rule(ScatterDone, when=_room_action)
def _scatter_done(self: PdStaging, s: StagingState, a: ScatterDone, fx: Effects) -> StagingState:
    return self._scatter_done(s, a.room, a.alloc_id, fx)


@RULES.rule(Deadline, WaitingTimeout, when=_room_action)
def _time_out(self: PdStaging, s: StagingState, a: tuple, fx: Effects) -> StagingState:
    return self._conclude(s, a.room, KVPoll.Failed, fx)


@RULES.rule(HeartbeatFailure, when=_listed)
def _heartbeat_failure(self: PdStaging, s: StagingState, a: HeartbeatFailure, fx: Effects) -> StagingState:
    # _handle_node_failure after HEARTBEAT_MAX_FAILURE missed /health polls (folded into one action):
    # every room not yet at all-ranks Success fails
    for r, d in enumerate(s.decode):
        if d.status not in TERMINAL and not d.all_success:
            s = self._conclude(s, r, KVPoll.Failed, fx)
    return s


# -- faults: each spends the budget first ------------------------------------------------------------------
@RULES.rule(AbortAction, when=_listed)
def _abort(self: PdStaging, s: StagingState, a: AbortAction, fx: Effects) -> StagingState:
    return self._conclude(_spend(self, s), a.room, KVPoll.Failed, fx)


@RULES.rule(DeferDst, when=_listed)
def _defer_dst(self: PdStaging, s: StagingState, a: DeferDst, fx: Effects) -> StagingState:
    return self._work(_spend(self, s), a.writer, fx, sibling_defers=True)


@RULES.rule(ReleaseTimeout, when=_listed)
def _release_timeout(self: PdStaging, s: StagingState, a: ReleaseTimeout, fx: Effects) -> StagingState:
    return self._release(_spend(self, s), a.room, fx)


@RULES.rule(Reorder, when=_listed)
def _reorder(self: PdStaging, s: StagingState, a: Reorder, fx: Effects) -> StagingState:
    return _receive(self, _spend(self, s), a, fx)


@RULES.rule(Drop, when=_listed)
def _drop(self: PdStaging, s: StagingState, a: Drop, fx: Effects) -> StagingState:
    return self._take(_spend(self, s), a.side, a.writer, a.msg)


@RULES.rule(Duplicate, when=_listed)
def _duplicate(self: PdStaging, s: StagingState, a: Duplicate, fx: Effects) -> StagingState:
    s = _spend(self, s)
    chan = s.chans[a.side][a.writer]
    i = chan.index(a.msg)
    return self._set_chan(s, a.side, a.writer, chan[:i + 1] + (a.msg,) + chan[i + 1:])


@RULES.rule(PeerDeath, when=_listed)
def _peer_death(self: PdStaging, s: StagingState, a: PeerDeath, fx: Effects) -> StagingState:
    return _spend(self, s)._replace(dead=True, queues=((),) * self.cfg.writers)

