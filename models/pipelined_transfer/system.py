"""The pipelined KV transfer as a transition system (TensorRT-LLM #15727, Python cache transceiver).

Research note ../shared/research/trtllm_flashinfer.md, sections 1.3-1.9. One receiver (gen-first: one
KVRecvTask over the whole prompt) and K sender TP ranks, each with its own TxSession per request and one
fabric queue per (request, rank). Events (section 1.7) as actions: `peer_info`/`promote` (with `promotion`);
`compute`, a forward step then `respond_and_send_async` on every rank (extent, `KVSendTask`, write; at the
last chunk `start_transfer` pins, the final slice, `_finalize_send`'s aux task); `write_done` (task
TRANSFERRED, credit retired, result frame); `deliver` (`last_slice_count == expected_transfers`, plus aux);
`poll`, the collective context poll (completed = intersection, cancelled/failed = union, retire only when
quiesced); `timeout` and `stall_report`, the clock. Faults are actions with a per-path budget.

The generation side: `gen_post` takes the receiver's destination pages from the free list of its pool
(`rx_pages`; by default every request is posted at the start with its own pages), `gen_release` returns
them: once generation has run (state 12), or after an error once every context rank's cancel-ACK arrived
(section 1.6: a rank sends it only after it drained, `cancel_ack`). The ACK is a message: `drop_ack` (a `drop`
fault) loses it, and the receiver then waits; with `timeouts` its deadline reports the stall once and keeps the
pages (`rx_stall`, as the context side's stall report: settled for E4, not released for E3). `gen_cancel` (a fault: the generation side's `cancel_request`) concludes the
receive session and sends CANCEL_SESSION to every context rank; `remote_cancel` is its arrival (cancels
a session, or is remembered as a pre-cancel when none exists yet; `drop_cancel` loses it). In `fixed` a
generation-side cancel releases the destination pages at once, the open gap of the lifecycle ledger;
S1 checks every in-flight write against the pages its request still holds, so a page released (or
reallocated to another request) under a write is a violation.

A rank's writes to one peer run one at a time on one worker thread (upstream `Sender._enqueue` routes by
(request, peer)), and `_deliver_kv_to_agent` aborts a write whose session is already ERROR: once a write
of a rank failed, every later KV write of that rank settles as an abort, a FAILED result flagged `is_last`,
nothing written (`_settle`). So a rank never reports SUCCESS after FAILED for one request, and a lost FAILED
frame is followed by another FAILED one (the aux write is not checked upstream and still lands). An earlier
model let those later writes land: a dropped FAILED result and the same rank's final SUCCESS then completed
the receiver with a slice never written (S3, `ranks=2 faults=fail,drop fault_budget=2`); not upstream
behaviour, so not filed (read in tensorrt_llm/_torch/disaggregation/native/transfer.py, the stored revision
006dd5ec: `Sender._enqueue`, `Sender._process_task_queue`, `Sender._deliver_kv_to_agent`; the receiver's
`RxSession.process_kv_agent_result` also never un-fails a task after a FAILED result). Result frames travel
on ZMQ DEALER -> ROUTER sockets over TCP (`native/messenger.py`): ordered, and lost only with a broken
connection or a handler that raises (the receiver's listener logs and drops the message), which the `drop`
fault stands for (#17665).

Simplifications: a task is TRANSFERRING from dispatch (cancel never finds an INIT task; upstream a write
still queued behind a cancel is aborted too, so the model lets more writes land than upstream, which only
widens S1's windows); the layer groups are the full-attention one and, with `swa_window`, one window group
(with `full_attention=0` the window group alone); the cancel-ACK is sent and received in one step
(`cancel_ack`); context pages are released, not reallocated; a rank's TxSession is created with its first
emitted slice, where upstream `respond_and_send_async` creates it before building the extent, so a chunk that
emits no slice (covers no block, or every group deferred) already registers an empty session there.
"""

from __future__ import annotations

from kvsim.engine.actions import Rules
from kvsim.engine.system import Invariant, Sometimes

from . import checks
from .chunks import MASKED
from .config import PipelinedConfig
from . import symmetry
from .state import (ACK_LOST, ACK_NONE, ACK_RECEIVED, NO_SLICE_ID, Cancel, CancelAck, Compute, CtxConcluded, Deliver,
                    DestReleased, Dispatched, DropAck, DropCancel, DropFrame, DupFrame, Fence, Frame, FrameSent,
                    GenCancel, GenPost, GenRelease, PagesFreed, PeerInfo, Poll, Promote, PtState, RemoteCancel, Req, Rx,
                    RxConcluded, RxStall, RxTimeout, Settled, Shutdown, Silent, Stalled, StallReport, Timeout, Write,
                    WriteDone, WriteFail, put)
from .status import (NEW_TX, TERMINAL_SESSION, KVSendTask, LlmRequestState, SessionStatus, TaskStatus, TxSession,
                     cancel, is_completed, set_exception, tx_status)
from .variants import FIXED, PipelinedVariant

S = LlmRequestState
Effects = list
OPEN = (S.DISAGG_CONTEXT_WAIT_SCHEDULER, S.CONTEXT_INIT, S.DISAGG_CONTEXT_TRANS_IN_PROGRESS)  # not yet concluded
RX_OPEN = (S.DISAGG_GENERATION_INIT, S.DISAGG_GENERATION_TRANS_IN_PROGRESS)  # the receiver has not concluded


