"""The prefill side of the pd-staging transition system (`system.PdStaging` derives from `PrefillSide`).

The scheduler's prefill batches (`_batch`: the first prefetches every slot with STAGING_REQ) and the
Mooncake transfer worker (`_work`: SKIP, DEFER, FAIL_ROOM or transfer, and with a sibling destination
deferring, the whole-chunk re-enqueue of `MooncakeKVManager.transfer_worker`), the room's status and
`_staging_outstanding` count (`_finish_chunk`), the ABORT_ACK owed once a room drained
(`_maybe_ack`, `_maybe_ack_drained_abort`), and what the prefill's bootstrap thread receives
(`_on_prefill`: WATERMARK, ABORT, STAGING_RSP). SGLang 05c7ebf (PR #30545) through 0.5.23, variant flags
read where each change was made (`variants`).
"""

from __future__ import annotations

from typing import Any

from . import checks
from . import data
from ..pd_common.rooms import put
from ..pd_common.status import FAILED, SUCCESS, TRANSFERRING, KVPoll, update_status
from .actions import UP, AckMsg, Deferred, Enqueued, ReadyMsg, ReqMsg, SlotOffset, StatusMsg
from .plan import prefill_write_accepted
from .ring import merge_remote_watermark
from .state import (ALLOC_OVERSIZED, Chunk, PrefillRoom, StagingState, set_memory, set_offsets, set_queues,
                    set_watermarks)

Effects = list  # what a step did, collected as it goes (see `actions`)


