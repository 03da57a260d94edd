"""P6: which destination KV entries a prefill stage writes (SGLang PR #35281, area 4), and its bug reports.

The property is stated once (`check_chosen`) and run on Mori's rule (`layout_selects_main_kv*`) and on the
common rule of `common/conn.py` that Mooncake and NIXL use for plain MHA (`common_rule_selects_main_kv`);
`kvsim conform sglang` runs the same check on the releases' own functions.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict
from kvsim.models.pd_protocol.mori_layout import Descriptor, LayoutCase, chosen_descriptors, select
from kvsim.models.pd_protocol.variants import ProtocolVariant

from .cases import DRAFT_CASE, EAGLE_UNEVEN_CASES

MODEL = "pd-protocol"


def check_chosen(case: LayoutCase, chosen: Sequence[tuple[Descriptor | None, Descriptor | None]],
                 refused: str = "") -> None:
    """P6 on a selection: local layer l gets the main K (KV) and, for MHA, the main V of global layer s + l."""
    if refused:
        raise PropertyViolation(f"the {case.rule} rule refuses the stage: {refused}")
    kv_kind = "K" if case.attention == "mha" else "KV"
    for l, (k, v) in enumerate(chosen):
        layer = case.start_layer + l
        want_k = Descriptor(kv_kind, "main", layer)
        if k != want_k:
            raise PropertyViolation(f"{kv_kind} descriptor for local layer {l}: expected main {kv_kind} of global "
                                    f"layer {layer}, got {k}")
        if case.attention == "mha" and v != Descriptor("V", "main", layer):
            raise PropertyViolation(f"V descriptor for local layer {l}: expected main V of global layer {layer}, "
                                    f"got {v}")


def _check_layout(case: LayoutCase, variant: ProtocolVariant) -> None:
    check_chosen(case, chosen_descriptors(case, variant), select(case, variant).refused)


@kv_property(model=MODEL, strategy="LAYOUT_CASES", examples=[DRAFT_CASE])
def layout_selects_main_kv(case: LayoutCase, variant: ProtocolVariant) -> None:
    """P6: the K and V chosen for local layer l are the main-model K and V of global layer s + l, never a draft region."""
    _check_layout(case, variant)


@kv_property(model=MODEL, strategy="LAYOUT_CASES_ANY_DRAFT", examples=EAGLE_UNEVEN_CASES[:3])
def layout_selects_main_kv_any_draft(case: LayoutCase, variant: ProtocolVariant) -> None:
    """P6 (Mori) over every draft depth, uneven PP splits and explicit partitions, pools with and without layer ids."""
    _check_layout(case, variant)


@kv_property(model=MODEL, strategy="COMMON_LAYOUT_CASES", examples=EAGLE_UNEVEN_CASES[3:])
def common_rule_selects_main_kv(case: LayoutCase, variant: ProtocolVariant) -> None:
    """P6 on common/conn.py's get_mha_kv_ptrs_with_pp (Mooncake, NIXL; plain MHA), over the same widened cases."""
    _check_layout(case, variant)


_AFFECTED_MHA = ("PD disaggregation of plain MHA models (their pools publish no layer ids), prefill with pipeline "
                 "parallelism, decode with draft KV (speculative decoding: MTP, EAGLE)")

