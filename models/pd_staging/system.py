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
empties it (#37166, `fresh_round_when_empty`, read in `ring.StagingAllocator.free`).

`transition(state, action)` returns the step's effects (`actions`: messages
sent, chunks enqueued or deferred, polls turned terminal, scatters submitted,
deadlines armed, rooms concluded), which is all a timing policy needs to know.
"""

from __future__ import annotations

from kvsim.engine.system import Invariant

from . import checks
from . import data
from ..pd_common.status import KVPoll, update_status
from .actions import (DOWN, UP, AbortMsg, Batch, Clear, Concluded, Deadline, DeadlineArmed, Deferred, Deliver,
                      Drop, Duplicate, Enqueued, HeartbeatFailure, PeerDeath, PollTerminal, ReadyMsg, Reorder,
                      ReqMsg, RspMsg, ScatterDone, ScatterSubmitted, Sent, SlotOffset, StatusMsg, WaitingTimeout,
                      WatermarkMsg, Work)
from .actions import Abort as AbortAction
from .plan import cdiv, prefill_write_accepted, scatter_token_range, staging_prefix_accepted
from .ring import StagingAllocator, is_watermark_ready, merge_remote_watermark
from ..pd_common.rooms import Rooms, put
from .state import ALLOC_OVERSIZED, NOT_ALLOCATED, TERMINAL, Chunk, DecodeRoom, PrefillRoom, StagingState, remove
from .variants import FIXED, StagingVariant

Effects = list  # what a step did, collected as it goes (see `actions`)


class PdStaging:
    liveness = "every_room_concludes"

    def __init__(self, variant: StagingVariant = FIXED,
                 config: data.StagingSystemConfig = data.StagingSystemConfig()) -> None:
        self.name, self.variant, self.cfg = "pd-staging", variant, config
        self.groups = tuple(g for g in data.send_groups(config, variant) if g)
        self.slot_pages = config.slot_pages
        self.k = len(self.slot_pages)
        self.invariants: tuple[Invariant, ...] = checks.invariants(self)

    # -- contract -----------------------------------------------------------------------------
    def initial_states(self) -> tuple[StagingState, ...]:
        c, n, w, k = self.cfg, self.cfg.rooms, self.cfg.writers, self.k
        accepted = staging_prefix_accepted(c.decode_prefix_len, c.page_size, self.variant)
        proom = PrefillRoom(KVPoll.WaitingForInput, 0, True, (None,) * k, None)
        droom = DecodeRoom(KVPoll.WaitingForInput, True, (NOT_ALLOCATED,) * k, ((),) * k, (), (False,) * w,
                           False, (data.UNWRITTEN,) * (data.own_rows(c) * w))
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
        if p.status == KVPoll.Failed:
            return True
        return p.status == KVPoll.Success and (not self.variant.staging_outstanding or p.outstanding <= 0)

    def defers(self, s: StagingState, w: int) -> bool:
        """The transfer worker's next dequeue re-enqueues writer w's head chunk: no offset yet, or not ready."""
        chunk = s.queues[w][0]
        p = s.prefill[w][chunk.room]
        if p.status is None or p.status == KVPoll.Failed or not p.infos:
            return False  # skipped or dropped, not deferred
        off = p.offsets[chunk.chunk_idx] if chunk.chunk_idx < self.k else None
        return off is None or (off.alloc_id != ALLOC_OVERSIZED
                               and not is_watermark_ready(off.round, off.end, s.watermarks[w]))

    def room_actions(self, s: StagingState, r: int, faults: tuple[str, ...] = ()) -> list[tuple]:
        """The decode room's own actions: scatter completions, its timers, an abort."""
        d, c = s.decode[r], self.cfg
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
        """`a in enabled(s)`, answered from the part of `enabled` that could list `a`."""
        kind = a[0]
        if kind == "batch":
            return self.batch_enabled(s, a[1])
        if kind == "work":
            return self.work_enabled(s, a[1])
        if kind == "deliver":
            return self.deliverable(s, a[1], a[2], a[3])
        if kind in ("scatter_done", "deadline", "waiting_timeout"):
            return a in self.room_actions(s, a[1])
        return a in self.enabled(s)

    def step(self, s: StagingState, a: tuple) -> StagingState:
        return self.transition(s, a)[0]

    def transition(self, s: StagingState, a: tuple) -> tuple[StagingState, tuple[tuple, ...]]:
        """`step`, and what it did (`actions`: Sent, Enqueued, Deferred, PollTerminal, ScatterSubmitted, ...)."""
        fx: Effects = []
        return self._step(s, a, fx), tuple(fx)

    def _step(self, s: StagingState, a: tuple, fx: Effects) -> StagingState:
        kind = a[0]
        if kind == "batch":
            return self._batch(s, a[1], fx)
        if kind == "work":
            return self._work(s, a[1], fx)
        if kind == "clear":
            w, r = a[1], a[2]
            p = s.prefill[w][r]
            # clear() pops request_status and transfer_infos; _staging_outstanding is the worker's to pop
            return self._set_prefill(s, w, r, PrefillRoom(None, p.outstanding, False, (None,) * self.k, p.status), fx)
        if kind == "deliver":
            s = self._take(s, a[1], a[2], a[3])
            return self._on_decode(s, a[3], fx) if a[1] == UP else self._on_prefill(s, a[3], fx)
        if kind == "scatter_done":
            return self._scatter_done(s, a[1], a[2], fx)
        if kind in ("deadline", "waiting_timeout"):
            return self._conclude(s, a[1], KVPoll.Failed, fx)
        if kind == "heartbeat_failure":
            # _handle_node_failure after HEARTBEAT_MAX_FAILURE missed /health polls (folded into one action):
            # every room not yet at all-ranks Success fails
            for r, d in enumerate(s.decode):
                if d.status not in TERMINAL and not d.all_success:
                    s = self._conclude(s, r, KVPoll.Failed, fx)
            return s
        if not self.cfg.timed:  # a fault spends the path's budget (the timed network's fault plan has none)
            s = s._replace(faults_left=s.faults_left - 1)
        if kind == "abort":
            return self._conclude(s, a[1], KVPoll.Failed, fx)
        if kind == "reorder":
            s = self._take(s, a[1], a[2], a[3])
            return self._on_decode(s, a[3], fx) if a[1] == UP else self._on_prefill(s, a[3], fx)
        if kind == "drop":
            return self._take(s, a[1], a[2], a[3])
        if kind == "duplicate":
            chan = s.chans[a[1]][a[2]]
            i = chan.index(a[3])
            return self._set_chan(s, a[1], a[2], chan[:i + 1] + (a[3],) + chan[i + 1:])
        if kind == "peer_death":
            return s._replace(dead=True, queues=((),) * self.cfg.writers)
        raise ValueError(f"unknown action {a!r}")

    # -- prefill ------------------------------------------------------------------------------
    def _batch(self, s: StagingState, r: int, fx: Effects) -> StagingState:
        c, i = self.cfg, s.batches[r]
        if i == 0:  # prefetch right after batch formation: every slot, from every writer's session
            for w in range(c.writers):
                s = self._send(s, UP, w, fx, *(ReqMsg(r, k, self.slot_pages[k], w) for k in range(self.k)))
        new = tuple(Chunk(r, call.chunk_idx, call.page_start, call.num_pages, call.is_last) for call in self.groups[i])
        queues = tuple(q + new for q in s.queues)
        fx.extend(Enqueued(w) for w in range(c.writers))
        return s._replace(batches=put(s.batches, r, i + 1), queues=queues)

    def _work(self, s: StagingState, w: int, fx: Effects) -> StagingState:
        """The transfer worker dequeues one chunk: SKIP, DEFER, FAIL_ROOM or transfer (section 2.4)."""
        defer = self.defers(s, w)
        chunk, rest = s.queues[w][0], s.queues[w][1:]
        s = s._replace(queues=put(s.queues, w, rest))
        r, k = chunk.room, chunk.chunk_idx
        p = s.prefill[w][r]
        if p.status is None or p.status == KVPoll.Failed:
            if self.variant.staging_outstanding:
                p = p._replace(outstanding=0)  # the skip path's _staging_outstanding.pop(room)
            return self._set_prefill(s, w, r, p, fx)
        if not p.infos:
            return s  # transfer_infos torn down: no destination to iterate, the chunk is silently dropped
        if self.variant.staging_outstanding and not chunk.counted:
            p = p._replace(outstanding=p.outstanding + 1)
            chunk = chunk._replace(counted=True)
        if defer:
            # DEFER: re-enqueue at the tail (after the bounded watermark wait); chunks of a room reorder
            s = s._replace(queues=put(s.queues, w, rest + (chunk,)))
            fx.append(Deferred(w))
            return self._set_prefill(s, w, r, p, fx)
        off = p.offsets[k]
        alloc_pages = self.slot_pages[k]
        ok = off.alloc_id != ALLOC_OVERSIZED and prefill_write_accepted(
            w * alloc_pages + chunk.num_pages, chunk.num_pages, self.cfg.writers * alloc_pages, off.offset,
            s.ring.total, self.cfg.buffer_pages, self.variant)
        if not ok:  # FAIL_ROOM: only this room fails; the worker survives
            p = p._replace(status=update_status(p.status, KVPoll.Failed))
            s = self._send(s, UP, w, fx, StatusMsg(r, w, int(KVPoll.Failed)))
            return self._finish_chunk(s, w, r, p, chunk, fx)
        if chunk.num_pages > alloc_pages:
            s = checks.flag(s, "slot_writes_within_size",
                            f"writer {w} wrote {chunk.num_pages} pages of room {r} (suffix pages "
                            f"[{chunk.page_start}, {chunk.page_start + chunk.num_pages})) into slot {k}: expected <= "
                            f"{alloc_pages} (its allocation), so it overran the next writer or ring allocation")
        mem = data.write_cells(s.memory, self.cfg, r, w, off.offset, alloc_pages, chunk.page_start, chunk.num_pages)
        s = s._replace(memory=mem)
        out: list[tuple] = []
        if self.variant.last_chunk_ready or not chunk.is_last:  # before 05c7ebf the last chunk sent no CHUNK_READY
            out.append(ReadyMsg(r, k, chunk.page_start, chunk.num_pages, w))
        if chunk.is_last:
            p = p._replace(status=update_status(p.status, KVPoll.Success))
            out.append(StatusMsg(r, w, int(KVPoll.Success)))
        else:
            p = p._replace(status=update_status(p.status, KVPoll.Transferring))
        s = self._send(s, UP, w, fx, *out)
        return self._finish_chunk(s, w, r, p, chunk, fx)

    def _finish_chunk(self, s: StagingState, w: int, r: int, p: PrefillRoom, chunk: Chunk,
                      fx: Effects) -> StagingState:
        if self.variant.staging_outstanding:
            p = p._replace(outstanding=p.outstanding - 1)
            if p.outstanding < 0:
                s = checks.flag(s, "outstanding_never_negative",
                                f"writer {w} room {r}: _staging_outstanding expected >= 0, got {p.outstanding}")
            teardown = p.outstanding <= 0 and (p.status in (None, KVPoll.Success)
                                               or (chunk.is_last and p.status == KVPoll.Failed))
        else:
            teardown = p.status == KVPoll.Success  # no outstanding count: torn down at once
        if teardown:
            p = p._replace(infos=False, offsets=(None,) * self.k)
        return self._set_prefill(s, w, r, p, fx)

    def _on_prefill(self, s: StagingState, m: tuple, fx: Effects) -> StagingState:
        if m[0] == "WM":
            w = m.writer
            return s._replace(watermarks=put(s.watermarks, w, merge_remote_watermark(s.watermarks[w],
                                                                                   (m.round, m.tail))))
        if m[0] == "ABORT":
            r, w = m.room, m.writer
            p = s.prefill[w][r]
            if p.status is None or p.status == KVPoll.Success:
                return s  # unknown or concluded rooms are left alone
            return self._set_prefill(s, w, r, p._replace(status=KVPoll.Failed), fx)
        # RSP
        r, w = m.room, m.writer
        p = s.prefill[w][r]
        if p.status is None or not p.infos:
            return s  # a late reply for a torn-down room
        offset = SlotOffset(m.alloc_id, m.offset, m.round, m.end)
        return self._set_prefill(s, w, r, p._replace(offsets=put(p.offsets, m.chunk_idx, offset)), fx)

    # -- decode -------------------------------------------------------------------------------
    def _on_decode(self, s: StagingState, m: tuple, fx: Effects) -> StagingState:
        r = m.room
        d = s.decode[r]
        if not d.registered or d.status in TERMINAL:
            return s  # no stashed receiver: logged and ignored
        if m[0] == "REQ":
            k, w = m.chunk_idx, m.writer
            aid = d.infos[k]
            if aid == NOT_ALLOCATED:
                alloc, ring = s.ring.assign(m.pages * self.cfg.writers)
                if alloc is None:
                    aid = ALLOC_OVERSIZED
                else:
                    aid = alloc.alloc_id
                    s = s._replace(ring=ring, owners=s.owners + ((aid, r),))
                d = d._replace(infos=put(d.infos, k, aid))
                s = self._set_decode(s, r, d)
                targets = range(self.cfg.writers)  # a new allocation: STAGING_RSP to every bootstrap of the room
            else:
                targets = (w,)  # deduplicated: the same offset re-sent to the asking session [inf]
            a = s.ring.get(aid) if aid >= 0 else None
            for v in targets:
                rsp = RspMsg(r, k, v, aid, a.offset, a.round, a.end) if a else RspMsg(r, k, v, aid, 0, 0, 0)
                s = self._send(s, DOWN, v, fx, rsp)
            return s
        if m[0] == "READY":
            k = m.chunk_idx
            arrivals = d.counts[k] + ((m.page_start, m.num_pages, m.writer),)
            if len(arrivals) < self.cfg.writers:
                return self._set_decode(s, r, d._replace(counts=put(d.counts, k, arrivals)))
            d = d._replace(counts=put(d.counts, k, ()))
            if len({a[2] for a in arrivals}) < self.cfg.writers:
                s = checks.flag(s, "scatter_after_all_writers",
                                f"room {r} slot {k}: scatter submitted after arrivals {list(arrivals)}: expected "
                                f"{self.cfg.writers} distinct writers")
            return self._scatter(s, r, d, k, m.page_start, m.num_pages, False, fx)
        # STATUS from prefill writer w
        if m.status == KVPoll.Failed:
            return self._conclude(s, r, KVPoll.Failed, fx)
        d = d._replace(success_from=put(d.success_from, m.writer, True))
        if all(d.success_from) and not d.all_success:
            d = d._replace(all_success=True)
            if self.variant.completion_deadline and self.cfg.timeouts:
                fx.append(DeadlineArmed(r))
            if not self.variant.last_chunk_ready:
                # before 05c7ebf: on all-ranks Success scatter chunk_infos[-1] blind, from the whole
                # sequence's page count and the allocation's size, not from what was sent
                k = self.k - 1
                page = cdiv(self.cfg.prompt_len, self.cfg.page_size) - self.slot_pages[k]
                return self._scatter(s, r, d, k, page, self.slot_pages[k], True, fx)
        return self._settle(self._set_decode(s, r, d), r, fx)

    def _scatter(self, s: StagingState, r: int, d: DecodeRoom, k: int, page_start: int, num_pages: int,
                 absolute: bool, fx: Effects) -> StagingState:
        c = self.cfg
        aid = d.infos[k]
        if aid < 0:  # nothing allocated (or already scattered): nothing to read [inf]
            return self._settle(self._set_decode(s, r, d), r, fx)
        if c.decode_prefix_len % c.page_size:
            s = checks.flag(s, "unaligned_prefix_fails_room",
                            f"room {r}: decode prefix {c.decode_prefix_len} is not a multiple of page size "
                            f"{c.page_size}: expected the room Failed at registration, got a scatter of slot {k}")
        a = s.ring.get(aid)
        if absolute:
            start = page_start * c.page_size
        else:
            start, _ = scatter_token_range(page_start, num_pages, c.decode_prefix_len, c.page_size, self.variant)
        rows, prefix = list(d.rows), list(s.prefix)
        lo, top = c.decode_prefix_len, c.decode_prefix_len + data.own_rows(c)
        for t, h, cell in data.scatter_cells(s.memory, c, a.offset, self.slot_pages[k], start, num_pages):
            if t < lo:
                prefix[t * c.writers + h] = cell  # a shared radix-prefix page
            elif t < top:
                rows[(t - lo) * c.writers + h] = cell
        # append the event before zeroing the slot entry: every check sees one or the other
        d = d._replace(rows=tuple(rows), events=d.events + (aid,), infos=put(d.infos, k, NOT_ALLOCATED))
        fx.append(ScatterSubmitted(r, aid))
        s = s._replace(prefix=tuple(prefix))
        return self._settle(self._set_decode(s, r, d), r, fx)

    def _scatter_done(self, s: StagingState, r: int, aid: int, fx: Effects) -> StagingState:
        d = s.decode[r]
        s = self._free(s, (aid,), fx)
        return self._settle(self._set_decode(s, r, d._replace(events=remove(d.events, aid))), r, fx)

    def _free(self, s: StagingState, ids: tuple[int, ...], fx: Effects) -> StagingState:
        if not ids:
            return s
        ring = s.ring
        for aid in ids:
            ring = ring.free(aid, self.variant)  # StagingAllocator.free: #37166's fresh round is a flag
        owners = tuple(o for o in s.owners if o[0] not in ids)
        s = s._replace(ring=ring, owners=owners)
        for w in range(self.cfg.writers):  # WATERMARK to every subscribed session (one per batch of frees)
            s = self._send(s, DOWN, w, fx, WatermarkMsg(w, ring.watermark[0], ring.watermark[1]))
        return s

    def _settle(self, s: StagingState, r: int, fx: Effects) -> StagingState:
        """advance_scatter + poll: done once all ranks succeeded with no event and no allocated slot left."""
        d = s.decode[r]
        if d.status not in TERMINAL and d.all_success and not d.events and all(a < 0 for a in d.infos):
            return self._conclude(s, r, KVPoll.Success, fx)
        return s

    def _conclude(self, s: StagingState, r: int, status: KVPoll, fx: Effects) -> StagingState:
        """Commit or abort, then unregister_decode_req: purge the maps and release_room frees every slot."""
        d = s.decode[r]
        live = tuple(a for a in d.infos if a >= 0) + d.events
        s = self._free(s, live, fx)
        d = d._replace(status=status, registered=False, infos=(NOT_ALLOCATED,) * self.k, counts=((),) * self.k,
                       events=())
        s = self._set_decode(s, r, d)
        fx.append(Concluded(r, status))
        if status == KVPoll.Failed:
            for w in range(self.cfg.writers):
                s = self._send(s, DOWN, w, fx, AbortMsg(r, w))
        return s

    # -- helpers -------------------------------------------------------------------------------
    def _send(self, s: StagingState, side: int, w: int, fx: Effects, *messages: tuple) -> StagingState:
        if side == UP and s.dead:
            return s  # a dead prefill sends nothing
        fx.extend(Sent(side, w, m) for m in messages)
        return self._set_chan(s, side, w, s.chans[side][w] + messages)

    def _take(self, s: StagingState, side: int, w: int, m: tuple) -> StagingState:
        return self._set_chan(s, side, w, remove(s.chans[side][w], m))

    @staticmethod
    def _set_chan(s: StagingState, side: int, w: int, chan: tuple) -> StagingState:
        return s._replace(chans=put(s.chans, side, put(s.chans[side], w, chan)))

    def _set_prefill(self, s: StagingState, w: int, r: int, p: PrefillRoom, fx: Effects) -> StagingState:
        if p is not s.prefill[w][r] and self.poll_concludes(p):
            fx.append(PollTerminal(w, r))
        return s._replace(prefill=put(s.prefill, w, put(s.prefill[w], r, p)))

    @staticmethod
    def _set_decode(s: StagingState, r: int, d: DecodeRoom) -> StagingState:
        return s._replace(decode=put(s.decode, r, d))