class PipelinedTransfer:
    def __init__(self, variant: PipelinedVariant = FIXED, config: PipelinedConfig = PipelinedConfig()) -> None:
        self.name, self.variant, self.cfg = "pipelined-transfer", variant, config
        self.liveness = "E4_every_request_settles" if config.goal == "settle" else "E3_every_cancel_releases"
        self.liveness_doc = (
            "from every reachable state some run ends each request released on the context side (or reported "
            "stalled) and concluded on the receiver (or its peer silent): no silent hang (E4)"
            if config.goal == "settle" else
            "from every reachable state some run releases every request's pages on the context side and concludes "
            "its receiver (E3: a cancelled request releases its pages)")
        slices = config.slices()  # per prefill chunk: its slice, or None when it emits none
        self.extents = tuple(sl.extent if sl is not None else None for sl in slices)
        self.n = len(self.extents)
        self.k = config.ranks
        self.fault_kinds = config.fault_kinds
        blocks = config.blocks
        cells = []
        for c, sl in enumerate(slices):
            per_group = sl.block_ids_per_layer_groups if sl is not None else ()
            cells.append(tuple((g * blocks + b, config.fill(b, c + 1)) for g, ids in enumerate(per_group)
                               for b, d in enumerate(ids) if d != MASKED))
        self.cells = tuple(cells)  # per prefill chunk: (group * blocks + block, fill) its write snapshots
        # pages move with their request under relabelling when each request owns a fixed block of the pool
        self.page_block = 0 if config.shared_pool else config.cells_per_rank
        self._canonical = symmetry.Canonical(self.page_block, self.k)
        self.invariants: tuple[Invariant, ...] = checks.invariants(self)
        self.sometimes: tuple[Sometimes, ...] = checks.reachable()

    # -- contract -----------------------------------------------------------------------------
    def initial_states(self) -> tuple[PtState, ...]:
        """Every request posted with its own pages; with a shared pool (`rx_pages`) none is posted yet."""
        c, k, cells = self.cfg, self.k, self.cfg.cells_per_rank
        posted = not c.shared_pool
        promoted = posted and not c.promotion
        req = Req(S.CONTEXT_INIT if promoted else S.DISAGG_CONTEXT_WAIT_SCHEDULER, 0, False, False, False, False,
                  False, 0, False, False, 0, (promoted,) * k)
        rxs = tuple(Rx(S.DISAGG_GENERATION_TRANS_IN_PROGRESS if posted else S.DISAGG_GENERATION_INIT, (0,) * k,
                       (0,) * k, False, c.initial_dest(), tuple(range(r * cells, (r + 1) * cells)) if posted else (),
                       0, (False,) * k, False, (ACK_NONE,) * k, False) for r in range(c.requests))
        empty = (((),) * k,) * c.requests
        return (PtState((req,) * c.requests, ((None,) * k,) * c.requests, empty, empty, rxs, c.fault_budget, ()),)

    def canonical(self, s: PtState) -> PtState:
        """The requests, and the sender ranks, are interchangeable: one representative per orbit
        (`symmetry.canonical`)."""
        return self._canonical(s)

    def ctx_done(self, s: PtState, r: int) -> bool:
        q = s.reqs[r]
        return q.freed > 0 or (self.cfg.goal == "settle" and q.stalled) or self._wedged(s, r)

    @staticmethod
    def _wedged(s: PtState, r: int) -> bool:
        """Not yet posted (a shared pool), while the one receiver went silent for another request: its pages are
        held for ever and admission is wedged, which is not this transfer's to settle."""
        return s.rx[r].state == S.DISAGG_GENERATION_INIT and any(q.silent for q in s.reqs)

    def rx_done(self, s: PtState, r: int) -> bool:
        """Concluded with its destination pages back in the pool, or its peer silent, or crashed (or `_wedged`)."""
        rx = s.rx[r]
        if rx.state == S.DISAGG_GENERATION_INIT:
            return self._wedged(s, r)
        return ((rx.state not in RX_OPEN and not rx.held) or s.reqs[r].silent or rx.crashed
                or (self.cfg.goal == "settle" and rx.stalled))

    def rank_drained(self, s: PtState, r: int, k: int) -> bool:
        """Context rank k of `r` has no write in flight and can start none: what its cancel-ACK reports."""
        q, t = s.reqs[r], s.tx[r][k]
        if s.flight[r][k]:
            return False
        return q.freed > 0 or q.retired or (t is not None and (t.sealed or not t.in_map))

    def drained(self, s: PtState, r: int) -> bool:
        return all(self.rank_drained(s, r, k) for k in range(self.k))

    def _releases_at_once(self, rx: Rx) -> bool:
        """A generation-side cancel in `fixed` releases without waiting (the lifecycle ledger's open gap)."""
        return rx.gen_cancelled and not self.variant.rx_release_after_drain

    def _ack_due(self, s: PtState, r: int, k: int) -> bool:
        """Rank k drained after the error and the receiver waits for its cancel-ACK (not yet sent)."""
        rx = s.rx[r]
        return (rx.state == S.DISAGG_TRANS_ERROR and rx.held and not rx.crashed and not s.reqs[r].silent
                and rx.acks[k] == ACK_NONE and not self._releases_at_once(rx) and self.rank_drained(s, r, k))

    def _may_release(self, s: PtState, r: int) -> bool:
        """The receiver may return its destination pages: generation ran (12), or, after an error, every context
        rank's cancel-ACK arrived; a generation-side cancel in `fixed` releases at once."""
        rx = s.rx[r]
        if not rx.held or rx.state in RX_OPEN or rx.crashed or s.reqs[r].silent:
            return False
        if rx.state == S.DISAGG_GENERATION_TRANS_COMPLETE:
            return True
        return self._releases_at_once(rx) or all(a == ACK_RECEIVED for a in rx.acks)

    def _free_pages(self, s: PtState) -> list[int]:
        held = {p for rx in s.rx if rx.held for p in rx.pages}
        return [p for p in range(self.cfg.pool_size) if p not in held]

    def done(self, s: PtState) -> bool:
        return all(self.ctx_done(s, r) and self.rx_done(s, r) for r in range(self.cfg.requests))

    def computing(self, q: Req) -> bool:
        """The request will still run forward steps (a cancelled one only in the older revision)."""
        return q.ctx == S.CONTEXT_INIT and q.freed == 0 and q.computed < self.n and (
            not q.stopping or self.cfg.cancel_final)

    def poll_enabled(self, s: PtState, r: int) -> bool:
        """`Poll(r) in enabled(s)`, without listing every other action."""
        return self._poll(s, r, []) != s

    def _indices(self, flight: tuple) -> range:
        return range(1) if self.cfg.fifo else range(len(flight))

    # what enables an action is written once, beside its effect (`RULES` below): `enabled` lists the explorer's
    # actions in its order from the same conditions, and `allows` (one action: what a timing policy asks before
    # it acts) reads the rule of the action's record type
    def _can_post(self, s: PtState, r: int) -> bool:
        return (s.rx[r].state == S.DISAGG_GENERATION_INIT and not s.reqs[r].stopping
                and len(self._free_pages(s)) >= self.cfg.cells_per_rank)

    @staticmethod
    def _awaits_promotion(s: PtState, r: int) -> bool:
        """In DISAGG_CONTEXT_WAIT_SCHEDULER with the receive posted: peer info arrives, then the promotion."""
        q = s.reqs[r]
        return q.ctx == S.DISAGG_CONTEXT_WAIT_SCHEDULER and not q.stopping and s.rx[r].state != S.DISAGG_GENERATION_INIT

    def _settling(self, s: PtState, r: int, k: int) -> range:
        """The indices of rank k's writes in flight that may settle next (none while its peer is silent)."""
        fl = s.flight[r][k]
        return self._indices(fl) if fl and not s.reqs[r].silent else range(0)

    @staticmethod
    def _deliverable(s: PtState, r: int, k: int) -> bool:
        return bool(s.frames[r][k]) and not s.reqs[r].silent

    def _can_time_out(self, s: PtState, r: int) -> bool:
        q = s.reqs[r]
        return bool(self.cfg.timeouts and q.clock and not q.timed_out and not q.freed)

    @staticmethod
    def _can_report_stall(s: PtState, r: int) -> bool:
        q = s.reqs[r]
        return q.timed_out and not q.stalled and any(s.flight[r]) and not q.freed

    def _can_fence(self, s: PtState, r: int) -> bool:
        return self.variant.drain_deadline and s.reqs[r].stalled and any(s.flight[r])

    def _can_rx_time_out(self, s: PtState, r: int) -> bool:
        rx = s.rx[r]
        return bool(self.variant.rx_deadline and self.cfg.timeouts and rx.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS
                    and not (s.reqs[r].silent or rx.crashed))

    @staticmethod
    def _cancel_in_flight(s: PtState, r: int, k: int) -> bool:
        """A CANCEL_SESSION to rank k is on its way."""
        return s.rx[r].cancel_to[k]

    def _can_rx_stall(self, s: PtState, r: int) -> bool:
        rx = s.rx[r]
        return bool(self.cfg.timeouts and rx.held and not rx.stalled and ACK_LOST in rx.acks)

    def _may_fault(self, s: PtState, kind: str) -> bool:
        """A fault of `kind` is configured and the path's budget has one left."""
        return bool(s.faults_left) and kind in self.fault_kinds

    def _can_go_silent(self, s: PtState, r: int) -> bool:
        return (s.rx[r].state != S.DISAGG_GENERATION_INIT and not s.reqs[r].silent
                and not (self.ctx_done(s, r) and self.rx_done(s, r)))

    @staticmethod
    def _can_cancel(s: PtState, r: int) -> bool:
        q = s.reqs[r]
        return s.rx[r].state != S.DISAGG_GENERATION_INIT and not q.stopping and not q.freed

    @staticmethod
    def _can_gen_cancel(s: PtState, r: int) -> bool:
        rx = s.rx[r]
        return rx.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS and not s.reqs[r].silent and not rx.crashed

    @staticmethod
    def _any_open(s: PtState) -> bool:
        return any(not q.stopping and not q.freed for q in s.reqs)

    def enabled(self, s: PtState) -> list[tuple]:
        acts: list[tuple] = []
        faults = self.fault_kinds if s.faults_left else ()  # `_may_fault`, once per state
        ranks = range(self.k)
        for r, q in enumerate(s.reqs):
            if self.computing(q):
                acts.append(Compute(r))
            if self._can_post(s, r):
                acts.append(GenPost(r))
            if self._awaits_promotion(s, r):
                acts += [PeerInfo(r, k) for k in ranks if not q.peer_info[k]]
                if all(q.peer_info):
                    acts.append(Promote(r))
            if self.poll_enabled(s, r):
                acts.append(Poll(r))
            for k in ranks:
                acts += [WriteDone(r, k, i) for i in self._settling(s, r, k)]
                if self._deliverable(s, r, k):
                    acts.append(Deliver(r, k))
            if self._can_time_out(s, r):
                acts.append(Timeout(r))
            if self._can_report_stall(s, r):
                acts.append(StallReport(r))
            if self._can_fence(s, r):
                acts.append(Fence(r))
            if self._can_rx_time_out(s, r):
                acts.append(RxTimeout(r))
            acts += [RemoteCancel(r, k) for k in ranks if self._cancel_in_flight(s, r, k)]
            acts += [CancelAck(r, k) for k in ranks if self._ack_due(s, r, k)]
            if self._can_rx_stall(s, r):
                acts.append(RxStall(r))
            if self._may_release(s, r):
                acts.append(GenRelease(r))
        if not faults:
            return acts
        for r in range(len(s.reqs)):
            for k in ranks:
                if "drop" in faults and self._cancel_in_flight(s, r, k):
                    acts.append(DropCancel(r, k))
                if "drop" in faults and self._ack_due(s, r, k):
                    acts.append(DropAck(r, k))
                if "fail" in faults:
                    acts += [WriteFail(r, k, i) for i in self._settling(s, r, k)]
                if s.frames[r][k]:
                    if "drop" in faults:
                        acts.append(DropFrame(r, k))
                    if "dup" in faults:
                        acts.append(DupFrame(r, k))
            if "silent" in faults and self._can_go_silent(s, r):
                acts.append(Silent(r))
            if "cancel" in faults and self._can_cancel(s, r):
                acts.append(Cancel(r))
            if "gen_cancel" in faults and self._can_gen_cancel(s, r):
                acts.append(GenCancel(r))
        if "shutdown" in faults and self._any_open(s):
            acts.append(Shutdown())
        return acts

    def allows(self, s: PtState, a: tuple) -> bool:
        """`a in self.enabled(s)`, answered from the rule of `a`'s record type (`RULES`)."""
        return RULES.allows(self, s, a)

    def step(self, s: PtState, a: tuple) -> PtState:
        return self.transition(s, a)[0]

    def transition(self, s: PtState, a: tuple) -> tuple[PtState, tuple[tuple, ...]]:
        """`step`, and what it did: the rule of the action's record type (`RULES`)."""
        effect, a = RULES.effect(a)
        fx: Effects = []
        return effect(self, s, a, fx), tuple(fx)

    # -- the context executor -------------------------------------------------------------------
    def _compute(self, s: PtState, r: int, fx: Effects) -> PtState:
        q = s.reqs[r]
        c = q.computed
        q = q._replace(computed=c + 1)
        ext = self.extents[c]
        if c == self.n - 1:  # is_context_finished: the last chunk
            if q.retired and self.variant.retired_check_first:
                # a retired session is caught before start_transfer: the request fails, nothing stays pinned
                return self._free(self._set_req(s, r, q), r, S.DISAGG_TRANS_ERROR, fx)
            # start_transfer pins (and commits to the reuse tree), then the final slice, then _finalize_send
            q = q._replace(pinned=True, ctx=S.DISAGG_CONTEXT_TRANS_IN_PROGRESS, clock=True)
            s = self._set_req(s, r, q)
            for k in range(self.k):
                s, ok = self._send(s, r, k, c, fx)
                if ok:
                    tx = s.tx[r][k]
                    s = self._set_tx(s, r, k, tx._replace(final=True, aux=TaskStatus.TRANSFERRING,
                                                          credits=tx.credits + 1))
                    s = self._dispatch(s, r, k, Write(NO_SLICE_ID, False, True, ()), fx)
            return s
        s = self._set_req(s, r, q)
        if q.stopping or ext is None:
            return s  # a cancelled request's intermediate chunk, or one that emits no slice: nothing is sent
        for k in range(self.k):
            s, _ = self._send(s, r, k, c, fx)
        if self.variant.clock_from_first_chunk:  # a mid-prefill request owning an in-flight session is monitored
            s = self._set_req(s, r, s.reqs[r]._replace(clock=True))
        return s

    def _send(self, s: PtState, r: int, k: int, c: int, fx: Effects) -> tuple[PtState, bool]:
        """TxSession.send: rejected once retired (never recreated) or sealed; else a KVSendTask and its write."""
        if s.reqs[r].retired:
            return s, False
        tx = s.tx[r][k] or NEW_TX  # created lazily on the first send
        if not tx.in_map:  # a remembered pre-cancel: the session is created cancelled and the send refused
            return self._set_tx(s, r, k, tx._replace(in_map=True)), False
        if tx.sealed:
            return s, False
        ext = self.extents[c]
        slice_id = len(tx.tasks)
        tx = tx._replace(tasks=tx.tasks + (KVSendTask(slice_id, ext.is_last, TaskStatus.TRANSFERRING),),
                         credits=tx.credits + 1)
        s = self._set_tx(s, r, k, tx)
        return self._dispatch(s, r, k, Write(slice_id, ext.is_last, False, self.cells[c]), fx), True

    def _dispatch(self, s: PtState, r: int, k: int, w: tuple, fx: Effects) -> PtState:
        fx.append(Dispatched(r, k, w))
        return s._replace(flight=put(s.flight, r, put(s.flight[r], k, s.flight[r][k] + (w,))))

    def _settle(self, s: PtState, r: int, k: int, i: int, ok: bool, fx: Effects) -> PtState:
        """A fabric write settles: task TRANSFERRED (or ERROR), credit retired, a result frame to the receiver.
        A KV write of a session already failed (an earlier write of this rank failed) is aborted instead:
        nothing written, a FAILED result flagged is_last (upstream `_deliver_kv_to_agent`)."""
        fl = s.flight[r][k]
        w = fl[i]
        aborted = ok and not w.is_aux and s.tx[r][k].terminal == SessionStatus.ERROR
        ok = ok and not aborted
        s = s._replace(flight=put(s.flight, r, put(s.flight[r], k, fl[:i] + fl[i + 1:])))
        fx.append(Settled(r, k, w, ok))
        tx = s.tx[r][k]
        status = TaskStatus.TRANSFERRED if ok else TaskStatus.ERROR
        if w.is_aux:
            tx = tx._replace(aux=status)
        else:
            tx = tx._replace(tasks=put(tx.tasks, w.slice_id, tx.tasks[w.slice_id]._replace(status=status)))
            if ok:  # the bytes land in the destination cells
                rx = s.rx[r]
                dest = list(rx.dest)
                for u, fill in w.cells:
                    dest[k * self.cfg.cells_per_rank + u] = fill
                s = s._replace(rx=put(s.rx, r, rx._replace(dest=tuple(dest))))
        if not ok:
            tx = set_exception(tx)
        s = self._set_tx(s, r, k, tx._replace(credits=tx.credits - 1))
        # before the #15519 split the frame carried one slice id, the sender's, which the receiver indexes by
        receiver_slice = 0 if self.variant.split_slice_ids else w.slice_id
        if w.is_aux:
            receiver_slice = NO_SLICE_ID
        frame = Frame(k, w.slice_id, receiver_slice, w.is_last or aborted, w.is_aux, ok)
        fx.append(FrameSent(r, k, frame))
        return self._set_frames(s, r, k, s.frames[r][k] + (frame,))

    def _poll(self, s: PtState, r: int, fx: Effects) -> PtState:
        """The collective context poll for one request: intersection for completion, union for failure."""
        q = s.reqs[r]
        if q.freed:
            return s
        txs = s.tx[r]
        live = [t for t in txs if t is not None and t.in_map]
        if (q.ctx in (S.CONTEXT_INIT, S.DISAGG_CONTEXT_TRANS_IN_PROGRESS) and not q.stopping and len(live) == self.k
                and all(is_completed(t, self.variant.final_slice_flag) for t in live)):
            for k in range(self.k):  # close(): credits are 0, finalize (the aux slot) and unregister
                s = self._set_tx(s, r, k, self._finalize(txs[k]))
            return self._free(s, r, S.DISAGG_CONTEXT_COMPLETE, fx)
        if not q.stopping and not any(tx_status(t) in TERMINAL_SESSION for t in live):
            return s
        if not q.stopping:  # a failed rank fails the request on every rank (union)
            s = self._cancel(s, r, fx)
            q = s.reqs[r]
        if q.retired:
            return s
        live = [t for t in s.tx[r] if t is not None and t.in_map]
        quiet = [t.credits == 0 for t in live]
        # cancel_request: True only when safe to free; retirement needs every rank quiesced
        if live and not (all(quiet) if self.variant.retire_needs_quiescence else any(quiet)):
            return s
        if any(t.credits for t in live):
            s = checks.flag(s, "E2_cancel_true_once",
                            f"request {r}: cancel_request returned True with {sum(t.credits for t in live)} "
                            f"credits outstanding on {sum(t.credits > 0 for t in live)} of {len(live)} ranks: "
                            f"expected 0 on every rank")
        for k, t in enumerate(s.tx[r]):
            if t is not None:
                s = self._set_tx(s, r, k, self._finalize(t))
        s = self._set_req(s, r, s.reqs[r]._replace(retired=True))
        if not self.computing(s.reqs[r]) and s.reqs[r].ctx in OPEN:
            s = self._free(s, r, S.DISAGG_TRANS_ERROR, fx)
        return s

    @staticmethod
    def _finalize(tx: TxSession) -> TxSession:
        """Unregister from the Sender; a session that created its aux task frees the aux slot."""
        if not tx.in_map:
            return tx
        return tx._replace(in_map=False, aux_frees=tx.aux_frees + (tx.aux is not None))

    def _cancel(self, s: PtState, r: int, fx: Effects) -> PtState:
        """cancel_request's first half: sessions cancelled (sealed), the receiver notified once."""
        q = s.reqs[r]
        for k, t in enumerate(s.tx[r]):
            if t is not None and t.in_map:
                s = self._set_tx(s, r, k, cancel(t))
        s = self._set_req(s, r, q._replace(stopping=True, notices=q.notices + (q.notices == 0)))
        if q.notices == 0 and not q.silent:  # CANCEL_SESSION: the receiver's task fails (a committed one stays)
            rx = s.rx[r]
            if rx.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS and not rx.crashed:
                s = self._set_rx(s, r, rx._replace(state=S.DISAGG_TRANS_ERROR), fx)
        return s

    def _timeout(self, s: PtState, r: int, fx: Effects) -> PtState:
        s = self._set_req(s, r, s.reqs[r]._replace(timed_out=True))
        s = self._cancel(s, r, fx)
        q = s.reqs[r]
        if q.retired and not self.computing(q) and not q.freed:
            # cancel_request on a request whose session is gone: nothing in flight, safe to free
            s = self._free(s, r, S.DISAGG_TRANS_ERROR, fx)
        return s

    def _fence(self, s: PtState, r: int, fx: Effects) -> PtState:
        """Proposed drain deadline: abort every write in flight (the fabric guarantees none lands), then release."""
        for k in range(self.k):
            for w in s.flight[r][k]:
                fx.append(Settled(r, k, w, False))
                tx = s.tx[r][k]
                if w.is_aux:
                    tx = tx._replace(aux=TaskStatus.ERROR)
                else:
                    tx = tx._replace(tasks=put(tx.tasks, w.slice_id,
                                               tx.tasks[w.slice_id]._replace(status=TaskStatus.ERROR)))
                s = self._set_tx(s, r, k, set_exception(tx)._replace(credits=tx.credits - 1))
            s = s._replace(flight=put(s.flight, r, put(s.flight[r], k, ())))
        return self._poll(s, r, fx)

    # -- the generation side ----------------------------------------------------------------------
    def _gen_post(self, s: PtState, r: int, fx: Effects) -> PtState:
        """The lowest free pages of the pool become request r's destination; REQUEST_DATA to the context ranks
        (without `promotion` it is on every rank at once and the request is promoted)."""
        pages = tuple(self._free_pages(s)[:self.cfg.cells_per_rank])
        s = self._set_rx(s, r, s.rx[r]._replace(state=S.DISAGG_GENERATION_TRANS_IN_PROGRESS, pages=pages), fx)
        if not self.cfg.promotion:
            q = s.reqs[r]
            s = self._set_req(s, r, q._replace(ctx=S.CONTEXT_INIT, peer_info=(True,) * self.k))
        return s

    def _remote_cancel(self, s: PtState, r: int, k: int) -> PtState:
        """CANCEL_SESSION reaches rank k: its session is cancelled; before one exists the cancel is remembered
        (a pre-cancel: the session will be created cancelled); a late one changes nothing."""
        rx = s.rx[r]
        s = s._replace(rx=put(s.rx, r, rx._replace(cancel_to=put(rx.cancel_to, k, False))))
        q, tx = s.reqs[r], s.tx[r][k]
        if q.freed or q.retired:
            return s
        if tx is None:
            return self._set_tx(s, r, k, cancel(NEW_TX)._replace(in_map=False))
        return self._set_tx(s, r, k, cancel(tx)) if tx.in_map else s

    # -- the receiver ---------------------------------------------------------------------------
    def _deliver(self, s: PtState, r: int, k: int, fx: Effects) -> PtState:
        f = s.frames[r][k][0]
        s = self._set_frames(s, r, k, s.frames[r][k][1:])
        rx = s.rx[r]
        if rx.state != S.DISAGG_GENERATION_TRANS_IN_PROGRESS or rx.crashed:
            return s  # a late result after the outcome is committed changes nothing
        if not f.is_aux and f.receiver_slice_id != 0:  # the receiver posted one task, slice 0
            s = checks.flag(s, "rx_resolves_task",
                            f"request {r}: result frame from rank {k} names receiver slice {f.receiver_slice_id}: "
                            f"expected 0 (the receiver's only task); the receiver crashes")
            return self._set_rx(s, r, rx._replace(crashed=True), fx)
        if not f.ok:
            return self._set_rx(s, r, rx._replace(state=S.DISAGG_TRANS_ERROR), fx)
        seen = rx.auxes[k] if f.is_aux else rx.finals[k]
        if self.variant.dedupe_results and (f.is_aux or f.is_last) and seen:
            return s  # this writer rank's result was counted already
        if f.is_aux:
            rx = rx._replace(auxes=put(rx.auxes, k, rx.auxes[k] + 1))
        elif f.is_last:
            rx = rx._replace(finals=put(rx.finals, k, rx.finals[k] + 1))
        if sum(rx.finals) == self.k and sum(rx.auxes) == self.k:  # last_slice_count == expected_transfers, aux
            rx = rx._replace(state=S.DISAGG_GENERATION_TRANS_COMPLETE)
        return self._set_rx(s, r, rx, fx)

    # -- helpers ---------------------------------------------------------------------------------
    def _free(self, s: PtState, r: int, ctx: LlmRequestState, fx: Effects) -> PtState:
        q = s.reqs[r]
        fx.append(PagesFreed(r))
        fx.append(CtxConcluded(r, int(ctx)))
        return self._set_req(s, r, q._replace(freed=q.freed + 1, pinned=False, ctx=ctx))

    def _set_req(self, s: PtState, r: int, q: Req) -> PtState:
        old = s.reqs[r]
        if old.freed and old.ctx != q.ctx:
            s = checks.flag(s, "S9_outcome_stable", f"request {r}: context outcome {old.ctx.name} changed to "
                                                    f"{q.ctx.name}: expected it to stay")
        return s._replace(reqs=put(s.reqs, r, q))

    def _set_rx(self, s: PtState, r: int, rx: Rx, fx: Effects) -> PtState:
        old = s.rx[r]
        if old.state != rx.state:
            if old.state not in RX_OPEN:
                s = checks.flag(s, "S9_outcome_stable", f"request {r}: receiver outcome {old.state.name} changed "
                                                        f"to {rx.state.name}: expected it to stay")
            if rx.state not in RX_OPEN:
                fx.append(RxConcluded(r, int(rx.state)))
        return s._replace(rx=put(s.rx, r, rx))

    @staticmethod
    def _set_tx(s: PtState, r: int, k: int, tx: TxSession) -> PtState:
        return s._replace(tx=put(s.tx, r, put(s.tx[r], k, tx)))

    @staticmethod
    def _set_frames(s: PtState, r: int, k: int, frames: tuple) -> PtState:
        return s._replace(frames=put(s.frames, r, put(s.frames[r], k, frames)))


