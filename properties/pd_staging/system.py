"""pd-staging transition system: invariants on data (S7, S9-S11, S13-S15, S17, L4), liveness, bug reports.

Research note ../shared/research/sglang.md, sections 2.4-2.9 (SGLang 05c7ebf,
PR #30545). The model is `models.pd_staging` (system), `data`
(who holds which (request, token, head)) and `checks` (the
invariants). Liveness `every_room_concludes` is L1-L3 without the clock:
from every reachable state some run concludes every room on both sides; the
completion deadline (L2) is the `deadline` action of `fixed`.

Each bug report names small `params`, found by `explore` on `pre_05c7ebf`
and absent on `fixed`. The three open findings of the research note were
checked against `fixed`: two reproduce (recorded "open upstream" with their
counterexamples), the third does not (recorded "not reproducible", with why).
"""

from __future__ import annotations

from kvsim.engine.property import stateful_property
from kvsim.engine.registry import BugReport

MODEL = "pd-staging"
SOURCE = "sglang 05c7ebf (PR #30545)"

STAGING_INVARIANTS = stateful_property(model=MODEL, name="staging_invariants", home=__name__,
                                       doc="S7, S9-S11, S13-S15, S17 and L4 hold on every step of Hypothesis-chosen "
                                           "interleavings of prefill batches, transfer workers, deliveries, scatter "
                                           "completions, timeouts and faults.")

PREFIX_OVERWRITE = BugReport(
    id="sglang-05c7ebf-staging-prefix-overwrite",
    model=MODEL,
    variant="pre_05c7ebf",
    invariant="shared_prefix_rows_unchanged",
    params={"chunked_prefill_size": 1, "prompt_len": 3, "decode_prefix_len": 1, "faults": ""},
    source=SOURCE,
    summary="decode radix hit: a non-last scatter used token_start = page_start * page_size without the decode "
            "prefix, writing suffix KV into the shared radix-prefix pages other requests read",
)

BLIND_TAIL = BugReport(
    id="sglang-05c7ebf-staging-blind-tail",
    model=MODEL,
    variant="pre_05c7ebf",
    invariant="suffix_rows_match_prefill",
    params={"chunked_prefill_size": 2, "prompt_len": 3, "decode_prefix_len": 1, "faults": "reorder"},
    source=SOURCE,
    summary="the last chunk sent no CHUNK_READY; on all-ranks Success decode scattered the last allocated slot "
            "from ceil(L/ps) minus the slot's page count, not from what was sent: rows get shifted KV and stale "
            "ring bytes",
    note="The send that was not grid-floored ends mid-slot, so the last send (1 page at suffix page 1) is written "
         "at slot 0's start; the tail scatter reads 2 pages for rows [1, 3). The Success status overtaking the "
         "earlier CHUNK_READY keeps the prefix-overwrite scatter from happening first.",
)

EARLY_TEARDOWN = BugReport(
    id="sglang-05c7ebf-staging-early-teardown",
    model=MODEL,
    variant="pre_05c7ebf",
    invariant="no_early_teardown",
    params={"chunked_prefill_size": 1, "prompt_len": 2, "faults": ""},
    source=SOURCE,
    summary="without _staging_outstanding the room was torn down on Success while a deferred earlier chunk was "
            "still queued; re-dequeued, it found no transfer_infos and was dropped, its slot never written",
)

NO_DEADLINE = BugReport(
    id="sglang-05c7ebf-staging-no-deadline",
    model=MODEL,
    variant="pre_05c7ebf",
    invariant="every_room_concludes",
    params={"chunked_prefill_size": 1, "prompt_len": 2, "faults": "drop_ready"},
    source=SOURCE,
    summary="no staging completion deadline: a CHUNK_READY lost after all-ranks Success leaves an allocated slot "
            "that is never scattered, and the decode room waits forever (explore reports a hang)",
)

UNALIGNED_PREFIX = BugReport(
    id="sglang-05c7ebf-staging-unaligned-prefix",
    model=MODEL,
    variant="pre_05c7ebf",
    invariant="unaligned_prefix_fails_room",
    params={"page_size": 2, "chunked_prefill_size": 2, "prompt_len": 4, "decode_prefix_len": 1, "faults": ""},
    source=SOURCE,
    summary="a decode prefix that is not page-aligned was accepted and scattered from misaligned rows instead of "
            "failing the room at registration",
)

# -- open findings of the research note, checked against `fixed` --------------------------------------

LOST_REQ_SUCCESS = BugReport(
    id="sglang-05c7ebf-staging-lost-req-success",
    model=MODEL,
    variant="fixed",
    invariant="success_commits_prefill_kv",
    params={"chunked_prefill_size": 1, "prompt_len": 2, "faults": "drop_req"},
    source="sglang 05c7ebf (PR #30545); open PR #29978",
    summary="a lost STAGING_REQ leaves slot 0 unallocated; the last chunk transfers and Mooncake sends Success, "
            "so decode sees no allocated slot and reports Success with slot 0's rows never written, while the "
            "prefill sender re-enqueues chunk 0 forever in Transferring",
    status="open upstream",
    note="With W > 1 writers the same slot is prefetched by every writer's session, so one lost STAGING_REQ is "
         "masked; with W = 1 (or all copies lost) it reproduces. The same configuration also hangs the prefill "
         "side (explore: every_room_concludes).",
)

