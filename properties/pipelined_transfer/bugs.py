"""pipelined-transfer: the stateful property and the bug reports of section 1.12 (explore-driven).

Each report names small `params` (one request, one or two ranks, two chunks)
so `kvsim repro` explores the variant and `fixed` exhaustively in well under
a second. Two are open upstream and reproduce on `fixed` itself; each names
the proposed-fix variant that passes (`fix_variant`).
"""

from __future__ import annotations

from kvsim.engine.property import stateful_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict

MODEL = "pipelined-transfer"
SOURCE = "TensorRT-LLM #15727 (pipelined KV transfer, Python cache transceiver)"
DISAGG = "tensorrt_llm/_torch/disaggregation"
TRANSCEIVER = f"{DISAGG}/transceiver.py"
PY_EXECUTOR = "tensorrt_llm/_torch/pyexecutor/py_executor.py"
KV_TRANSCEIVER = "tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py"
NO_FAULTS = {"faults": "", "fault_budget": 0}

TRANSFER_INVARIANTS = stateful_property(
    model=MODEL, name="transfer_invariants", home=__name__,
    doc="S1-S3, S5-S9, E1 and E2 hold on every step of Hypothesis-chosen interleavings of forward steps, "
        "fabric writes, result frames, collective polls, timeouts and faults.")

SLICE_ID_CRASH = BugReport(
    id="trtllm-15519-slice-id-crash",
    model=MODEL,
    variant="pre_15519",
    invariant="rx_resolves_task",
    params=NO_FAULTS,
    source="TensorRT-LLM #15519 review (chunked KVCache transfer)",
    summary="a result frame carried one slice id, the sender's; the single-task receiver indexed its tasks by it, "
            "so the second chunk's result (slice_id 1) names a task the receiver never posted and crashes it",
    harm="a dead thread",
    fix="carry sender_slice_id and receiver_slice_id in the result frame; the receiver resolves by the receiver id "
        "(always 0 for one posted task)",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("RxSession", "KVRecvTask"), "resolves the task of a result frame"),),
)

EARLY_COMPLETION = BugReport(
    id="trtllm-17526-early-completion",
    model=MODEL,
    variant="pre_17526",
    invariant="S3_no_early_completion",
    params=NO_FAULTS,
    source="TensorRT-LLM #17526 review (bounded block-ID retrieval for pipelined chunks)",
    summary="nothing marks 'final slice submitted': between two chunks every registered KV task is TRANSFERRED, "
            "and a completion wait that skips the not-yet-created aux task reports COMPLETED mid-prefill, so the "
            "context side completes and frees its pages before the later chunks are sent",
    note="Upstream #15727 is saved only indirectly, by is_completed() requiring the aux task; the model's `fixed` "
         "adds the explicit flag the review asked for (status.is_completed).",
    harm="a wrong status",
    fix="record 'final slice submitted' in the TxSession and require it (and aux) for completion",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("TxSession.status", "TxSession.is_completed", "wait_complete"),
                                 "derives completion from the tasks registered so far"),),
)

FINAL_CHUNK_CLOCK = BugReport(
    id="trtllm-15727-final-chunk-clock",
    model=MODEL,
    variant="final_chunk_clock",
    invariant="E4_every_request_settles",
    params={"faults": "silent,cancel", "fault_budget": 2},
    source="TensorRT-LLM #15727 review 2026-08-14 (timeout monitored only from the last chunk)",
    summary="the timeout clock started at the final chunk: a peer that goes silent on chunk 0 of a request that "
            "is then cancelled (its final chunk is skipped) is never timed out, so no stall is ever reported and "
            "the request and its pages hang silently (E4)",
    note="With FIFO and no cancel the final chunk still arms the clock, which is why the review accepted it; the "
         "newer executor monitors mid-prefill requests that own an in-flight session (`clock_from_first_chunk`). "
         "The hang needs the final chunk skipped after the cancel (the newer coordinator, cancel_final=0, the "
         "default): with the older unconditional final chunk (cancel_final=1) the final chunk arms the clock and "
         "explore finds no hang. A shutdown instead of the cancel does the same.",
    harm="a hang",
    fix="start the transfer timeout at the first chunk's send (monitor any request owning an in-flight session)",
    upstream_files=(UpstreamSite(PY_EXECUTOR, ("_check_kv_transfer_timeout",), "flags timed-out requests"),),
)

