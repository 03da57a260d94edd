"""P6: which destination KV entries a prefill stage writes (SGLang PR #35281, area 4).

The property is stated once (`check_chosen`) and run on Mori's rule (`layout_selects_main_kv*`) and on the
common rule of `common/conn.py` that Mooncake and NIXL use for plain MHA (`common_rule_selects_main_kv`);
`kvsim conform sglang` runs the same check on the releases' own functions.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
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

