"""pd-protocol area 4: Mori's destination KV descriptor selection (P6)."""

import pytest

from kvsim.app import catalog
from kvsim.engine.errors import ConfigError
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.models.pd_protocol import VARIANTS
from dataclasses import replace

from kvsim.engine.canon import to_jsonable
from kvsim.engine.errors import PropertyViolation
from kvsim.models.pd_protocol.mori_layout import (RULES, Descriptor, LayoutCase, chosen_descriptors, get_pp_indices,
                                                  pair_by_layer_id, select_common_mha_ptrs, select_dst_descriptors)
from kvsim.properties.pd_protocol.cases import EAGLE_UNEVEN_CASES

REG = catalog.load()
P6 = REG.property("pd-protocol", "layout_selects_main_kv")
P6_WIDE = REG.property("pd-protocol", "layout_selects_main_kv_any_draft")
P6_COMMON = REG.property("pd-protocol", "common_rule_selects_main_kv")
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
    with pytest.raises(ConfigError, match="pp_size"):
        LayoutCase(3, 4, 0, 0, False, "mha")  # a stage without layers
    with pytest.raises(ConfigError, match="attention"):
        LayoutCase(4, 1, 0, 0, False, "gqa")
    with pytest.raises(ConfigError, match="stage"):
        LayoutCase(4, 2, 2, 0, False, "mha")
    with pytest.raises(ConfigError, match="partition"):
        LayoutCase(6, 2, 0, 0, False, "mha", partition=(2, 3))
    with pytest.raises(ConfigError, match="rule"):
        LayoutCase(4, 1, 0, 0, False, "mla", rule="common")  # get_mha_kv_ptrs_with_pp is the MHA path


def test_uneven_split_and_partition_follow_get_pp_indices():
    # 32 layers on PP 3: the last 32 % 3 = 2 stages take one layer more (10/11/11)
    assert [get_pp_indices(32, s, 3) for s in range(3)] == [(0, 10), (10, 21), (21, 32)]
    assert [LayoutCase(32, 3, s, 1, False, "mha").local_layers for s in range(3)] == [10, 11, 11]
    assert [get_pp_indices(94, s, 4) for s in range(4)] == [(0, 23), (23, 46), (46, 70), (70, 94)]
    assert LayoutCase(7, 2, 1, 0, False, "mha", partition=(5, 2)).bounds == (5, 7)  # SGLANG_PP_LAYER_PARTITION
    assert [get_pp_indices(8, s, 2) for s in range(2)] == [(0, 4), (4, 8)]  # even: as before


