"""The mla-backends bug reports and the lifecycle's stateful property, as data."""

from __future__ import annotations

from kvsim.engine.property import stateful_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict

MODEL = "mla-backends"

WRAPPER_INVARIANTS = stateful_property(
    model=MODEL, name="wrapper_invariants", home=__name__,
    doc="The plan/run lifecycle's invariants hold on every step of Hypothesis-chosen plan, fault and run "
        "sequences (no half-published plan, run never selects, CUDA-graph plans stay).")

BUGS = (
    BugReport(
        id="flashinfer-4051-merge-empty-nan", model=MODEL, variant="merge_nan_4051",
        property="empty_states_merge_to_empty", status="reproducible",
        source="FlashInfer #4051 (open; CUDA fixed by #4401, #4054 / #5262 pending); vLLM #28181, #39148",
        summary="merging two empty states (0, -inf) computes -inf - -inf = NaN: the merged output and LSE are NaN "
                "instead of (0, -inf)",
        max_examples=500,
        upstream_files=(UpstreamSite("flashinfer/trace/templates/cascade.py",
                                     ("_merge_state_reference", "_merge_state_in_place_reference",
                                      "_merge_states_reference"), "the Python references merge without the guard"),
                        UpstreamSite("flashinfer/triton/kernels/cascade.py",
                                     ("merge_state_kernel", "merge_state_in_place_kernel", "state_merge"),
                                     "the Triton merges: exp2(-inf - -inf)")),
        harm="silent KV corruption",
        consequence="an attention row whose every chunk is empty (a fully masked or zero-length span) becomes NaN "
                    "and poisons every later merge of that row",
        fix="shift by 0 when both LSEs are -inf (max(x, -inf) in the kernels), so both weights are 0 and the "
            "result is (0, -inf)",
        fix_variant="fixed",
        verdicts=(Verdict("flashinfer 0.7.4", "present",
                          "the trace templates' Python references and the Triton merge_state / merge_state_in_place "
                          "give NaN (kvsim conform flashinfer: merge-references, triton-merges)"),)),
    BugReport(
        id="flashinfer-4452-finite-masked-lse", model=MODEL, variant="finite_masked_lse_4452",
        property="masked_causal_rows_are_empty", source="FlashInfer #4452 (closed)",
        summary="causal prefill with qo_len > kv_len: a query row that sees no key got a finite LSE (about -49994) "
                "and the mean of the values instead of (0, -inf)",
        max_examples=500),
    BugReport(
        id="flashinfer-4031-nontransactional-replan", model=MODEL, variant="nontransactional_replan",
        invariant="no_half_published_plan", source="FlashInfer #4031 (BatchMLAPagedAttentionWrapper.plan)",
        summary="a re-plan that fails after backend selection leaves the new backend live beside the previous plan "
                "info and contract: the next run() launches a half-published plan"),
    BugReport(
        id="flashinfer-4031-fallback-on-any-error", model=MODEL, variant="fallback_any_error",
        property="auto_falls_back_only_on_unsupported", source="FlashInfer #4031 (_BatchMLAPagedAttentionAutoBackend)",
        summary="auto selection that catches every exception hides a JIT, allocation or runtime failure of the "
                "preferred backend and silently plans a slower one",
        max_examples=500),
)
