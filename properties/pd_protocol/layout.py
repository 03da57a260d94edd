"""P6: Mori's destination KV descriptor selection (SGLang PR #35281, area 4), and its bug reports."""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict
from kvsim.models.pd_protocol.mori_layout import Descriptor, LayoutCase, chosen_descriptors
from kvsim.models.pd_protocol.variants import ProtocolVariant

from .cases import DRAFT_CASE

MODEL = "pd-protocol"


def _check_layout(case: LayoutCase, variant: ProtocolVariant) -> None:
    kv_kind = "K" if case.attention == "mha" else "KV"
    for l, (k, v) in enumerate(chosen_descriptors(case, variant)):
        layer = case.start_layer + l
        want_k = Descriptor(kv_kind, "main", layer)
        if k != want_k:
            raise PropertyViolation(f"{kv_kind} descriptor for local layer {l}: expected main {kv_kind} of global "
                                    f"layer {layer}, got {k}")
        if case.attention == "mha" and v != Descriptor("V", "main", layer):
            raise PropertyViolation(f"V descriptor for local layer {l}: expected main V of global layer {layer}, "
                                    f"got {v}")


@kv_property(model=MODEL, strategy="LAYOUT_CASES", examples=[DRAFT_CASE])
def layout_selects_main_kv(case: LayoutCase, variant: ProtocolVariant) -> None:
    """P6: the K and V chosen for local layer l are the main-model K and V of global layer s + l, never a draft region."""
    _check_layout(case, variant)


@kv_property(model=MODEL, strategy="LAYOUT_CASES_ANY_DRAFT")
def layout_selects_main_kv_any_draft(case: LayoutCase, variant: ProtocolVariant) -> None:
    """P6 over every draft depth, including decodes with at least as many draft layers as a prefill stage has layers."""
    _check_layout(case, variant)


BUGS = (
    BugReport(
        id="sglang-pr35281-mori-draft-layout",
        model=MODEL,
        variant="pre_35281",
        property="layout_selects_main_kv",
        source="sglang PR #35281 (area 4)",
        summary="Mori split the destination list in half: with draft KV on decode and none on prefill, "
                "main V lands in a draft region",
    ),
    BugReport(
        id="sglang-pr35281-mori-wide-draft-layout",
        model=MODEL,
        variant="fixed",
        property="layout_selects_main_kv_any_draft",
        source="sglang PR #35281 (area 4), post-fix rule",
        summary="the post-fix V-offset rule takes T % n == 0 for the PP case: when the decode has at least as many "
                "draft layers as a prefill stage has layers (e.g. a one-layer stage), V is again taken from a draft "
                "region",
        status="open upstream",
        note="Derived from the rule as the research note states it (get_mha_kv_ptrs_with_pp); the real code may "
             "guard this elsewhere. Production drafts (MTP, EAGLE: one layer) on stages of two or more layers are "
             "not affected.",
        affected="SGLang 0.5.19 through 0.5.23 (after PR #35281): PD disaggregation of plain MHA models whose pools "
                 "publish no layer ids, prefill with pipeline parallelism, decode with draft KV (speculative "
                 "decoding); Mori, and Mooncake and NIXL through the shared rule",
        upstream_files=(
            UpstreamSite("python/sglang/srt/disaggregation/mori/conn.py", ("_get_mha_mem_desc_slices",),
                         "takes the main-layer count as n*(T//n) when n < T and T % n != 0, else T"),
            UpstreamSite("python/sglang/srt/disaggregation/common/conn.py", ("get_mha_kv_ptrs_with_pp",),
                         "the same rule, used by Mooncake and NIXL for plain MHA"),
            UpstreamSite("python/sglang/srt/disaggregation/utils.py", ("build_kv_layer_ids",),
                         "returns no layer ids for plain MHA pools, so the rule is always used"),
        ),
        harm="silent KV corruption",
        consequence="The prefill writes a stage's V (or K) into the decode's draft region or into another layer's "
                    "K; decode attends over wrong KV with no error. With an uneven split (32 layers, PP 3, one EAGLE "
                    "layer) every stage is affected.",
        fix="Take the V offset from the decode's main-layer count (T - num_draft_entries / 2; kv_args.num_draft_entries "
            "exists), or require layer ids for PP-heterogeneous MHA.",
        verdicts=(Verdict("PR #35281", "present"),
                  Verdict("0.5.23", "present", "broader than modelled: uneven PP splits fail with a single draft "
                                               "layer, and common/conn.py's rule has the same flaw")),
    ),
)