BUGS = (
    BugReport(
        id="sglang-pr35281-mori-draft-layout",
        model=MODEL,
        variant="pre_35281",
        property="layout_selects_main_kv",
        source="sglang PR #35281 (area 4)",
        summary="Mori split the destination list in half: with draft KV on decode and none on prefill, "
                "main V lands in a draft region",
        verdicts=(Verdict("0.5.18", "present", "the half split (0.5.13-0.5.18)"),
                  Verdict("0.5.19", "fixed", "PR #35281's V-offset rule", fixed_in="0.5.19")),
    ),
    BugReport(
        id="sglang-pr35281-mori-wide-draft-layout",
        model=MODEL,
        variant="fixed",
        property="layout_selects_main_kv_any_draft",
        source="sglang PR #35281 (area 4), post-fix rule",
        summary="Mori's post-fix V-offset rule infers the main-layer count as n*(T//n), or T when T % n == 0: wrong "
                "whenever the PP split is uneven (32 layers, PP 3, one EAGLE layer: every stage) or the decode has at "
                "least as many draft layers as a prefill stage has layers; V is then taken from K or a draft region",
        status="open upstream",
        note="Confirmed on the release's own MoriKVManager._get_mha_mem_desc_slices (kvsim conform sglang --target "
             "_get_mha_mem_desc_slices): the property fails there with the same shrunk case, and the model's rule agrees with "
             "upstream's on every input of the exhaustive differential. The correct offset is the decode's main-layer "
             "count, T - num_draft_entries / 2.",
        affected="SGLang 0.5.19 through 0.5.23 (after PR #35281), Mori: " + _AFFECTED_MHA,
        upstream_files=(
            UpstreamSite("python/sglang/srt/disaggregation/mori/conn.py", ("MoriKVManager._get_mha_mem_desc_slices",),
                         "takes the main-layer count as n*(T//n) when n < T and T % n != 0, else T"),
            UpstreamSite("python/sglang/srt/distributed/utils.py", ("get_pp_indices",),
                         "uneven splits: the last L % pp stages get one layer more, so n does not divide T"),
            UpstreamSite("python/sglang/srt/disaggregation/utils.py", ("build_kv_layer_ids",),
                         "returns no layer ids for plain MHA pools, so the rule is always used"),
        ),
        harm="silent KV corruption",
        consequence="The prefill writes a stage's V into the decode's K of other layers or into its draft region; "
                    "decode attends over wrong KV with no error. With an uneven split (32 layers, PP 3, one EAGLE "
                    "layer) every stage is affected.",
        fix="Take the V offset from the decode's main-layer count (T - num_draft_entries / 2; kv_args.num_draft_entries "
            "exists), or require layer ids for PP-heterogeneous MHA.",
        verdicts=(Verdict("PR #35281", "present"),
                  Verdict("0.5.19", "present", "the first release with the rule (0.5.18 has the half split)"),
                  Verdict("0.5.23", "present", "broader than first modelled: uneven PP splits fail with a single draft "
                                               "layer; common/conn.py's rule has the same flaw "
                                               "(sglang-common-mha-pp-v-offset)")),
    ),
    BugReport(
        id="sglang-common-mha-pp-v-offset",
        model=MODEL,
        variant="fixed",
        property="common_rule_selects_main_kv",
        source="sglang common/conn.py get_mha_kv_ptrs_with_pp (Mooncake, NIXL), unchanged 0.5.13-0.5.23",
        summary="the common V-offset rule that Mooncake and NIXL use for plain MHA infers the main-layer count as "
                "n*(T//n), or T when T % n == 0: with draft KV on decode and a PP prefill whose split is uneven "
                "(32 layers, PP 3, one EAGLE layer: every stage), or a stage no deeper than the draft, V is written "
                "into K of other layers or into the draft region",
        status="open upstream",
        note="A finding of its own beside Mori's: the same formula in a second function, used by the default "
             "backend (Mooncake) and NIXL, and it slices without a range check (a stage past the list comes back "
             "short instead of raising). Confirmed on the release's own CommonKVManager.get_mha_kv_ptrs_with_pp "
             "(kvsim conform sglang --target get_mha_kv_ptrs_with_pp).",
        affected="SGLang 0.5.13 through 0.5.23 (the function is identical in every release checked), Mooncake and "
                 "NIXL: " + _AFFECTED_MHA,
        upstream_files=(
            UpstreamSite("python/sglang/srt/disaggregation/common/conn.py", ("CommonKVManager.get_mha_kv_ptrs_with_pp",),
                         "takes the V offset as n*(T//n) when n < T and T % n != 0, else T"),
            UpstreamSite("python/sglang/srt/disaggregation/mooncake/conn.py",
                         ("MooncakeKVManager._send_kvcache_generic", "MooncakeKVManager.send_kvcache_slice"),
                         "uses it when neither peer publishes layer ids (plain MHA)"),
            UpstreamSite("python/sglang/srt/disaggregation/nixl/conn.py",
                         ("NixlKVManager._send_kvcache_generic", "NixlKVManager._init_hetero_tp_prep_handle"),
                         "the same for NIXL"),
            UpstreamSite("python/sglang/srt/distributed/utils.py", ("get_pp_indices",),
                         "uneven splits: the last L % pp stages get one layer more"),
        ),
        harm="silent KV corruption",
        consequence="Mooncake or NIXL RDMA-writes a prefill stage's V into the decode's K of other layers or into its "
                    "draft region; decode attends over wrong KV with no error. With 32 layers, prefill PP 3 and a "
                    "one-layer EAGLE draft on decode every stage is affected.",
        fix="Take the V offset from the decode's main-layer count (len(dst) / 2 - num_draft_entries / 2), "
            "or require layer ids for PP-heterogeneous MHA.",
        verdicts=(Verdict("0.5.13", "present"), Verdict("0.5.19", "present"), Verdict("0.5.23", "present")),
    ),
)