@pytest.mark.parametrize("case", EAGLE_UNEVEN_CASES, ids=lambda c: f"{c.rule}-stage{c.stage}")
def test_research_case_every_stage_of_both_rules_takes_a_wrong_v(case):
    """32 layers, prefill PP 3, one EAGLE layer on a PP-1 decode: T = 33, n = 10 or 11, V offset n*(33//n) != 32."""
    n = case.local_layers
    for variant in (VARIANTS.fixed, VARIANTS["sglang_0_5_23"]):
        chosen = chosen_descriptors(case, variant)
        assert [k for k, _ in chosen] == [Descriptor("K", "main", case.start_layer + l) for l in range(n)]
        v0 = chosen[0][1]
        assert v0 != Descriptor("V", "main", case.start_layer)
        # n = 10: 33 % 10 != 0, offset 30 lands in main K; n = 11: 33 % 11 == 0, offset T = 33 (one past V main's
        # start), so every V goes to the next layer's V and the stage's last V onto the draft K
        offset = n * (33 // n) if 33 % n else 33
        assert v0 == case.destination()[offset + case.start_layer]
        assert v0 == (Descriptor("K", "main", 30) if n == 10 else Descriptor("V", "main", case.start_layer + 1))
        with pytest.raises(PropertyViolation, match="V descriptor for local layer 0"):
            (P6_WIDE if case.rule == "mori" else P6_COMMON)(case, variant)


def test_even_split_with_one_draft_layer_is_right_for_both_rules():
    for rule in RULES:
        for stage in range(4):
            case = LayoutCase(32, 4, stage, 1, False, "mha", rule=rule)
            assert all(k == Descriptor("K", "main", case.start_layer + l) and v == Descriptor("V", "main", k.layer)
                       for l, (k, v) in enumerate(chosen_descriptors(case)))


def test_common_rule_slices_without_a_check():
    # same-PP stage-local list with draft entries: Mori refuses, the common rule comes back short
    # (stage of 2 layers starting at layer 4, list K4 K5 V4 V5 Kd0 Kd1 Vd0 Vd1: T = 4, T % n == 0)
    assert select_dst_descriptors(2, 8, 4, attention="mha").refused  # 4 + 2 > 4 pairs: ValueError
    short = select_common_mha_ptrs(2, 8, 4)
    assert short.k == (4, 5) and short.v == ()  # K from the draft K; V slice [8:10] of an 8-entry list: empty
    assert select_common_mha_ptrs(4, 8, 0) == ((0, 1, 2, 3), (4, 5, 6, 7), "")  # n == T: the local halves
    assert select_common_mha_ptrs(4, 10, 0).v == (4, 5, 6, 7)  # draft case: n * (5 // 4) = 4


def test_same_pp_is_recognised_by_equal_lengths_as_upstream_does():
    assert select_dst_descriptors(4, 8, 4, attention="mha").k == (0, 1, 2, 3)  # stage-local list, no offset
    assert select_dst_descriptors(4, 8, 4, attention="mha", variant=PRE).refused  # 4 + 4 > 4 pairs
    # `same_pp` is an accepted, unread keyword (older callers)
    assert select_dst_descriptors(4, 10, 0, attention="mha", same_pp=True) == select_dst_descriptors(
        4, 10, 0, attention="mha", same_pp=False)


def test_layer_ids_pair_by_id_from_0_5_22_on():
    case = LayoutCase(32, 3, 1, 1, False, "mha", layer_ids=True)  # the research case, pools publishing ids
    right = [(Descriptor("K", "main", 10 + l), Descriptor("V", "main", 10 + l)) for l in range(11)]
    assert chosen_descriptors(case, VARIANTS["sglang_0_5_23"]) == right
    assert chosen_descriptors(case, VARIANTS.fixed) != right  # 0.5.19-0.5.21: the positional rule even with ids
    assert chosen_descriptors(replace(case, rule="common")) == right  # Mooncake/NIXL pair by id when published
    assert pair_by_layer_id([3, 3, 5], [5, 3, 9, 3]) == (1, 3, 0)  # repeated ids pair in order


def test_new_fields_stay_out_of_the_json_at_their_defaults():
    assert to_jsonable(LayoutCase(4, 1, 0, 1, False, "mha")) == {
        "num_layers": 4, "pp_size": 1, "stage": 0, "draft_layers": 1, "same_pp": False, "attention": "mha"}
    doc = to_jsonable(LayoutCase(7, 2, 0, 0, False, "mha", (5, 2), True, "common"))
    assert doc["partition"] == [5, 2] and doc["layer_ids"] is True and doc["rule"] == "common"


def test_widened_strategies_draw_uneven_splits_partitions_and_layer_ids():
    from hypothesis import HealthCheck, given, settings

    from kvsim.properties.pd_protocol.strategies import COMMON_LAYOUT_CASES, LAYOUT_CASES, LAYOUT_CASES_ANY_DRAFT

    def seen(strategy):
        out = []

        def keep(case):
            out.append(case)

        settings(max_examples=150, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))(given(strategy)(keep))()
        return out

    wide, even, common = seen(LAYOUT_CASES_ANY_DRAFT), seen(LAYOUT_CASES), seen(COMMON_LAYOUT_CASES)
    assert any(c.num_layers % c.pp_size and not c.partition for c in wide)
    assert any(c.partition for c in wide) and any(c.layer_ids for c in wide) and any(not c.layer_ids for c in wide)
    assert all(c.num_layers % c.pp_size == 0 and not c.layer_ids for c in even)  # the seed bug's domain: unchanged
    assert all(c.rule == "common" and c.attention == "mha" for c in common)
    assert all(c.draft_layers == 0 for c in wide + even if c.same_pp)


def test_common_rule_finding_reproduces():
    finding = reproduce(REG.bug("sglang-common-mha-pp-v-offset"))
    assert finding.ok and finding.reproduced and finding.fixed_passes is None
    assert finding.counterexample["case"]["rule"] == "common"
    assert finding.counterexample["case"]["draft_layers"] >= 1


@pytest.mark.parametrize("layers, pp, draft, wrong_stages", [
    (32, 2, 1, []), (32, 4, 1, []),  # even splits with one draft layer: right
    (32, 3, 1, [0, 1, 2]), (80, 3, 1, [0, 1, 2]), (94, 4, 1, [0, 1, 2, 3]),  # uneven: every stage wrong
    (4, 2, 2, [0, 1]),  # the first modelled wide-draft case
])
def test_research_table_of_v_offsets(layers, pp, draft, wrong_stages):
    """The research note's table (sglang_findings_0.5.23.md section 6), for both rules."""
    for rule in RULES:
        wrong = [s for s in range(pp) if any(v != Descriptor("V", "main", k.layer) for k, v in
                                             chosen_descriptors(LayoutCase(layers, pp, s, draft, False, "mha", rule=rule)))]
        assert wrong == wrong_stages, rule
    # 94 layers on PP 4: the 24-layer stage 2 (layers 46..69) takes its V offset as 24 * (95 // 24) = 72, inside the
    # 94 main K entries: index 72 + 46 = 118 is the V of layer 24, not of layer 46
    assert chosen_descriptors(LayoutCase(94, 4, 2, 1, False, "mha"))[0][1] == Descriptor("V", "main", 24)
