"""The decode side of the pd-staging transition system (`system.PdStaging` derives from `DecodeSide`).

What the decode rank's handler does with STAGING_REQ (`handle_staging_req`: allocate or answer from
the entry; STAGING_RSP to every bootstrap of the room, or with PP prefill writers to the requester's
stage only), CHUNK_READY (`handle_chunk_arrived`: the fan-in, then `submit_chunk_scatter`), the
transfer status and ABORT_ACK; the scatter at absolute rows and its completion (`advance_scatter`:
free the slot, broadcast WATERMARK, complete the room); and the room's conclusion, with the deferred
decode KV release holding a failed room's slots (`_defer_release`) until every ABORT_ACK or its timeout
(`_release`: `_do_release` / `unregister_decode_req`). The pure decisions are `decode_rules`'.
SGLang 05c7ebf (PR #30545) through 0.5.23, variant flags read where each change was made (`variants`).
"""

from __future__ import annotations

from typing import Any

from . import checks
from . import data
from ..pd_common.rooms import put
from ..pd_common.status import KVPoll
from .actions import DOWN, AbortMsg, Concluded, DeadlineArmed, Held, RspMsg, ScatterSubmitted, WatermarkMsg
from .decode_rules import fan_in_complete, req_allocates, scatter_complete
from .plan import cdiv, scatter_token_range
from .state import ALLOC_OVERSIZED, NOT_ALLOCATED, TERMINAL, DecodeRoom, StagingState, remove, set_prefix

Effects = list  # what a step did, collected as it goes (see `actions`)


class DecodeSide:
    """`PdStaging`'s decode methods; the state helpers (`_send`, `_send_each`, `_set_decode`) are `PdStaging`'s."""

    cfg: Any
    variant: Any
    k: int
    slot_pages: tuple[int, ...]
    stage_writers: bool
    deferred_release: bool
    def _on_decode(self, s: StagingState, m: tuple, fx: Effects) -> StagingState:
        r = m.room
        d = s.decode[r]
        if m[0] == "ACK":  # the deferred release's ABORT_ACK tracker (is_abort_release_safe)
            if not d.held or m.writer in d.acks:
                return s
            d = d._replace(acks=d.acks + (m.writer,))
            s = self._set_decode(s, r, d)
            return self._release(s, r, fx) if len(d.acks) >= self.cfg.writers else s
        if not d.registered or d.status in TERMINAL:
            return s  # no stashed receiver: logged and ignored
        if m[0] == "REQ":
            k, w = m.chunk_idx, m.writer
            aid = d.infos[k]
            if req_allocates(aid):
                alloc, ring = s.ring.assign(m.pages * self.cfg.writers)
                aid = ALLOC_OVERSIZED if alloc is None else alloc.alloc_id
                d = d._replace(infos=put(d.infos, k, aid))
                if alloc is None:
                    s = self._set_decode(s, r, d)
                else:  # the ring, its owners and the room in one new state
                    s = s._replace(ring=ring, owners=s.owners + ((aid, r),), decode=put(s.decode, r, d))
                # a new allocation: STAGING_RSP to every bootstrap of the room; with PP writers only to the
                # requester's pp_rank (`handle_staging_req`, requester_pp_rank)
                targets = (w,) if self.stage_writers else range(self.cfg.writers)
                a = alloc  # what `s.ring.get(aid)` finds (None: oversized)
            else:
                # a repeated REQ for an allocated chunk: the same offset again, to every bootstrap of the room as
                # for a new allocation (0.5.17-0.5.23 `handle_staging_req`; found by `kvsim conform sglang`)
                targets = (w,) if self.stage_writers else range(self.cfg.writers)
                a = s.ring.get(aid) if aid >= 0 else None
            offset, rnd, end = (a.offset, a.round, a.end) if a else (0, 0, 0)
            return self._send_each(s, DOWN, fx, [(v, RspMsg._new(r, k, v, aid, offset, rnd, end)) for v in targets])
        if m[0] == "READY":
            k = m.chunk_idx
            arrivals = d.counts[k] + ((m.page_start, m.num_pages, m.writer),)
            if not fan_in_complete(arrivals, self.cfg.writers):
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
        rows, prefix = list(d.rows), list(s.prefix)  # a shared radix-prefix page's cells go to the prefix rows
        data.scatter_into(rows, prefix, s.memory, c, a.offset, self.slot_pages[k], start, num_pages)
        # append the event before zeroing the slot entry: every check sees one or the other
        d = d._replace(rows=tuple(rows), events=d.events + (aid,), infos=put(d.infos, k, NOT_ALLOCATED))
        fx.append(ScatterSubmitted(r, aid))
        s = set_prefix(s, tuple(prefix))
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
        owners = tuple([o for o in s.owners if o[0] not in ids])
        s = s._replace(ring=ring, owners=owners)
        wm_round, wm_tail = ring.watermark  # WATERMARK to every subscribed session (one per batch of frees)
        return self._send_each(s, DOWN, fx, [(w, WatermarkMsg._new(w, wm_round, wm_tail))
                                             for w in range(self.cfg.writers)])

    def _settle(self, s: StagingState, r: int, fx: Effects) -> StagingState:
        """advance_scatter + poll: done once all ranks succeeded with no event and no allocated slot left."""
        d = s.decode[r]
        if d.status not in TERMINAL and scatter_complete(d.all_success, d.events, d.infos):
            return self._conclude(s, r, KVPoll.Success, fx)
        return s

    def _conclude(self, s: StagingState, r: int, status: KVPoll, fx: Effects) -> StagingState:
        """Commit or abort, then unregister_decode_req: purge the maps and release_room frees every slot.

        With the deferred decode KV release a failed room is held instead (`_defer_release`): its slots stay
        allocated until every writer's ABORT_ACK (`_on_decode`) or the release timeout (`_release`)."""
        if status == KVPoll.Failed and self.deferred_release:
            s = self._set_decode(s, r, s.decode[r]._replace(status=status, held=True))
            fx.append(Held(r))
        else:
            s = self._release(s, r, fx, status)
        fx.append(Concluded(r, status))
        if status == KVPoll.Failed:
            s = self._send_each(s, DOWN, fx, [(w, AbortMsg(r, w)) for w in range(self.cfg.writers)])
        return s

    def _release(self, s: StagingState, r: int, fx: Effects, status: KVPoll | None = None) -> StagingState:
        """`_do_release` / unregister_decode_req: purge the room's maps; release_room frees every slot."""
        d = s.decode[r]
        live = tuple(a for a in d.infos if a >= 0) + d.events
        s = self._free(s, live, fx)
        d = d._replace(status=d.status if status is None else status, registered=False, held=False,
                       infos=(NOT_ALLOCATED,) * self.k, counts=((),) * self.k, events=())
        return self._set_decode(s, r, d)