# -- the rules: each action's precondition beside its effect, by record type ----------------------------------
# An effect is `effect(system, state, action, fx) -> state`, appending what it did to `fx`; a precondition is
# `when(system, state, action)`, the condition `enabled` lists the action under.
RULES = Rules()


@RULES.rule(Compute, when=lambda self, s, a: self.computing(s.reqs[a.rid]))
def _compute(self: PipelinedTransfer, s: PtState, a: Compute, fx: Effects) -> PtState:
    return self._compute(s, a.rid, fx)


@RULES.rule(PeerInfo, when=lambda self, s, a: self._awaits_promotion(s, a.rid) and not s.reqs[a.rid].peer_info[a.rank])
def _peer_info(self: PipelinedTransfer, s: PtState, a: PeerInfo, fx: Effects) -> PtState:
    q = s.reqs[a.rid]  # has_all_peer_req_infos_for_send on that rank
    return self._set_req(s, a.rid, q._replace(peer_info=put(q.peer_info, a.rank, True)))


@RULES.rule(Promote, when=lambda self, s, a: self._awaits_promotion(s, a.rid) and all(s.reqs[a.rid].peer_info))
def _promote(self: PipelinedTransfer, s: PtState, a: Promote, fx: Effects) -> PtState:
    # consensus over the TP ranks: DISAGG_CONTEXT_WAIT_SCHEDULER -> CONTEXT_INIT
    return self._set_req(s, a.rid, s.reqs[a.rid]._replace(ctx=S.CONTEXT_INIT))


