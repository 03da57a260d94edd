"""pd-protocol area 4: Mori's destination KV descriptor selection (P6)."""

import pytest

from kvsim.app import catalog
from kvsim.engine.errors import ConfigError
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.models.pd_protocol import VARIANTS
from kvsim.models.pd_protocol.mori_layout import Descriptor, LayoutCase, chosen_descriptors, select_dst_descriptors

REG = catalog.load()
P6 = REG.property("pd-protocol", "layout_selects_main_kv")
PRE = VARIANTS["pre_35281"]


def test_draft_case_indices():
    # decode list for 4 main layers + 1 draft: K0..K3 V0..V3 Kd0 Vd0 -> 5 pairs
    assert select_dst_descriptors(4, 10, 0, attention="mha", same_pp=False, variant=PRE).v == (5, 6, 7, 8)
    assert select_dst_descriptors(4, 10, 0, attention="mha", same_pp=False).v == (4, 5, 6, 7)
    case = LayoutCase(4, 1, 0, 1, False, "mha")
    old = chosen_descriptors(case, PRE)
    assert old[3][1] == Descriptor("K", "draft", 0)  # main V of layer 3 lands on the draft K
    assert [v for _, v in chosen_descriptors(case)] == [Descriptor("V", "main", i) for i in range(4)]


def test_pp_case_without_draft_is_right_in_both_variants():
    case = LayoutCase(num_layers=8, pp_size=2, stage=1, draft_layers=0, same_pp=False, attention="mha")
    for variant in VARIANTS.values():
        assert chosen_descriptors(case, variant) == [(Descriptor("K", "main", 4 + i), Descriptor("V", "main", 4 + i))
                                                     for i in range(4)]


def test_same_pp_offset_applied_twice_before_the_fix():
    case = LayoutCase(num_layers=8, pp_size=2, stage=1, draft_layers=0, same_pp=True, attention="mla")
    assert chosen_descriptors(case, PRE)[0][0] is None  # index 4 in a 4-entry stage-local list
    assert [k for k, _ in chosen_descriptors(case)] == [Descriptor("KV", "main", 4 + i) for i in range(4)]


def test_hybrid_mla_fell_through_to_the_mha_split():
    case = LayoutCase(num_layers=4, pp_size=1, stage=0, draft_layers=0, same_pp=False, attention="hybrid_mla")
    assert select_dst_descriptors(4, 4, 0, attention="hybrid_mla", same_pp=False, variant=PRE).v == (2, 3, 4, 5)
    assert [k for k, _ in chosen_descriptors(case)] == [Descriptor("KV", "main", i) for i in range(4)]


def test_p6_holds_on_fixed_and_fails_before():
    assert run_property(P6, "fixed", max_examples=300, seed=0).status == "passed"
    bad = run_property(P6, "pre_35281", max_examples=300, seed=0, use_examples=False)
    assert bad.status == "failed"
    assert bad.counterexample["case"]["draft_layers"] == 1 and bad.counterexample["case"]["attention"] == "mha"


def test_bug_reports_hold():
    draft = reproduce(REG.bug("sglang-pr35281-mori-draft-layout"))
    assert draft.ok and draft.reproduced and draft.fixed_passes
    finding = reproduce(REG.bug("sglang-pr35281-mori-wide-draft-layout"))
    assert finding.ok and finding.reproduced and finding.fixed_passes is None
    case = finding.counterexample["case"]
    assert case["draft_layers"] >= case["num_layers"] // case["pp_size"]  # only drafts as deep as a stage


def test_layout_case_validation_names_the_field():
    with pytest.raises(ConfigError, match="pp_size: expected a divisor of num_layers"):
        LayoutCase(6, 4, 0, 0, False, "mha")
    with pytest.raises(ConfigError, match="attention"):
        LayoutCase(4, 1, 0, 0, False, "gqa")
    with pytest.raises(ConfigError, match="stage"):
        LayoutCase(4, 2, 2, 0, False, "mha")
