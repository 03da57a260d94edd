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
batches run the step-1 send planner (`pd_staging_plan.send_batch`) and
enqueue the same chunks on every writer; the first batch prefetches every
slot with `STAGING_REQ`. The decode allocates slots on the ring, fans in
`CHUNK_READY` per slot, scatters at absolute rows, completes scatters as
events (freeing the slot and broadcasting `WATERMARK`), and concludes.
Messages travel on FIFO channels, one per writer and direction (a ZMQ
PUSH->PULL pair keeps order); a message overtaking the ones before it
(delay, reorder), a drop and a duplicate are faults, actions with a shared
budget (see `pd_staging_data.FAULT_KINDS`), as are a decode abort and the
prefill node's death. The clock passing a timeout is an action too.
KV bytes are tracked cell by cell (`pd_staging_data`), so the invariants
(`pd_staging_checks`) look at data.

Variants differ only where 05c7ebf changed code: the send planner, the
scatter row offset and the prefix check (step-1 functions taking `variant`),
plus, here: the last chunk (`CHUNK_READY` vs the blind tail scatter of the
last allocated slot on Success), the outstanding count in the teardown and
poll predicates, and the staging completion deadline.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvsim.engine.errors import ConfigError
from kvsim.engine.params import ParamSpec

from . import checks
from . import data
from ..pd_common.status import KVPoll, update_status
from .plan import VARIANTS, cdiv, prefill_write_accepted, scatter_token_range, staging_prefix_accepted
from .ring import StagingAllocator, is_watermark_ready, merge_remote_watermark
from .state import (ALLOC_OVERSIZED, DOWN, NOT_ALLOCATED, TERMINAL, UP, Chunk, DecodeRoom,  # noqa: F401
                               PrefillRoom, Rooms, StagingState, _put, _remove)