class PrefillSide:
    """`PdStaging`'s prefill methods; the state helpers (`_send`, `_set_prefill`) are `PdStaging`'s."""

    cfg: Any
    variant: Any
    k: int
    groups: tuple
    slot_pages: tuple[int, ...]
    deferred_release: bool
    def _batch(self, s: StagingState, r: int, fx: Effects) -> StagingState:
        c, i = self.cfg, s.batches[r]
        if i == 0:  # prefetch right after batch formation: every slot, from every writer's session
            for w in range(c.writers):
                s = self._send(s, UP, w, fx, *(ReqMsg._new(r, k, self.slot_pages[k], w) for k in range(self.k)))
        new = tuple(Chunk(r, call.chunk_idx, call.page_start, call.num_pages, call.is_last) for call in self.groups[i])
        queues = tuple(q + new for q in s.queues)
        fx.extend(Enqueued._new(w) for w in range(c.writers))
        return s._replace(batches=put(s.batches, r, i + 1), queues=queues)

    def _work(self, s: StagingState, w: int, fx: Effects, sibling_defers: bool = False) -> StagingState:
        """The transfer worker dequeues one chunk: SKIP, DEFER, FAIL_ROOM or transfer (section 2.4).

        `sibling_defers`: this decode rank is written, then another destination of the chunk defers
        (`_do_staging_transfer` returns deferred: `queue.put(kv_chunk)`; `break`)."""
        defer = self.defers(s, w)
        chunk, rest = s.queues[w][0], s.queues[w][1:]
        s = set_queues(s, put(s.queues, w, rest))
        r, k = chunk.room, chunk.chunk_idx
        p = s.prefill[w][r]
        if p.status is None or p.status == FAILED:
            if self.variant.staging_outstanding:
                p = p._replace(outstanding=0)  # the skip path's _staging_outstanding.pop(room)
                s, p = self._maybe_ack(s, w, r, p, fx)
            return self._set_prefill(s, w, r, p, fx)
        if not p.infos:
            return s  # transfer_infos torn down: no destination to iterate, the chunk is silently dropped
        if self.variant.staging_outstanding and not chunk.counted:
            p = p._replace(outstanding=p.outstanding + 1)
            chunk = chunk._replace(counted=True)
        if defer:
            # DEFER: re-enqueue at the tail (after the bounded watermark wait); chunks of a room reorder
            s = set_queues(s, put(s.queues, w, rest + (chunk,)))
            fx.append(Deferred(w))
            return self._set_prefill(s, w, r, p, fx)
        if chunk.dst_done:  # (proposed fix) written on an earlier pass: only the status sync is left
            return self._conclude_chunk(s, w, r, p, chunk, [], fx)
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
        s = set_memory(s, mem)
        out: list[tuple] = []
        if self.variant.last_chunk_ready or not chunk.is_last:  # before 05c7ebf the last chunk sent no CHUNK_READY
            out.append(ReadyMsg._new(r, k, chunk.page_start, chunk.num_pages, w))
        if sibling_defers:
            # a sibling destination defers: the whole chunk goes back on the queue (still counted); the status
            # sync waits for a pass in which every destination was written (`len(polls) == required_dst_info_num`)
            s = self._send(s, UP, w, fx, *out)
            chunk = chunk._replace(dst_done=not self.variant.whole_chunk_reenqueue)
            s = s._replace(queues=put(s.queues, w, s.queues[w] + (chunk,)))
            fx.append(Deferred(w))
            return self._set_prefill(s, w, r, p, fx)
        return self._conclude_chunk(s, w, r, p, chunk, out, fx)

    def _conclude_chunk(self, s: StagingState, w: int, r: int, p: PrefillRoom, chunk: Chunk, out: list[tuple],
                        fx: Effects) -> StagingState:
        """Every destination written: the status of the room, the status sync on the last chunk, then finish."""
        if chunk.is_last:
            p = p._replace(status=update_status(p.status, SUCCESS))
            out.append(StatusMsg(r, w, int(SUCCESS)))
        else:
            p = p._replace(status=update_status(p.status, TRANSFERRING))
        s = self._send(s, UP, w, fx, *out)
        return self._finish_chunk(s, w, r, p, chunk, fx)

    def _finish_chunk(self, s: StagingState, w: int, r: int, p: PrefillRoom, chunk: Chunk,
                      fx: Effects) -> StagingState:
        if self.variant.staging_outstanding:
            p = p._replace(outstanding=p.outstanding - 1)
            if p.outstanding < 0:
                s = checks.flag(s, "outstanding_never_negative",
                                f"writer {w} room {r}: _staging_outstanding expected >= 0, got {p.outstanding}")
            teardown = p.outstanding <= 0 and (p.status in (None, SUCCESS) or (chunk.is_last and p.status == FAILED))
            s, p = self._maybe_ack(s, w, r, p, fx)
        else:
            teardown = p.status == SUCCESS  # no outstanding count: torn down at once
        if teardown:
            p = p._replace(infos=False, offsets=(None,) * self.k)
        return self._set_prefill(s, w, r, p, fx)

    def _maybe_ack(self, s: StagingState, w: int, r: int, p: PrefillRoom,
                   fx: Effects) -> tuple[StagingState, PrefillRoom]:
        """`_maybe_ack_drained_abort`: the owed ABORT_ACK goes once nothing of the room is outstanding."""
        if p.ack and p.outstanding <= 0:
            s = self._send(s, UP, w, fx, AckMsg(r, w))
            p = p._replace(ack=False)
        return s, p

    def _on_prefill(self, s: StagingState, m: tuple, fx: Effects) -> StagingState:
        if m[0] == "WM":
            w = m.writer
            return set_watermarks(s, put(s.watermarks, w, merge_remote_watermark(s.watermarks[w], (m.round, m.tail))))
        if m[0] == "ABORT":
            r, w = m.room, m.writer
            p = s.prefill[w][r]
            if self.deferred_release:  # _handle_deferred_abort_notification: fail an active room, owe the ACK
                if p.status is not None and p.status != KVPoll.Success:
                    p = p._replace(status=KVPoll.Failed)
                s, p = self._maybe_ack(s, w, r, p._replace(ack=True), fx)
                return self._set_prefill(s, w, r, p, fx)
            if p.status is None or p.status == KVPoll.Success:
                return s  # unknown or concluded rooms are left alone
            return self._set_prefill(s, w, r, p._replace(status=KVPoll.Failed), fx)
        # RSP (the most frequent delivery: its fields read in one unpack)
        _, r, k, w, alloc_id, offset, rnd, end = m
        p = s.prefill[w][r]
        if p.status is None or not p.infos:
            return s  # a late reply for a torn-down room
        slot = SlotOffset._new(alloc_id, offset, rnd, end)
        return self._set_prefill(s, w, r, set_offsets(p, put(p.offsets, k, slot)), fx)