NO_DRAIN_DEADLINE = BugReport(
    id="trtllm-15727-cancel-drain-no-deadline",
    model=MODEL,
    variant="fixed",
    invariant="E3_every_cancel_releases",
    params={"faults": "silent", "goal": "release"},
    source="TensorRT-LLM #15727 review 2026-08-21 (retirement waits for quiescence, with no bound)",
    summary="the cancel drain has no deadline: a silent peer keeps a write unsettled, retirement waits for "
            "quiescence on every rank for ever, and the timed-out, cancelled request holds its pages; the stall is "
            "reported once at 2x timeout but nothing is released (E3)",
    status="open upstream",
    note="Under the settle goal (E4) this is the expected outcome, a reported stall; under E3's release goal it is "
         "a hang. The proposed fix (`proposed_drain_deadline`) fences the domain at the stall report (the writes "
         "are aborted and can no longer land), then releases; S1 holds.",
    harm="a hang",
    fix="bound the drain: at the stall report fence the transfer (abort the fabric handles) and then retire and "
        "release",
    fix_variant="proposed_drain_deadline",
    upstream_files=(UpstreamSite(KV_TRANSCEIVER, ("cancel_request",), "returns False while a write is in flight"),
                    UpstreamSite(TRANSCEIVER, ("check_context_transfer_status",),
                                 "retires CANCELLED/ERROR only when every rank quiesced")),
    verdicts=(Verdict("#15727", "present", "author deferred the deadline to a follow-up"),),
)

DROPPED_NOTIFICATION = BugReport(
    id="trtllm-17665-dropped-notification",
    model=MODEL,
    variant="fixed",
    invariant="E4_every_request_settles",
    params={"faults": "drop"},
    source="TensorRT-LLM #17665 (open, 2026-08-13)",
    summary="one dropped completion notification (a result frame) and the receiver never reaches "
            "last_slice_count == expected_transfers: the generation request waits for ever while the context side "
            "completed and freed",
    status="open upstream",
    note="Any lost final-slice, aux or FAILED frame does it; a lost non-final SUCCESS does not (it only records "
         "the write). The proposed fix (`proposed_rx_deadline`) gives the receiver its own deadline.",
    harm="a hang",
    fix="a receive-side deadline (or a re-sent final status) so a missing notification fails the request",
    fix_variant="proposed_rx_deadline",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("RxSession", "KVRecvTask"), "counts final-slice results"),),
    verdicts=(Verdict("#15727", "present"),),
)

RETIRE_WITHOUT_QUIESCENCE = BugReport(
    id="trtllm-15727-retire-without-quiescence",
    model=MODEL,
    variant="local_quiescence",
    invariant="S1_no_use_after_free",
    params={"ranks": 2, "faults": "cancel"},
    source="TensorRT-LLM #15727 review 2026-08-21 (retire CANCELLED/ERROR only when quiesced on all ranks)",
    summary="retiring a cancelled session once one rank had quiesced freed the request's pages on every rank while "
            "another rank's write still read them: a use-after-free (S1)",
    harm="silent KV corruption",
    fix="retire CANCELLED/ERROR sessions only when every rank reports them quiesced (intersection)",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("check_context_transfer_status",), "the collective retirement"),),
)

FINAL_INTO_RETIRED = BugReport(
    id="trtllm-15727-final-chunk-into-retired-session",
    model=MODEL,
    variant="retired_unchecked",
    invariant="E4_every_request_settles",
    params={"cancel_final": 1, "timeouts": 0, "faults": "cancel"},
    source="TensorRT-LLM #15727 (older revision: the final chunk of a cancelled request sent unconditionally)",
    summary="a cancelled request that still computes and sends its final chunk after its session was retired: "
            "start_transfer pins the blocks, the send into the retired session is refused, and the request waits "
            "in DISAGG_CONTEXT_TRANS_IN_PROGRESS for a transfer that can never finish, blocks pinned",
    note="timeouts=0: the transfer timeout's cancel_request (no session left) is what finally frees it upstream.",
    harm="a hang until a timeout",
    fix="check py_kv_send_session_retired before start_transfer and fail the request (DISAGG_TRANS_ERROR)",
    upstream_files=(UpstreamSite(PY_EXECUTOR, ("_handle_responses", "respond_and_send_async"),
                                 "the final chunk: start_transfer, then the send"),),
)

