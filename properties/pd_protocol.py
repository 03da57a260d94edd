"""PD control protocol across Mooncake, NIXL and Mori (SGLang PR #35281).

Research note: ../shared/research/sglang.md, sections 1 and 4. So far this
module holds area 4, Mori's KV descriptor selection (property P6); the room
lifecycle transition system is the next step.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.errors import PropertyViolation
from kvsim.property import kv_property
from kvsim.registry import REGISTRY, BugReport, ModelSpec
from models.pd_mori_layout import ATTENTION_KINDS, VARIANTS, Descriptor, LayoutCase, chosen_descriptors

MODEL = "pd-protocol"

REGISTRY.add_model(ModelSpec(
    name=MODEL,
    summary="PD control protocol shared by Mooncake, NIXL and Mori; so far Mori's KV descriptor layout",
    source="sglang PR #35281",
    variants=VARIANTS,
))


@st.composite
def layout_cases(draw: st.DrawFn, draft_below_stage: bool = True) -> LayoutCase:
    """Model depth, an even PP split, one stage, decode draft layers, same-PP or decode PP=1, attention kind.

    With `draft_below_stage` the decode has fewer draft layers than a prefill stage has layers, the
    configurations the PR's rule is written for (MTP and EAGLE add one draft layer to a deep model).
    """
    local = draw(st.integers(1, 6))
    pp_size = draw(st.integers(1, 4))
    stage = draw(st.integers(0, pp_size - 1))
    draft = draw(st.integers(0, local - 1 if draft_below_stage else local + 3))
    same_pp = draw(st.booleans()) if pp_size > 1 else False
    attention = draw(st.sampled_from(ATTENTION_KINDS))
    return LayoutCase(local * pp_size, pp_size, stage, draft, same_pp, attention)


def _check_layout(case: LayoutCase, variant: str) -> None:
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


# The case: decode with one draft layer, prefill without; decode PP=1, a 4-layer MHA model.
DRAFT_CASE = LayoutCase(num_layers=4, pp_size=1, stage=0, draft_layers=1, same_pp=False, attention="mha")


@kv_property(model=MODEL, strategy=layout_cases(), examples=[DRAFT_CASE])
def layout_selects_main_kv(case: LayoutCase, variant: str) -> None:
    """P6: the K and V chosen for local layer l are the main-model K and V of global layer s + l, never a draft region."""
    _check_layout(case, variant)


@kv_property(model=MODEL, strategy=layout_cases(draft_below_stage=False))
def layout_selects_main_kv_any_draft(case: LayoutCase, variant: str) -> None:
    """P6 over every draft depth, including decodes with at least as many draft layers as a prefill stage has layers."""
    _check_layout(case, variant)


REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-mori-draft-layout",
    model=MODEL,
    variant="pre_35281",
    property="layout_selects_main_kv",
    source="sglang PR #35281 (area 4)",
    summary="Mori split the destination list in half: with draft KV on decode and none on prefill, "
            "main V lands in a draft region",
))

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-mori-wide-draft-layout",
    model=MODEL,
    variant="fixed",
    property="layout_selects_main_kv_any_draft",
    source="sglang PR #35281 (area 4), post-fix rule",
    summary="the post-fix V-offset rule takes T % n == 0 for the PP case: when the decode has at least as many "
            "draft layers as a prefill stage has layers (e.g. a one-layer stage), V is again taken from a draft region",
    status="open upstream",
    note="Derived from the rule as the research note states it (get_mha_kv_ptrs_with_pp); the real code may "
         "guard this elsewhere. Production drafts (MTP, EAGLE: one layer) on stages of two or more layers are "
         "not affected.",
))
