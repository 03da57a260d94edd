"""pd-staging findings on SGLang 0.5.23's model: what `sglang_0_5_23` (the deferred decode KV release, PP prefill
writers, the Mooncake worker's whole-chunk re-enqueue) lets explore reach that 05c7ebf's model could not.

`proposed_per_dst_retry` (0.5.23 with per-destination progress on a retry, not a release) is the modelled fix
where there is one. Functions are named as in SGLang 0.5.23 (`Class.method`), checked against the release by
tests/app/test_findings_report.py. The earlier findings, and their verdicts on 0.5.23, are in `system`.
"""

from __future__ import annotations

from kvsim.engine.registry import BugReport, UpstreamSite, Verdict

from .system import AT_05C7EBF, DECODE, MODEL, MOONCAKE, STAGING_HANDLER


PROPOSED_FIX = "proposed_per_dst_retry"  # 0.5.23 with per-destination progress on a retry (not a release)

DUP_READY_REENQUEUE = BugReport(
    id="sglang-0523-staging-dup-ready-reenqueue",
    model=MODEL,
    variant="sglang_0_5_23",
    invariant="suffix_rows_match_prefill",
    params={"writers": 2, "dsts": 2, "prompt_len": 1, "faults": "defer_dst", "timeouts": 0},
    source="sglang 0.5.23: PP staging (num_writers_for) + the Mooncake worker's whole-chunk re-enqueue",
    summary="two PP prefill stages write one room, each to two decode ranks; stage 0 writes this rank, its other "
            "destination defers, and the whole chunk is re-enqueued, so the retry writes this rank again and sends "
            "a second CHUNK_READY. The fan-in counts two arrivals (the same decode session id) and scatters before "
            "stage 1 wrote: stage 1's part is scattered from stale ring bytes",
    status="open upstream",
    note="dup-ready reached through the real code, no network fault: the re-enqueue is normal operation whenever a "
         "sibling decode rank's slot offset or watermark is not ready. On 05c7ebf W >= 2 with several destinations "
         "per prefill rank cannot be configured (num_writers_for had no PP term), so the duplicate met a zeroed slot.",
    affected="SGLang 0.5.23 (since PP staging), Mooncake staging with pipeline-parallel prefill and prefill TP < "
             "decode TP",
    upstream_files=(
        UpstreamSite(MOONCAKE, ("MooncakeKVManager.transfer_worker", "MooncakeKVManager._do_staging_transfer"),
                     "a deferred destination re-enqueues the whole chunk (queue.put; break); nothing records which "
                     "destinations were already written"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.handle_chunk_arrived",
                                       "DecodeStagingHandler.num_writers_for"),
                     "completes the fan-in on len(arrivals) >= tp_writers * pp_writers, counting entries"),
    ),
    harm="silent KV corruption",
    consequence="Decode scatters one PP stage's layers from stale ring bytes and decodes from them; the request "
                "reports Success.",
    fix="Record per-destination progress in TransferKVChunk so a retry re-sends only the deferred destinations; "
        "and deduplicate fan-in arrivals by the prefill (pp_rank, tp_rank).",
    fix_variant=PROPOSED_FIX,
    verdicts=(Verdict(AT_05C7EBF, "not reachable", "W >= 2 needs prefill TP > decode TP there, and then each prefill "
                                                   "rank has one destination"),
              Verdict("0.5.23", "present", "explore on sglang_0_5_23: 7 steps, 625 states")),
)