class PdStaging:
    liveness = "every_room_concludes"

    def __init__(self, config: data.StagingSystemConfig, variant: str = "fixed") -> None:
        if variant not in VARIANTS:
            raise ConfigError("variant", f"one of {', '.join(VARIANTS)}", variant)
        self.name, self.variant, self.cfg = "pd-staging", variant, config
        self.fixed = variant == "fixed"
        self.groups = tuple(g for g in data.send_groups(config, variant) if g)
        self.slot_pages = config.slot_pages
        self.k = len(self.slot_pages)
        self.invariants = checks.invariants(self)

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
                s = self._conclude(s, r, KVPoll.Failed)
        return (s,)

    def done(self, s: StagingState) -> bool:
        if any(d.status not in TERMINAL for d in s.decode):
            return False
        return s.dead or (all(p.status is None for rooms in s.prefill for p in rooms) and not any(s.queues))

    def enabled(self, s: StagingState) -> list[tuple]:
        c, acts = self.cfg, []
        faults = c.faults if s.faults_left else ()
        if not s.dead:
            for r in range(c.rooms):
                if s.batches[r] < len(self.groups) and all(p[r].status is not None for p in s.prefill):
                    acts.append(("batch", r))
            for w in range(c.writers):
                if s.queues[w]:
                    acts.append(("work", w))
                for r, p in enumerate(s.prefill[w]):
                    if self._poll_concludes(p):
                        acts.append(("clear", w, r))
        for side in (UP, DOWN):
            if side == DOWN and s.dead:
                continue  # nobody left to receive decode's messages
            for w, chan in enumerate(s.chans[side]):
                if chan:
                    acts.append(("deliver", side, w, chan[0]))
                    if "reorder" in faults:  # a later message overtakes the head (delay of the head)
                        acts += [("reorder", side, w, m) for m in dict.fromkeys(chan[1:]) if m != chan[0]]
        for r, d in enumerate(s.decode):
            if d.status in TERMINAL:
                continue
            for aid in d.events:
                acts.append(("scatter_done", r, aid))
            if d.all_success and self.fixed and c.timeouts:
                acts.append(("deadline", r))  # the clock passes completion_timeout after Success
            if not d.all_success and c.timeouts:
                acts.append(("waiting_timeout", r))
            if "abort" in faults:
                acts.append(("abort", r))
        if s.dead and any(d.status not in TERMINAL and not d.all_success for d in s.decode):
            acts.append(("heartbeat_failure",))
        for side in (UP, DOWN):
            for w, chan in enumerate(s.chans[side]):
                for m in dict.fromkeys(chan):
                    if f"drop_{m[0].lower()}" in faults:
                        acts.append(("drop", side, w, m))
                    if f"dup_{m[0].lower()}" in faults:
                        acts.append(("duplicate", side, w, m))
        if "peer_death" in faults and not s.dead:
            acts.append(("peer_death",))
        return acts

    def step(self, s: StagingState, a: tuple) -> StagingState:
        kind = a[0]
        if kind == "batch":
            return self._batch(s, a[1])
        if kind == "work":
            return self._work(s, a[1])
        if kind == "clear":
            w, r = a[1], a[2]
            p = s.prefill[w][r]
            # clear() pops request_status and transfer_infos; _staging_outstanding is the worker's to pop
            return self._set_prefill(s, w, r, PrefillRoom(None, p.outstanding, False, (None,) * self.k, p.status))
        if kind == "deliver":
            s = self._take(s, a[1], a[2], a[3])
            return self._on_decode(s, a[3]) if a[1] == UP else self._on_prefill(s, a[3])
        if kind == "scatter_done":
            return self._scatter_done(s, a[1], a[2])
        if kind in ("deadline", "waiting_timeout"):
            return self._conclude(s, a[1], KVPoll.Failed)
        if kind == "heartbeat_failure":
            # _handle_node_failure after HEARTBEAT_MAX_FAILURE missed /health polls (folded into one action):
            # every room not yet at all-ranks Success fails
            for r, d in enumerate(s.decode):
                if d.status not in TERMINAL and not d.all_success:
                    s = self._conclude(s, r, KVPoll.Failed)
            return s
        s = s._replace(faults_left=s.faults_left - 1)
        if kind == "abort":
            return self._conclude(s, a[1], KVPoll.Failed)
        if kind == "reorder":
            s = self._take(s, a[1], a[2], a[3])
            return self._on_decode(s, a[3]) if a[1] == UP else self._on_prefill(s, a[3])
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
    def _poll_concludes(self, p: PrefillRoom) -> bool:
        """`sender.poll()` is terminal; 05c7ebf reports Transferring while chunks are outstanding."""
        if p.status == KVPoll.Failed:
            return True
        return p.status == KVPoll.Success and (not self.fixed or p.outstanding <= 0)

    def _batch(self, s: StagingState, r: int) -> StagingState:
        c, i = self.cfg, s.batches[r]
        if i == 0:  # prefetch right after batch formation: every slot, from every writer's session
            for w in range(c.writers):
                s = self._send(s, UP, w, *(("REQ", r, k, self.slot_pages[k], w) for k in range(self.k)))
        new = tuple(Chunk(r, call.chunk_idx, call.page_start, call.num_pages, call.is_last) for call in self.groups[i])
        queues = tuple(q + new for q in s.queues)
        return s._replace(batches=_put(s.batches, r, i + 1), queues=queues)

    def _work(self, s: StagingState, w: int) -> StagingState:
        """The transfer worker dequeues one chunk: SKIP, DEFER, FAIL_ROOM or transfer (section 2.4)."""
        chunk, rest = s.queues[w][0], s.queues[w][1:]
        s = s._replace(queues=_put(s.queues, w, rest))
        r, k = chunk.room, chunk.chunk_idx
        p = s.prefill[w][r]
        if p.status is None or p.status == KVPoll.Failed:
            if self.fixed:
                p = p._replace(outstanding=0)  # the skip path's _staging_outstanding.pop(room)
            return self._set_prefill(s, w, r, p)
        if not p.infos:
            return s  # transfer_infos torn down: no destination to iterate, the chunk is silently dropped
        if self.fixed and not chunk.counted:
            p = p._replace(outstanding=p.outstanding + 1)
            chunk = chunk._replace(counted=True)
        off = p.offsets[k] if k < self.k else None
        if off is None or (off[0] != ALLOC_OVERSIZED and not is_watermark_ready(off[2], off[3], s.watermarks[w])):
            # DEFER: re-enqueue at the tail (after the bounded watermark wait); chunks of a room reorder
            s = s._replace(queues=_put(s.queues, w, rest + (chunk,)))
            return self._set_prefill(s, w, r, p)
        alloc_pages = self.slot_pages[k]
        ok = off[0] != ALLOC_OVERSIZED and prefill_write_accepted(
            w * alloc_pages + chunk.num_pages, chunk.num_pages, self.cfg.writers * alloc_pages, off[1],
            s.ring.total, self.cfg.buffer_pages, self.variant)
        if not ok:  # FAIL_ROOM: only this room fails; the worker survives
            p = p._replace(status=update_status(p.status, KVPoll.Failed))
            s = self._send(s, UP, w, ("STATUS", r, w, int(KVPoll.Failed)))
            return self._finish_chunk(s, w, r, p, chunk)
        if chunk.num_pages > alloc_pages:
            s = checks.flag(s, "slot_writes_within_size",
                            f"writer {w} wrote {chunk.num_pages} pages of room {r} (suffix pages "
                            f"[{chunk.page_start}, {chunk.page_start + chunk.num_pages})) into slot {k}: expected <= "
                            f"{alloc_pages} (its allocation), so it overran the next writer or ring allocation")
        mem = data.write_cells(s.memory, self.cfg, r, w, off[1], alloc_pages, chunk.page_start, chunk.num_pages)
        s = s._replace(memory=mem)
        out = []
        if self.fixed or not chunk.is_last:  # before 05c7ebf the last chunk sent no CHUNK_READY
            out.append(("READY", r, k, chunk.page_start, chunk.num_pages, w))
        if chunk.is_last:
            p = p._replace(status=update_status(p.status, KVPoll.Success))
            out.append(("STATUS", r, w, int(KVPoll.Success)))
        else:
            p = p._replace(status=update_status(p.status, KVPoll.Transferring))
        s = self._send(s, UP, w, *out)
        return self._finish_chunk(s, w, r, p, chunk)

    def _finish_chunk(self, s: StagingState, w: int, r: int, p: PrefillRoom, chunk: Chunk) -> StagingState:
        if self.fixed:
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
        return self._set_prefill(s, w, r, p)

    def _on_prefill(self, s: StagingState, m: tuple) -> StagingState:
        if m[0] == "WM":
            w = m[1]
            return s._replace(watermarks=_put(s.watermarks, w, merge_remote_watermark(s.watermarks[w], (m[2], m[3]))))
        if m[0] == "ABORT":
            r, w = m[1], m[2]
            p = s.prefill[w][r]
            if p.status is None or p.status == KVPoll.Success:
                return s  # unknown or concluded rooms are left alone
            return self._set_prefill(s, w, r, p._replace(status=KVPoll.Failed))
        # RSP
        _, r, k, w, aid, off, rnd, end = m
        p = s.prefill[w][r]
        if p.status is None or not p.infos:
            return s  # a late reply for a torn-down room
        return self._set_prefill(s, w, r, p._replace(offsets=_put(p.offsets, k, (aid, off, rnd, end))))

    # -- decode -------------------------------------------------------------------------------
    def _on_decode(self, s: StagingState, m: tuple) -> StagingState:
        r = m[1]
        d = s.decode[r]
        if not d.registered or d.status in TERMINAL:
            return s  # no stashed receiver: logged and ignored
        if m[0] == "REQ":
            _, r, k, pages, w = m
            aid = d.infos[k]
            if aid == NOT_ALLOCATED:
                alloc, ring = s.ring.assign(pages * self.cfg.writers)
                if alloc is None:
                    aid = ALLOC_OVERSIZED
                else:
                    aid = alloc.alloc_id
                    s = s._replace(ring=ring, owners=s.owners + ((aid, r),))
                d = d._replace(infos=_put(d.infos, k, aid))
                s = self._set_decode(s, r, d)
                targets = range(self.cfg.writers)  # a new allocation: STAGING_RSP to every bootstrap of the room
            else:
                targets = (w,)  # deduplicated: the same offset re-sent to the asking session [inf]
            a = s.ring.get(aid) if aid >= 0 else None
            for v in targets:
                rsp = ("RSP", r, k, v, aid, a.offset, a.round, a.end) if a else ("RSP", r, k, v, aid, 0, 0, 0)
                s = self._send(s, DOWN, v, rsp)
            return s
        if m[0] == "READY":
            _, r, k, page_start, num_pages, w = m
            arrivals = d.counts[k] + ((page_start, num_pages, w),)
            if len(arrivals) < self.cfg.writers:
                return self._set_decode(s, r, d._replace(counts=_put(d.counts, k, arrivals)))
            d = d._replace(counts=_put(d.counts, k, ()))
            if len({a[2] for a in arrivals}) < self.cfg.writers:
                s = checks.flag(s, "scatter_after_all_writers",
                                f"room {r} slot {k}: scatter submitted after arrivals {list(arrivals)}: expected "
                                f"{self.cfg.writers} distinct writers")
            return self._scatter(s, r, d, k, page_start, num_pages, absolute=False)
        # STATUS from prefill writer w
        _, r, w, status = m
        if status == KVPoll.Failed:
            return self._conclude(s, r, KVPoll.Failed)
        d = d._replace(success_from=_put(d.success_from, w, True))
        if all(d.success_from) and not d.all_success:
            d = d._replace(all_success=True)
            if not self.fixed:
                # before 05c7ebf: on all-ranks Success scatter chunk_infos[-1] blind, from the whole
                # sequence's page count and the allocation's size, not from what was sent
                k = self.k - 1
                page = cdiv(self.cfg.prompt_len, self.cfg.page_size) - self.slot_pages[k]
                return self._scatter(s, r, d, k, page, self.slot_pages[k], absolute=True)
        return self._settle(self._set_decode(s, r, d), r)

    def _scatter(self, s: StagingState, r: int, d: DecodeRoom, k: int, page_start: int, num_pages: int,
                 absolute: bool) -> StagingState:
        c = self.cfg
        aid = d.infos[k]
        if aid < 0:  # nothing allocated (or already scattered): nothing to read [inf]
            return self._settle(self._set_decode(s, r, d), r)
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
        d = d._replace(rows=tuple(rows), events=d.events + (aid,), infos=_put(d.infos, k, NOT_ALLOCATED))
        s = s._replace(prefix=tuple(prefix))
        return self._settle(self._set_decode(s, r, d), r)

    def _scatter_done(self, s: StagingState, r: int, aid: int) -> StagingState:
        d = s.decode[r]
        s = self._free(s, (aid,))
        return self._settle(self._set_decode(s, r, d._replace(events=_remove(d.events, aid))), r)

    def _free(self, s: StagingState, ids: tuple[int, ...]) -> StagingState:
        if not ids:
            return s
        ring = s.ring
        for aid in ids:
            ring = ring.free(aid)
        owners = tuple(o for o in s.owners if o[0] not in ids)
        s = s._replace(ring=ring, owners=owners)
        for w in range(self.cfg.writers):  # WATERMARK to every subscribed session (one per batch of frees)
            s = self._send(s, DOWN, w, ("WM", w, ring.watermark[0], ring.watermark[1]))
        return s

    def _settle(self, s: StagingState, r: int) -> StagingState:
        """advance_scatter + poll: done once all ranks succeeded with no event and no allocated slot left."""
        d = s.decode[r]
        if d.status not in TERMINAL and d.all_success and not d.events and all(a < 0 for a in d.infos):
            return self._conclude(s, r, KVPoll.Success)
        return s

    def _conclude(self, s: StagingState, r: int, status: KVPoll) -> StagingState:
        """Commit or abort, then unregister_decode_req: purge the maps and release_room frees every slot."""
        d = s.decode[r]
        live = tuple(a for a in d.infos if a >= 0) + d.events
        s = self._free(s, live)
        d = d._replace(status=status, registered=False, infos=(NOT_ALLOCATED,) * self.k, counts=((),) * self.k,
                       events=())
        s = self._set_decode(s, r, d)
        if status == KVPoll.Failed:
            for w in range(self.cfg.writers):
                s = self._send(s, DOWN, w, ("ABORT", r, w))
        return s

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def _send(s: StagingState, side: int, w: int, *messages: tuple) -> StagingState:
        if side == UP and s.dead:
            return s  # a dead prefill sends nothing
        return PdStaging._set_chan(s, side, w, s.chans[side][w] + messages)

    @staticmethod
    def _take(s: StagingState, side: int, w: int, m: tuple) -> StagingState:
        return PdStaging._set_chan(s, side, w, _remove(s.chans[side][w], m))

    @staticmethod
    def _set_chan(s: StagingState, side: int, w: int, chan: tuple) -> StagingState:
        return s._replace(chans=_put(s.chans, side, _put(s.chans[side], w, chan)))

    @staticmethod
    def _set_prefill(s: StagingState, w: int, r: int, p: PrefillRoom) -> StagingState:
        return s._replace(prefill=_put(s.prefill, w, _put(s.prefill[w], r, p)))

    @staticmethod
    def _set_decode(s: StagingState, r: int, d: DecodeRoom) -> StagingState:
        return s._replace(decode=_put(s.decode, r, d))


