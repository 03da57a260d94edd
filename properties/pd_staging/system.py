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

Each finding carries its verdict per release (`verdicts`), settled by explore on
`sglang_0_5_23` (the deferred decode KV release, PP prefill writers, the
whole-chunk re-enqueue); the findings that 0.5.23's model turned up (dup-ready
through the re-enqueue, the re-send into a freed slot, the stale write after the
release timeout) are in `findings`. Functions are named as in SGLang 0.5.23 (`Class.method`),
checked against the release by tests/app/test_findings_report.py.
"""

from __future__ import annotations

from kvsim.engine.property import stateful_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict

MODEL = "pd-staging"
SOURCE = "sglang 05c7ebf (PR #30545)"

# upstream paths: SGLang's repository (research note ../shared/research/sglang_findings_0.5.23.md has file:line)
DISAGG = "python/sglang/srt/disaggregation"
STAGING_HANDLER = f"{DISAGG}/common/staging_handler.py"
STAGING_BUFFER = f"{DISAGG}/common/staging_buffer.py"
MOONCAKE = f"{DISAGG}/mooncake/conn.py"
COMMON_CONN = f"{DISAGG}/common/conn.py"
DECODE = f"{DISAGG}/decode.py"
AT_05C7EBF = "05c7ebf (PR #30545)"

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
    affected="SGLang from 05c7ebf (PR #30545) through 0.5.23, PD disaggregation with Mooncake staging, one prefill "
             "writer per decode rank (prefill TP <= decode TP) and a request of two or more staging chunks",
    upstream_files=(
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.advance_scatter",),
                     "completes a room when no allocated slot remains"),
        UpstreamSite(STAGING_HANDLER, ("prefetch_staging_reqs", "handle_staging_req"),
                     "one STAGING_REQ per (room, chunk, session); a lost one is never re-sent"),
        UpstreamSite(MOONCAKE, ("MooncakeKVManager.transfer_worker", "MooncakeKVManager._do_staging_transfer"),
                     "re-enqueues the chunk with no offset forever"),
        UpstreamSite(COMMON_CONN, ("CommonKVManager.conclude_transfer", "CommonKVSender.poll"),
                     "the last chunk still sends Success; the sender holds Transferring with no timeout"),
    ),
    harm="silent KV corruption",
    consequence="Decode commits the request with the rows of the lost chunk never written and decodes from "
                "whatever the KV pages held before; the prefill sender stays Transferring with its KV pages held "
                "and its transfer worker spinning on the chunk.",
    fix="Decode completes a room only when every expected chunk index (ceil(suffix_pages / F)) has been scattered, "
        "not when no allocated slot remains; or the prefill re-sends a STAGING_REQ (or fails the room) when a chunk's "
        "offset stalls (open PR #29978).",
    verdicts=(Verdict(AT_05C7EBF, "present"),
              Verdict("0.5.23", "present", "advance_scatter's completion rule and the one-shot prefetch are "
                                           "unchanged; PR #29978 (re-send on lost control messages) is not merged; "
                                           "explore on sglang_0_5_23 with these params: 10 steps; the completion "
                                           "rule fails the property on 0.5.19's and 0.5.23's own advance_scatter "
                                           "(kvsim conform sglang --target staging-completion)")),
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
    affected="SGLang 0.5.23 with Mooncake staging, pipeline-parallel prefill and prefill TP < decode TP (several "
             "writers per decode rank and several destinations per prefill rank); at 05c7ebf the counting rule is "
             "there but nothing produces a duplicate",
    upstream_files=(
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.handle_chunk_arrived",),
                     "completes the fan-in on len(arrivals) >= num_writers, counting entries, not writers"),
        UpstreamSite(MOONCAKE, ("MooncakeKVManager.transfer_worker", "MooncakeKVManager._do_staging_transfer"),
                     "re-enqueues a whole chunk when one destination is deferred: destinations already written get "
                     "a second RDMA and a second CHUNK_READY; writer_id is the decode session, the same for all"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.num_writers_for",),
                     "W = tp_writers * pp_writers since PP staging"),
    ),
    harm="silent KV corruption",
    consequence="The duplicate completes the fan-in before another writer (another PP stage's layers) has written, "
                "so decode scatters those heads or layers from stale ring bytes and decodes from them.",
    fix="Deduplicate arrivals by the prefill writer (pp_rank, tp_rank) rather than counting list entries, and record "
        "per-destination progress in TransferKVChunk so a retry re-sends only the deferred destinations.",
    verdicts=(Verdict(AT_05C7EBF, "not reachable", "the counting rule is there, but with W >= 2 each prefill rank has "
                                                   "one destination per room and ZMQ over TCP does not duplicate"),
              Verdict("0.5.23", "present", "reachable: the transfer worker's whole-chunk re-enqueue duplicates "
                                           "CHUNK_READY, and PP prefill writers give W >= 2 with several "
                                           "destinations per rank (sglang-0523-staging-dup-ready-reenqueue); the "
                                           "count fails S11 on 0.5.23's own handle_chunk_arrived (kvsim conform "
                                           "sglang --target staging-fan-in)")),
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
    verdicts=(Verdict(AT_05C7EBF, "not reachable", "a room's chunks share one queue and one worker thread, so the "
                                                   "skip-path pop never races a live decrement"),
              Verdict("0.5.23", "not reachable", "the same one-queue-per-room rule; the invariant holds on "
                                                 "sglang_0_5_23 with these params")),
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
    affected="SGLang 05c7ebf through 0.5.20 by default; 0.5.21 through 0.5.23 only with "
             "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0 or after its 30 s release timeout",
    upstream_files=(
        UpstreamSite(DECODE, ("DecodeTransferQueue.pop_transferred", "DecodeTransferQueue._do_release",
                              "DecodeTransferQueue.resolve_deferred_releases"),
                     "releases a failed room's staging slots (deferred until every ABORT_ACK or its timeout since "
                     "#35049)"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.unregister_decode_req", "DecodeStagingHandler.release_room",
                                       "is_watermark_ready"),
                     "frees unscattered slots and broadcasts WATERMARK; round-0 slots always pass the gate"),
        UpstreamSite(MOONCAKE, ("MooncakeKVManager.transfer_worker",), "writes a queued chunk of the aborted room"),
    ),
    harm="silent KV corruption",
    consequence="Another room's slot on the wrapped ring receives the aborted room's KV, and that room is scattered "
                "and decoded from it.",
    fix="Release an aborted room's staging slots only after every prefill writer acknowledged the abort (the "
        "deferred decode KV release of #35049 / #35360), with no release on timeout while a write may be in flight.",
    verdicts=(Verdict(AT_05C7EBF, "present"),
              Verdict("0.5.23", "fixed", "in the default configuration (these params hold on sglang_0_5_23); still "
                                         "present with SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0 "
                                         "(deferred_release=0) or after its 30 s timeout when the ABORT is lost or "
                                         "overtaken (sglang-35049-staging-stale-write-after-timeout)",
                      fixed_in="0.5.21 (deferred decode KV release on by default; #35049, #35360)")),
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
    affected="SGLang from 05c7ebf (PR #30545) through 0.5.23, PD disaggregation with Mooncake staging; since #37166 "
             "(0.5.19) without any ring pressure",
    upstream_files=(
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler._send_watermark",
                                       "DecodeStagingHandler.register_wm_subscriber"),
                     "WATERMARK is best-effort (errors swallowed), re-sent only by a later free or to a new subscriber"),
        UpstreamSite(STAGING_BUFFER, ("StagingAllocator.free",), "an emptied ring starts a new round (#37166)"),
        UpstreamSite(MOONCAKE, ("MooncakeKVManager._do_staging_transfer",),
                     "re-enqueues the chunk every ~1 ms while the watermark is behind"),
        UpstreamSite(STAGING_HANDLER, ("is_watermark_ready",), "the gate the deferred chunk waits on"),
        UpstreamSite(COMMON_CONN, ("CommonKVReceiver._check_waiting_timeout",), "fails the room after 300 s"),
    ),
    harm="a hang until a timeout",
    consequence="The next room's chunk is re-enqueued every millisecond until the decode's 300 s waiting timeout "
                "fails the request; at a quiet moment one lost message is enough.",
    fix="Re-send the current watermark with every STAGING_RSP, or re-broadcast it periodically while deferred "
        "chunks exist (open PR #29978).",
    verdicts=(Verdict(AT_05C7EBF, "present", "after a ring wrap"),
              Verdict("0.5.23", "present", "wider: since #37166 an emptied ring starts a new round, so one lost "
                                           "WATERMARK stalls the next room with no ring pressure; PR #29978 is not "
                                           "merged")),
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
    affected="SGLang from 05c7ebf (PR #30545) through 0.5.23, Mooncake staging with two or more writers per decode "
             "rank (prefill TP > decode TP, or TP co-writers of one PP stage)",
    upstream_files=(
        UpstreamSite(STAGING_HANDLER, ("handle_staging_req",),
                     "deduplicates only on infos[chunk][0] >= 0, so a scattered (zeroed) slot is allocated again"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.submit_chunk_scatter",),
                     "zeroes a slot's entry to (-1, -1, 0, -1, 0) once its scatter is submitted"),
        UpstreamSite(STAGING_HANDLER, ("prefetch_staging_reqs",),
                     "sends STAGING_REQ on its own PUSH socket: no FIFO with CHUNK_READY"),
    ),
    harm="a hang until a timeout",
    consequence="The re-allocated slot is never scattered: the completed request fails at the 300 s staging "
                "completion deadline, and meanwhile the allocation pins the ring watermark for every room behind it.",
    fix="Keep a distinct 'scattered' state per chunk (e.g. offset -3) and answer a late STAGING_REQ from it without "
        "allocating.",
    verdicts=(Verdict(AT_05C7EBF, "present"),
              Verdict("0.5.23", "present", "the same code; needs the STAGING_REQ and CHUNK_READY sockets to reorder; "
                                           "explore on sglang_0_5_23 with these params: a hang in 8 steps; the "
                                           "dedupe re-allocates on 0.5.23's own handle_staging_req (kvsim conform "
                                           "sglang --target staging-dedupe)")),
)

LOST_WATERMARK_NO_PRESSURE = BugReport(
    id="sglang-37166-staging-lost-watermark-no-pressure",
    model=MODEL,
    variant="sglang_0_5_23",
    invariant="every_room_concludes",
    params={"rooms": 2, "prompt_len": 1, "faults": "drop_wm", "timeouts": 0},
    source="sglang 0.5.19+ (#37166 fresh round on an empty ring); open PR #29978",
    summary="since #37166 a free that empties the ring starts a new round, so one lost WATERMARK at a quiet moment "
            "leaves the next room's round-1 slot never ready, with no ring pressure (a hang without the clock; "
            "with it, the waiting timeout fails the room after 300 s)",
    status="open upstream",
    note="The same parameters hold on `fixed` (05c7ebf keeps the stale head: no new round without a wrap); the "
         "05c7ebf form needs ring_units=1 (sglang-05c7ebf-staging-lost-watermark). Found by exploring the "
         "sglang_0_5_23 variant, whose ring `kvsim conform sglang` checks in lockstep against 0.5.23's.",
    affected="SGLang 0.5.19 (#37166) through 0.5.23, PD disaggregation with Mooncake staging",
    upstream_files=(
        UpstreamSite(STAGING_BUFFER, ("StagingAllocator.free",), "an emptied ring starts a new round (#37166)"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler._send_watermark",
                                       "DecodeStagingHandler.register_wm_subscriber"),
                     "WATERMARK is best-effort (errors swallowed), re-sent only by a later free or to a new subscriber"),
        UpstreamSite(MOONCAKE, ("MooncakeKVManager._do_staging_transfer",),
                     "re-enqueues the chunk every ~1 ms while the watermark is behind"),
        UpstreamSite(STAGING_HANDLER, ("is_watermark_ready",), "the gate the deferred chunk waits on"),
    ),
    harm="a hang until a timeout",
    consequence="Any room that follows a quiet moment (the ring emptied) waits for a watermark that was lost: its "
                "chunk is re-enqueued every millisecond until the decode's 300 s waiting timeout fails the request.",
    fix="Re-send the current watermark with every STAGING_RSP, or re-broadcast it periodically while deferred "
        "chunks exist (open PR #29978).",
    verdicts=(Verdict(AT_05C7EBF, "not reachable", "without a wrap the next room's slot is in round 0"),
              Verdict("0.5.23", "present", "#37166 (0.5.19) starts round + 1 on every emptying free")),
)