@RULES.rule(WriteDone, when=lambda self, s, a: a.index in self._settling(s, a.rid, a.rank))
def _write_done(self: PipelinedTransfer, s: PtState, a: WriteDone, fx: Effects) -> PtState:
    return self._settle(s, a.rid, a.rank, a.index, True, fx)


@RULES.rule(Deliver, when=lambda self, s, a: self._deliverable(s, a.rid, a.rank))
def _deliver(self: PipelinedTransfer, s: PtState, a: Deliver, fx: Effects) -> PtState:
    return self._deliver(s, a.rid, a.rank, fx)


@RULES.rule(Poll, when=lambda self, s, a: self.poll_enabled(s, a.rid))
def _poll(self: PipelinedTransfer, s: PtState, a: Poll, fx: Effects) -> PtState:
    return self._poll(s, a.rid, fx)


@RULES.rule(Timeout, when=lambda self, s, a: self._can_time_out(s, a.rid))
def _timeout(self: PipelinedTransfer, s: PtState, a: Timeout, fx: Effects) -> PtState:
    return self._timeout(s, a.rid, fx)


@RULES.rule(StallReport, when=lambda self, s, a: self._can_report_stall(s, a.rid))
def _stall_report(self: PipelinedTransfer, s: PtState, a: StallReport, fx: Effects) -> PtState:
    fx.append(Stalled(a.rid))
    return self._set_req(s, a.rid, s.reqs[a.rid]._replace(stalled=True))