# -- parameters (`--param NAME=VALUE`) --------------------------------------------------------------

DEFAULT_FAULTS = "drop_ready,abort,peer_death"

SYSTEM_PARAMS = (
    ParamSpec("rooms", "int", 1, "requests sharing the decode rank and its staging ring", minimum=1, maximum=2),
    ParamSpec("writers", "int", 1, "W = P_tp / D_tp prefill writer ranks per decode rank", minimum=1, maximum=2),
    ParamSpec("page_size", "int", 1, "tokens per KV page", minimum=1, maximum=16),
    ParamSpec("chunked_prefill_size", "int", 1, "prefill batch tokens; the grid is its whole pages",
              minimum=1, maximum=512),
    ParamSpec("prompt_len", "int", 2, "L: prompt tokens", minimum=1, maximum=4095),
    ParamSpec("decode_prefix_len", "int", 0, "D: tokens the decode radix cache already holds", minimum=0),
    ParamSpec("prefill_hit", "int", 0, "tokens the prefill radix cache already holds", minimum=0),
    ParamSpec("ring_units", "int", 0, "staging ring size in pages of one writer's heads (0: every slot fits)",
              minimum=0),
    ParamSpec("faults", "str", DEFAULT_FAULTS, "comma-separated fault kinds: " + ", ".join(data.FAULT_KINDS)),
    ParamSpec("fault_budget", "int", 1, "fault actions allowed on one path", minimum=0, maximum=3),
    ParamSpec("timeouts", "int", 1, "1: the decode waiting timeout and (fixed) the completion deadline may pass",
              minimum=0, maximum=1),
)


def parse_faults(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip() and k.strip() != "none")
    for k in kinds:
        if k not in data.FAULT_KINDS:
            raise ConfigError("--param faults", f"a comma-separated subset of {', '.join(data.FAULT_KINDS)}", text)
    return kinds


def build_system(variant: str, p: Mapping[str, Any]) -> PdStaging:
    cfg = data.StagingSystemConfig(
        rooms=p["rooms"], writers=p["writers"], page_size=p["page_size"],
        chunked_prefill_size=p["chunked_prefill_size"], prompt_len=p["prompt_len"],
        decode_prefix_len=p["decode_prefix_len"], prefill_hit=p["prefill_hit"], ring_units=p["ring_units"],
        faults=parse_faults(p["faults"]), fault_budget=p["fault_budget"], timeouts=bool(p["timeouts"]))
    return PdStaging(cfg, variant)