DUPLICATED_RESULT = BugReport(
    id="trtllm-15727-duplicated-final-result",
    model=MODEL,
    variant="fixed",
    invariant="E4_every_request_settles",
    params={"faults": "dup"},
    source="TensorRT-LLM #15727 receiver completion rule [model finding]",
    summary="a duplicated final-slice result is counted twice: last_slice_count passes expected_transfers without "
            "ever equalling it, so the receiver never completes (with two writer ranks and a `>=` rule it would "
            "complete before the other rank's final slice instead)",
    status="open upstream",
    note="Rests on the research note's rule (a SUCCESS with is_last increments last_slice_count; complete on "
         "equality) and on a result arriving twice, which the lifecycle contract (tests/unittest/disaggregated/"
         "lifecycle_acceptance.md: duplicate completion reports must not change release counts) treats as "
         "possible. Not checked against the upstream receiver code; the proposed fix "
         "(`proposed_dedupe_results`) counts one final and one aux result per writer rank.",
    harm="a hang",
    fix="count final-slice and aux results per writer rank (a set of ranks), not per frame",
    fix_variant="proposed_dedupe_results",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("RxSession", "KVRecvTask"), "counts final-slice results"),),
    verdicts=(Verdict("#15727", "present", "if a result frame can be delivered twice"),),
)

DUPLICATED_RESULTS_COMPLETE_EARLY = BugReport(
    id="trtllm-15727-duplicated-results-complete-early",
    model=MODEL,
    variant="fixed",
    invariant="S3_no_early_completion",
    params={"ranks": 2, "faults": "dup", "fault_budget": 2},
    source="TensorRT-LLM #15727 receiver completion rule with TP fan-in [model finding]",
    summary="with two writer ranks, rank 0's final-slice result and its aux result each arriving twice reach "
            "last_slice_count == expected_transfers and the aux count before rank 1 has written anything: the "
            "receiver completes (state 12) and generation reads rank 1's head slice unwritten (S3 and S5)",
    status="open upstream",
    note="The same rests as trtllm-15727-duplicated-final-result (counting frames, not writer ranks; a result "
         "delivered twice). The timed simulation meets it too: `kvsim simulate pipelined-transfer --param "
         "ranks=4 --faults duplicate=0.01,drop=0.01` reports S3 on a request whose rank's final result was lost "
         "and another's duplicated.",
    harm="silent KV corruption",
    fix="count final-slice and aux results per writer rank (a set of ranks), not per frame",
    fix_variant="proposed_dedupe_results",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("RxSession", "KVRecvTask"),
                                 "completes on last_slice_count == expected_transfers"),),
    verdicts=(Verdict("#15727", "present", "if a result frame can be delivered twice"),),
)

RX_CANCEL_EARLY_RELEASE = BugReport(
    id="trtllm-rx-cancel-releases-early",
    model=MODEL,
    variant="fixed",
    invariant="S1_no_use_after_free",
    params={"faults": "gen_cancel"},
    source="TensorRT-LLM tests/unittest/disaggregated/lifecycle_acceptance.md (two strict xfail tests: the default, "
           "bridge-off receive cancellation releases pending destinations early)",
    summary="the generation side cancels its receive while the context side's chunk 0 is in flight: the default "
            "receive-cancellation path releases the destination pages at once, before CANCEL_SESSION reached the "
            "context ranks and they drained, so the write lands in pages back in the pool (or already reallocated "
            "to another request): a use-after-free on the receiver (S1)",
    status="open upstream",
    note="The ledger records the gap for the Python transceiver's receive path; its lifecycle profile excludes "
         "pipelining, so this rests on pipelined transfer sharing that receive path (not checked against the "
         "pipelined receiver's code). With pipelining the window is wider: chunks are in flight during prefill. "
         "With a shared pool (`--param rx_pages=3 requests=2`) the freed pages are reallocated to the next "
         "request. The proposed fix (`proposed_rx_release_after_drain`) releases only once every context rank's "
         "cancel-ACK arrived (sent after that rank drained, section 1.6); S1 and E3/E4 then hold. A lost ACK "
         "(`drop`) keeps the pages: the receiver's deadline reports the stall (E4 settles; E3 does not release).",
    harm="silent KV corruption",
    fix="hold the destination pages of a cancelled receive until every context rank acknowledged the cancel after "
        "draining its writes (or the domain is fenced)",
    fix_variant="proposed_rx_release_after_drain",
    upstream_files=(UpstreamSite(TRANSCEIVER, ("RxSession", "cancel"), "the receive session's cancellation"),
                    UpstreamSite(KV_TRANSCEIVER, ("cancel_request",), "releases the request's resources")),
    verdicts=(Verdict("#15727", "present", "the lifecycle ledger's strict xfails"),),
)