DUP_READY = BugReport(
    id="sglang-05c7ebf-staging-dup-ready",
    model=MODEL,
    variant="fixed",
    invariant="suffix_rows_match_prefill",
    params={"writers": 2, "prompt_len": 1, "faults": "dup_ready", "timeouts": 0},
    source="sglang 05c7ebf (PR #30545)",
    summary="_writer_counts counts list entries, not distinct writers: a duplicated CHUNK_READY from writer 0 "
            "triggers the scatter before writer 1 wrote, so writer 1's heads are scattered from stale ring bytes",
    status="open upstream",
    note="Needs W >= 2 (P_tp > D_tp) and a duplicated control message; the model dedupes nothing, as the note "
         "reads the code.",
)

SKIP_POP = BugReport(
    id="sglang-05c7ebf-staging-skip-pop",
    model=MODEL,
    variant="fixed",
    invariant="no_room_state_after_teardown",
    params={"chunked_prefill_size": 1, "prompt_len": 2, "faults": "abort,drop_rsp,reorder", "fault_budget": 2},
    source="sglang 05c7ebf (PR #30545); #36707",
    summary="the skip path's _staging_outstanding.pop(room) erasing other chunks' counts: not reproducible "
            "within 05c7ebf",
    status="not reproducible",
    note="A room's chunks share one queue and one worker thread, so the pop never races a live decrement: it runs "
         "only when the room is Failed or cleared, and every later chunk of that room is skipped too. S17 "
         "(outstanding_never_negative) and L4 hold under aborts, lost STAGING_RSPs and reordering; in fact the pop "
         "is what empties the count a FAIL_ROOM or a deferred chunk left behind. The harm #36707 describes is to "
         "the deferred-ABORT_ACK release logic added after 05c7ebf, which this model does not contain.",
)

# -- further findings on `fixed` that the exhaustive search turned up ----------------------------------

STALE_WRITE_AFTER_RELEASE = BugReport(
    id="sglang-05c7ebf-staging-stale-write-after-release",
    model=MODEL,
    variant="fixed",
    invariant="suffix_rows_match_prefill",
    params={"rooms": 2, "prompt_len": 1, "ring_units": 1, "faults": "abort", "timeouts": 0},
    source="sglang 05c7ebf (PR #30545): release_room vs the prefill transfer worker [model finding]",
    summary="decode aborts room 0 (or its waiting timeout passes) and release_room frees its slot; the ring has "
            "wrapped, so room 1's round-1 slot covers the same bytes. Room 0's queued chunk still holds its "
            "round-0 offset (always watermark-ready) and writes before the ABORT reaches the prefill, so room 1 "
            "scatters room 0's KV",
    status="open upstream",
    note="Needs ring pressure (a wrap) and a decode-side failure racing a queued chunk. The watermark gate only "
         "keeps a newer round off live older data; nothing keeps a released older allocation's writer off a "
         "newer one. Reproduces with the waiting timeout instead of the abort (timeouts=1, faults none).",
)

LOST_WATERMARK = BugReport(
    id="sglang-05c7ebf-staging-lost-watermark",
    model=MODEL,
    variant="fixed",
    invariant="every_room_concludes",
    params={"rooms": 2, "prompt_len": 1, "ring_units": 1, "faults": "drop_wm", "timeouts": 0},
    source="sglang 05c7ebf (PR #30545); open PR #29978",
    summary="a lost WATERMARK leaves the prefill's remote watermark behind: the next room's wrapped slot is never "
            "ready and its chunk is re-enqueued forever (a hang without the clock; with it, the waiting timeout "
            "fails the room after 300 s)",
    status="open upstream",
    note="A later free re-broadcasts the watermark; here no later free exists.",
)

LATE_REQ_REALLOC = BugReport(
    id="sglang-05c7ebf-staging-late-req-realloc",
    model=MODEL,
    variant="fixed",
    invariant="every_room_concludes",
    params={"writers": 2, "prompt_len": 1, "faults": "reorder", "timeouts": 0},
    source="sglang 05c7ebf (PR #30545): STAGING_REQ dedupe vs the zeroed slot entry [model finding]",
    summary="with W = 2 every writer prefetches the slot; writer 1 writes with the offset sent to every bootstrap, "
            "its CHUNK_READY overtakes its own STAGING_REQ, the slot is scattered and its entry zeroed, and the late "
            "STAGING_REQ then allocates the slot again. That allocation is never scattered: without the clock the "
            "room never concludes; with it the completed transfer fails at the completion deadline 300 s later",
    status="open upstream",
    note="Rests on the note's dedupe rule (an entry zeroed after the scatter reads as 'not allocated'). The timed "
         "simulation shows it as 'Failed: staging completion deadline' under reordering with an ample ring.",
)