@RULES.rule(Fence, when=lambda self, s, a: self._can_fence(s, a.rid))
def _fence(self: PipelinedTransfer, s: PtState, a: Fence, fx: Effects) -> PtState:
    return self._fence(s, a.rid, fx)


@RULES.rule(RxTimeout, when=lambda self, s, a: self._can_rx_time_out(s, a.rid))
def _rx_timeout(self: PipelinedTransfer, s: PtState, a: RxTimeout, fx: Effects) -> PtState:
    return self._set_rx(s, a.rid, s.rx[a.rid]._replace(state=S.DISAGG_TRANS_ERROR), fx)


@RULES.rule(GenPost, when=lambda self, s, a: self._can_post(s, a.rid))
def _gen_post(self: PipelinedTransfer, s: PtState, a: GenPost, fx: Effects) -> PtState:
    return self._gen_post(s, a.rid, fx)


@RULES.rule(RemoteCancel, when=lambda self, s, a: self._cancel_in_flight(s, a.rid, a.rank))
def _remote_cancel(self: PipelinedTransfer, s: PtState, a: RemoteCancel, fx: Effects) -> PtState:
    return self._remote_cancel(s, a.rid, a.rank)


@RULES.rule(GenRelease, when=lambda self, s, a: self._may_release(s, a.rid))
def _gen_release(self: PipelinedTransfer, s: PtState, a: GenRelease, fx: Effects) -> PtState:
    rx = s.rx[a.rid]
    fx.append(DestReleased(a.rid, rx.pages))
    return self._set_rx(s, a.rid, rx._replace(releases=rx.releases + 1), fx)


