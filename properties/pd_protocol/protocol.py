"""The room lifecycle transition system (P1, P2, P3, P5, P7 as invariants; P8 as liveness) and its bug reports.

`protocol_invariants` runs `PdProtocol` under the generic Hypothesis state
machine; the bug reports below are found by `explore` (each names the
invariant that fails, with the parameters of the smallest configuration that
holds it).
"""

from __future__ import annotations

from kvsim.engine.property import stateful_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict

MODEL = "pd-protocol"

PROTOCOL_INVARIANTS = stateful_property(
    model=MODEL, name="protocol_invariants", home=__name__,
    doc="P1, P2, P3, P5 and P7 hold on every step of Hypothesis-chosen interleavings of messages, "
        "timeouts and faults (one backend; --param backend=...).")

BUGS = (
    BugReport(
        id="sglang-pr35281-stale-work-flips-success",
        model=MODEL,
        variant="pre_35281",
        invariant="success_is_sticky",
        params={"backend": "nixl"},
        source="sglang PR #35281 (area 2)",
        summary="NIXL: a queued chunk for a room whose transfer_infos were torn down at Success hits "
                "`assert room in transfer_infos`; the catch-all flips the concluded Success to Failed",
    ),
    BugReport(
        id="sglang-pr35281-mori-no-heartbeat",
        model=MODEL,
        variant="pre_35281",
        invariant="peer_death_fails_unfinished_rooms",
        params={"backend": "mori"},
        source="sglang PR #35281 (area 1)",
        summary="Mori decode ran no heartbeat checker: a dead prefill leaves decode rooms waiting for the full "
                "300 s waiting timeout",
    ),
    BugReport(
        id="sglang-pr35281-init-race",
        model=MODEL,
        variant="pre_35281",
        invariant="no_field_read_before_assignment",
        params={"backend": "mooncake", "staging": 0},
        source="sglang PR #35281 (area 5)",
        summary="Mooncake started the bootstrap thread before creating session_lock: a registration in that "
                "window raises AttributeError and kills the thread",
    ),
    BugReport(
        id="sglang-pr35281-staging-ctx-race",
        model=MODEL,
        variant="fixed",
        invariant="no_field_read_before_assignment",
        params={"backend": "mooncake", "staging": 1},
        source="sglang PR #35281 review (area 5 residual)",
        summary="Mooncake still assigns _staging_ctx after the bootstrap thread starts: a WATERMARK in that "
                "window raises AttributeError and kills the thread",
        status="open upstream",
        note="The reviewer's residual race; the upstream post-fix file assigns _staging_ctx late, as modelled.",
        affected="SGLang 05c7ebf through 0.5.23, Mooncake with staging: the ordering is in the code; the trigger "
                 "is not reachable in normal operation",
        upstream_files=(
            UpstreamSite("python/sglang/srt/disaggregation/mooncake/conn.py",
                         ("MooncakeKVManager.__init__", "start_prefill_thread", "handle_watermark_msg"),
                         "_staging_ctx is assigned after the bootstrap thread starts; WATERMARK dereferences it in "
                         "a loop with no try/except"),
        ),
        harm="a dead thread",
        consequence="A WATERMARK delivered in the start-up window raises AttributeError and kills the bootstrap "
                    "thread; every later room on that rank stalls until its timeout.",
        fix="Assign _staging_ctx before start_prefill_thread() (one line).",
        verdicts=(Verdict("PR #35281", "present"),
                  Verdict("0.5.23", "not reachable", "WATERMARK goes only to prefills that sent a STAGING_REQ, which "
                                                     "needs _staging_ctx; keep as hardening")),
    ),
    BugReport(
        id="sglang-pd-common-failed-not-sticky",
        model=MODEL,
        variant="fixed",
        invariant="failed_is_sticky",
        params={"backend": "mooncake"},
        source="sglang CommonKVManager.update_status (Mooncake, NIXL), as of PR #35281; fixed in 0.5.20",
        summary="a TransferInfo that reaches a prefill room after it failed (bootstrap timeout, ABORT) and before "
                "clear() moves it back to WaitingForInput: update_status takes max(Failed=0, WaitingForInput=2)",
        note="A seed bug with real releases on both sides: `kvsim conform sglang --versions 0.5.19,0.5.20 --target "
             "update_status` runs failed_is_sticky on each release's own update_status (it fails on 0.5.19 and holds "
             "on 0.5.20). 0.5.20 added the early return on Failed (and creates an absent room only from an opening "
             "status); the model's variant sglang_0_5_23 has both (flags common_failed_terminal, common_opening_only) "
             "and explore finds no violation there. Mori's rule kept Failed terminal all along.",
        affected="SGLang 0.5.13 through 0.5.19, Mooncake and NIXL",
        upstream_files=(
            UpstreamSite("python/sglang/srt/disaggregation/common/conn.py", ("CommonKVManager.update_status",),
                         "max(Failed, WaitingForInput) moves a failed room back"),
        ),
        harm="a wrong status",
        consequence="A failed prefill room is resurrected as WaitingForInput and may transfer again.",
        fix="update_status returns early on a Failed room.",
        fix_variant="sglang_0_5_23",
        verdicts=(Verdict("PR #35281", "present"),
                  Verdict("0.5.19", "present", "update_status takes max(current, status) on a Failed room"),
                  Verdict("0.5.20", "fixed", "update_status returns early on Failed", fixed_in="0.5.20"),
                  Verdict("0.5.23", "fixed", "update_status returns early on Failed", fixed_in="0.5.20")),
    ),
)
