"""Invariants of the pipelined-transfer transition system (research note section 1.9), on every state.

Checked on state, data where possible: S1 against the writes in flight, on
both ends of each write: its source pages (the context side's free record)
and its destination pages (the receiver's pool: each in-flight write's pages
must still be held by its own request, not released nor reallocated to
another), S5 on the destination cells. What only a transition can
see (a receiver indexing a task it does not have, an outcome changing, a
cancel_request returning True with credits outstanding) is recorded as a flag
by the step that does it. S4 (coverage) and S10 (gates) are properties of the
pure functions (`chunks`, `gates`), not of a run.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.system import Invariant, Sometimes, flag, flagged

from .status import TERMINAL_SESSION, LlmRequestState, TaskStatus, is_completed, tx_status

S = LlmRequestState
FLAGGED = ("rx_resolves_task", "S9_outcome_stable", "E2_cancel_true_once")


def reachable() -> tuple[Sometimes, ...]:
    """What some path must reach, or the invariants hold vacuously: a transfer ends either way, pages come back."""
    return (
        Sometimes("a_transfer_completes",
                  lambda s: any(rx.state == LlmRequestState.DISAGG_GENERATION_TRANS_COMPLETE for rx in s.rx),
                  "a receive session completes: every rank's final slice and aux result counted"),
        Sometimes("a_transfer_fails", lambda s: any(rx.state == LlmRequestState.DISAGG_TRANS_ERROR for rx in s.rx),
                  "a receive session ends in error"),
        Sometimes("context_pages_released", lambda s: any(q.freed for q in s.reqs),
                  "a request's context pages go back (once: E1)"),
        Sometimes("receiver_pages_released", lambda s: any(rx.releases for rx in s.rx),
                  "a receive session's destination pages go back to the free list"),
    )


def invariants(system: Any) -> tuple[Invariant, ...]:
    cfg = system.cfg
    blocks, per_rank = cfg.blocks, cfg.cells_per_rank

    def s1(s: Any) -> str | None:
        for r, q in enumerate(s.reqs):
            rx = s.rx[r]
            for k, fl in enumerate(s.flight[r]):
                for w in fl:
                    if w.is_aux or not w.cells:
                        continue
                    if q.freed:
                        pages = sorted(b for b, _ in w.cells)
                        return (f"request {r} rank {k}: pages {pages} freed while slice {w.slice_id}'s write reads "
                                f"them: expected no page freed with an unsettled accessor")
                    if not rx.held:
                        u = min(u for u, _ in w.cells)
                        page = rx.pages[u] if rx.pages else None
                        owner = next((o for o, other in enumerate(s.rx) if other.held and page in other.pages), None)
                        now = "free" if owner is None else f"reallocated to request {owner}"
                        return (f"request {r} rank {k}: destination page {page} (block {u % blocks}) released by the "
                                f"receiver ({now}) while slice {w.slice_id}'s write into it is in flight: expected "
                                f"no page released or reallocated with an unsettled accessor")
        held = [p for rx in s.rx if rx.held for p in rx.pages]
        if len(held) != len(set(held)):
            return f"receiver pages {sorted(held)}: a page allocated to two requests at once: expected each once"
        return None

    def s2(s: Any) -> str | None:
        for r in range(len(s.reqs)):
            for k, fl in enumerate(s.flight[r]):
                tx = s.tx[r][k]
                if fl and (tx is None or not tx.in_map):
                    return (f"request {r} rank {k}: {len(fl)} writes in flight, has_inflight_transfer False: "
                            f"expected the session still registered")
                credits = tx.credits if tx is not None else 0
                if credits != len(fl):
                    return f"request {r} rank {k}: credits {credits}: expected {len(fl)} (the writes in flight)"
        return None

    def s3(s: Any) -> str | None:
        for r, q in enumerate(s.reqs):
            if q.ctx == S.DISAGG_CONTEXT_COMPLETE:
                for k, tx in enumerate(s.tx[r]):
                    if tx is None or not is_completed(tx, True):
                        got = "no session" if tx is None else (
                            f"final slice submitted {tx.final}, tasks {[int(t.status) for t in tx.tasks]}, aux "
                            f"{None if tx.aux is None else int(tx.aux)}")
                        return (f"request {r} reported complete on the context side with rank {k}: {got}: expected "
                                f"the final slice submitted and every KV and aux task TRANSFERRED")
            rx = s.rx[r]
            if rx.state == S.DISAGG_GENERATION_TRANS_COMPLETE:
                for k, tx in enumerate(s.tx[r]):
                    unfinished = [t.slice_id for t in (tx.tasks if tx else ()) if t.status != TaskStatus.TRANSFERRED]
                    if tx is None or not tx.final or unfinished or rx.finals[k] < 1:
                        return (f"request {r}: generation state 12 with rank {k}'s final-slice results "
                                f"{rx.finals[k]} and slices {unfinished} not written: expected every rank's final "
                                f"SUCCESS and all its earlier slices complete")
        return None

    def s5(s: Any) -> str | None:
        for r, rx in enumerate(s.rx):
            if rx.state != S.DISAGG_GENERATION_TRANS_COMPLETE:
                continue
            bad = [(i // per_rank, i % per_rank, v) for i, v in enumerate(rx.dest) if v != cfg.expected(i % per_rank)]
            if bad:
                k, u, v = bad[0]
                g, b = divmod(u, blocks)
                where = f"destination block {b} of rank {k}" + (f" (layer group {g})" if g else "")
                return (f"request {r}: {where} holds {v} of {cfg.full(b)} tokens after completion: expected "
                        f"{cfg.expected(u)} (the fully computed source block, or nothing outside a window)")
        return None

    def s6(s: Any) -> str | None:
        for r, row in enumerate(s.tx):
            for k, tx in enumerate(row):
                if tx is None:
                    continue
                ids = [t.slice_id for t in tx.tasks]
                lasts = [i for i, t in enumerate(tx.tasks) if t.is_last]
                if ids != list(range(len(ids))) or len(lasts) > 1 or (lasts and lasts[0] != len(ids) - 1):
                    return (f"request {r} rank {k}: slice ids {ids}, is_last at {lasts}: expected 0..n-1 and "
                            f"is_last only on the highest")
        return None

    def s7(s: Any) -> str | None:
        for r, q in enumerate(s.reqs):
            if q.computed < system.n or q.stopping or q.retired or q.freed:
                continue
            for k, tx in enumerate(s.tx[r]):
                if tx is not None and tx_status(tx) in TERMINAL_SESSION:
                    break
            else:
                missing = [k for k, tx in enumerate(s.tx[r]) if tx is None or not tx.final]
                if missing:
                    return (f"request {r}: prefill complete, not cancelled, ranks {missing} emitted no final slice: "
                            f"expected a final slice on every rank")
        return None

    def s8(s: Any) -> str | None:
        for r, q in enumerate(s.reqs):
            if q.ctx != S.DISAGG_CONTEXT_COMPLETE:
                continue
            bad = [k for k, tx in enumerate(s.tx[r]) if tx is not None and tx_status(tx) in TERMINAL_SESSION]
            if bad:
                return f"request {r}: completed while ranks {bad} report cancelled or failed: expected no completion"
        return None

    def e1(s: Any) -> str | None:
        for r, q in enumerate(s.reqs):
            if q.freed > 1:
                return f"request {r}: pages released {q.freed} times: expected once"
            if s.rx[r].releases > 1:
                return f"request {r}: destination pages released {s.rx[r].releases} times: expected once"
            for k, tx in enumerate(s.tx[r]):
                if tx is None:
                    continue
                if tx.aux_frees > 1 or (tx.aux_frees and tx.aux is None):
                    return (f"request {r} rank {k}: aux slot freed {tx.aux_frees} times (aux task "
                            f"{'created' if tx.aux is not None else 'never created'}): expected once per slot")
                if tx.aux_frees and any(w.is_aux for w in s.flight[r][k]):
                    return (f"request {r} rank {k}: aux slot freed while the aux write reads it: expected it "
                            f"freed after the write settles")
                if q.freed and tx.aux is not None and not tx.aux_frees:
                    return (f"request {r} rank {k}: request released with its aux slot still held: expected the "
                            f"slot freed at finalization (a leak)")
            if q.notices > 1:
                return f"request {r}: cancel notification sent {q.notices} times: expected at most once"
            if q.freed and q.pinned:
                return f"request {r}: pages released while start_transfer's pins are held: expected unpinned"
        return None

    e2_flag = flagged("E2_cancel_true_once")

    def e2(s: Any) -> str | None:
        for r, q in enumerate(s.reqs):
            if q.retired and any(t is not None and t.in_map for t in s.tx[r]):
                return (f"request {r}: cancel_request returned True with a session still in the send-session map: "
                        f"expected it gone from both maps")
        return e2_flag(s)

    return (
        Invariant("S1_no_use_after_free", s1, "no page is freed while a write that reads it is unsettled, and no "
                                              "destination page is released or reallocated while a write into it "
                                              "is"),
        Invariant("rx_resolves_task", flagged("rx_resolves_task"),
                  "the single-task receiver finds its task for every result frame (#15519)"),
        Invariant("S3_no_early_completion", s3,
                  "complete only after the final slice, every KV task and aux; gen 12 only after every rank's "
                  "final SUCCESS and its earlier slices"),
        Invariant("S5_content_fresh", s5, "every destination block holds the fully computed source block"),
        Invariant("S2_ownership_covers_flight", s2, "writes in flight => registered session; credits = in flight"),
        Invariant("S6_slice_ids", s6, "slice ids 0..n-1 in submission order, is_last only on the highest"),
        Invariant("S7_final_slice_always", s7, "a finished, uncancelled prefill emits a final slice on every rank"),
        Invariant("S8_consensus", s8, "completed only if no rank reports cancelled or failed"),
        Invariant("S9_outcome_stable", flagged("S9_outcome_stable"), "a committed outcome never changes"),
        Invariant("E1_released_once", e1, "context and receiver pages released once, unpinned; the aux slot freed "
                                          "once, after its write, never leaked; one cancel notification"),
        Invariant("E2_cancel_true_once", e2,
                  "cancel_request returns True only with no credits outstanding, and the session is then gone"),
    )