@RULES.rule(CancelAck, when=lambda self, s, a: self._ack_due(s, a.rid, a.rank))
def _cancel_ack(self: PipelinedTransfer, s: PtState, a: CancelAck, fx: Effects) -> PtState:
    rx = s.rx[a.rid]
    return self._set_rx(s, a.rid, rx._replace(acks=put(rx.acks, a.rank, ACK_RECEIVED)), fx)


@RULES.rule(RxStall, when=lambda self, s, a: self._can_rx_stall(s, a.rid))
def _rx_stall(self: PipelinedTransfer, s: PtState, a: RxStall, fx: Effects) -> PtState:
    fx.append(Stalled(a.rid))
    return self._set_rx(s, a.rid, s.rx[a.rid]._replace(stalled=True), fx)


# -- faults: each spends one unit of the budget first -------------------------------------------------------
def _spend(s: PtState) -> PtState:
    return s._replace(faults_left=s.faults_left - 1)


@RULES.rule(DropAck, when=lambda self, s, a: self._may_fault(s, "drop") and self._ack_due(s, a.rid, a.rank))
def _drop_ack(self: PipelinedTransfer, s: PtState, a: DropAck, fx: Effects) -> PtState:
    s = _spend(s)
    rx = s.rx[a.rid]
    return self._set_rx(s, a.rid, rx._replace(acks=put(rx.acks, a.rank, ACK_LOST)), fx)