RESEND_AFTER_FREE = BugReport(
    id="sglang-05c7ebf-staging-resend-after-free",
    model=MODEL,
    variant="fixed",
    invariant="suffix_rows_match_prefill",
    params={"rooms": 2, "dsts": 2, "prompt_len": 1, "ring_units": 1, "faults": "defer_dst", "timeouts": 0},
    source="sglang 05c7ebf (PR #30545) through 0.5.23: the Mooncake worker's whole-chunk re-enqueue [model finding]",
    summary="room 0's chunk is written and its CHUNK_READY sent, then a sibling destination defers and the whole "
            "chunk is re-enqueued behind room 1's. Decode scatters room 0 and frees the slot; the wrapped ring gives "
            "it to room 1, whose chunk is written; then room 0's retry writes the same slot again (a round-0 offset "
            "always passes the watermark gate) and room 1 scatters room 0's KV",
    status="open upstream",
    note="The re-send path the findings issue asked about: a second RDMA into a slot decode already freed. Room 0 "
         "did not fail, so the deferred decode KV release (0.5.21+) does not cover it. On sglang_0_5_23 it needs no "
         "ring pressure (ring_units=0: #37166's fresh round reuses offset 0; two sibling deferrals, 15 steps).",
    affected="SGLang from 05c7ebf (PR #30545) through 0.5.23, Mooncake staging with prefill TP < decode TP (a prefill "
             "rank with several decode destinations)",
    upstream_files=(
        UpstreamSite(MOONCAKE, ("MooncakeKVManager.transfer_worker", "MooncakeKVManager._do_staging_transfer"),
                     "a deferred destination re-enqueues the whole chunk; the retry writes every destination again"),
        UpstreamSite(STAGING_HANDLER, ("PrefillStagingStrategy.check_ready", "is_watermark_ready"),
                     "the retry's old offset still passes: a round-0 slot, or a watermark already met, stays ready"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.advance_scatter",),
                     "frees the slot once its scatter completed, while the re-enqueued chunk is still queued"),
    ),
    harm="silent KV corruption",
    consequence="Another room's staging slot receives the earlier room's KV after that room wrote it; that room is "
                "scattered and decoded from the wrong request's KV.",
    fix="Record per-destination progress in TransferKVChunk so a retry re-sends only the deferred destinations.",
    fix_variant=PROPOSED_FIX,
    verdicts=(Verdict(AT_05C7EBF, "present", "after a ring wrap"),
              Verdict("0.5.23", "present", "wider: #37166's fresh round reuses offset 0 with no ring pressure; the "
                                           "deferred release covers failed rooms only")),
)

STALE_WRITE_AFTER_RELEASE_TIMEOUT = BugReport(
    id="sglang-35049-staging-stale-write-after-timeout",
    model=MODEL,
    variant="sglang_0_5_23",
    invariant="suffix_rows_match_prefill",
    params={"rooms": 2, "prompt_len": 1, "ring_units": 1, "faults": "abort,release_timeout,drop_abort",
            "timeouts": 0, "fault_budget": 3},
    source="sglang 0.5.21+ (deferred decode KV release, #35049 / #35360): its 30 s timeout",
    summary="decode aborts room 0 and holds its slot for the ABORT_ACKs, but the ABORT is lost; the release "
            "timeout frees the slot and the WATERMARK lets the prefill write room 1 into it; room 0's queued chunk, "
            "never told of the abort, then writes the same slot and room 1 scatters room 0's KV",
    status="open upstream",
    note="sglang-05c7ebf-staging-stale-write-after-release on 0.5.23: fixed in the default configuration while the "
         "ACKs arrive; after the timeout it is back. With the ABORT overtaken by the WATERMARK (faults "
         "abort,release_timeout,reorder) it reproduces too (13 steps, about 99,000 states).",
    affected="SGLang 0.5.21 through 0.5.23 with the deferred decode KV release on (the default), Mooncake staging, "
             "when an ABORT is lost or the prefill drains slower than "
             "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (30 s)",
    upstream_files=(
        UpstreamSite(DECODE, ("DecodeTransferQueue.resolve_deferred_releases", "DecodeTransferQueue._do_release"),
                     "releases a held room at the deadline without a drain ACK (\"releasing anyway\")"),
        UpstreamSite(STAGING_HANDLER, ("DecodeStagingHandler.release_room", "is_watermark_ready"),
                     "frees the slot and broadcasts WATERMARK; the stale round-0 offset always passes the gate"),
        UpstreamSite(MOONCAKE, ("MooncakeKVManager.transfer_worker",), "writes a queued chunk of the aborted room"),
    ),
    harm="silent KV corruption",
    consequence="Another room's slot on the wrapped ring receives the aborted room's KV, and that room is scattered "
                "and decoded from it.",
    fix="Do not free a timed-out room's staging slots for reuse until the prefill confirmed the abort (re-send the "
        "ABORT until acknowledged), or fence the slot with a generation the prefill's write must match.",
    verdicts=(Verdict(AT_05C7EBF, "present", "as sglang-05c7ebf-staging-stale-write-after-release (no deferred "
                                             "release there)"),
              Verdict("0.5.23", "present", "after the deferred release's timeout; explore on sglang_0_5_23: 14 "
                                           "steps, about 59,000 states")),
)