@RULES.rule(WriteFail,
             when=lambda self, s, a: self._may_fault(s, "fail") and a.index in self._settling(s, a.rid, a.rank))
def _write_fail(self: PipelinedTransfer, s: PtState, a: WriteFail, fx: Effects) -> PtState:
    return self._settle(_spend(s), a.rid, a.rank, a.index, False, fx)


@RULES.rule(DropFrame, when=lambda self, s, a: self._may_fault(s, "drop") and bool(s.frames[a.rid][a.rank]))
def _drop_frame(self: PipelinedTransfer, s: PtState, a: DropFrame, fx: Effects) -> PtState:
    s = _spend(s)
    r, k = a.rid, a.rank
    return self._set_frames(s, r, k, s.frames[r][k][1:])


@RULES.rule(DupFrame, when=lambda self, s, a: self._may_fault(s, "dup") and bool(s.frames[a.rid][a.rank]))
def _dup_frame(self: PipelinedTransfer, s: PtState, a: DupFrame, fx: Effects) -> PtState:
    s = _spend(s)
    r, k = a.rid, a.rank
    frames = s.frames[r][k]
    return self._set_frames(s, r, k, frames[:1] + frames)


@RULES.rule(Silent, when=lambda self, s, a: self._may_fault(s, "silent") and self._can_go_silent(s, a.rid))
def _silent(self: PipelinedTransfer, s: PtState, a: Silent, fx: Effects) -> PtState:
    s = _spend(s)
    return self._set_req(s, a.rid, s.reqs[a.rid]._replace(silent=True))


@RULES.rule(Cancel, when=lambda self, s, a: self._may_fault(s, "cancel") and self._can_cancel(s, a.rid))
def _cancel(self: PipelinedTransfer, s: PtState, a: Cancel, fx: Effects) -> PtState:
    return self._cancel(_spend(s), a.rid, fx)


@RULES.rule(Shutdown, when=lambda self, s, a: self._may_fault(s, "shutdown") and self._any_open(s))
def _shutdown(self: PipelinedTransfer, s: PtState, a: Shutdown, fx: Effects) -> PtState:
    s = _spend(s)
    for r, q in enumerate(s.reqs):
        if s.rx[r].state == S.DISAGG_GENERATION_INIT:  # never posted: both sides concluded, nothing held
            s = self._set_rx(s, r, s.rx[r]._replace(state=S.DISAGG_TRANS_ERROR), fx)
            s = self._free(self._set_req(s, r, q._replace(stopping=True)), r, S.DISAGG_TRANS_ERROR, fx)
        elif not q.stopping and not q.freed:
            s = self._cancel(s, r, fx)
    return s


@RULES.rule(GenCancel, when=lambda self, s, a: self._may_fault(s, "gen_cancel") and self._can_gen_cancel(s, a.rid))
def _gen_cancel(self: PipelinedTransfer, s: PtState, a: GenCancel, fx: Effects) -> PtState:
    s = _spend(s)  # the receive session is cancelled; CANCEL_SESSION to every context rank
    rx = s.rx[a.rid]
    return self._set_rx(s, a.rid, rx._replace(state=S.DISAGG_TRANS_ERROR, gen_cancelled=True,
                                              cancel_to=(True,) * self.k), fx)


@RULES.rule(DropCancel, when=lambda self, s, a: self._may_fault(s, "drop") and self._cancel_in_flight(s, a.rid, a.rank))
def _drop_cancel(self: PipelinedTransfer, s: PtState, a: DropCancel, fx: Effects) -> PtState:
    s = _spend(s)
    rx = s.rx[a.rid]
    return s._replace(rx=put(s.rx, a.rid, rx._replace(cancel_to=put(rx.cancel_to, a.rank, False))))
