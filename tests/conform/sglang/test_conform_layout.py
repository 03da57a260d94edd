"""kvsim conform sglang: the V-offset rules (Mori, common/conn.py) and update_status on the real releases.

Runs against the cached sglang wheels (a failed download fails the test). Each target also has a
planted change: the cached file copied into tmp_path with one line edited must diverge.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.conform import cli
from kvsim.conform.report import exit_code
from kvsim.conform.sglang.layout import CONN, MORI
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.engine.canon import canonical_json
from kvsim.engine.conformance.result import FINDING

EXHAUSTIVE = 6 * 13 * 37  # n 1..6, start 0..12, 0..36 destination entries, pinned
NO_DESCRIPTORS = 37  # Mori: a prefill with no KV descriptors, 0..36 destination entries (upstream's RuntimeError)


@pytest.fixture(scope="module")
def src23():
    return resolve_source("sglang", version="0.5.23")


def _run(name, source, n=40):
    return run_target(select_targets("sglang", name)[0], source, RunOptions(max_examples=n))


def _prop(result, name):
    return next(p for p in result.properties if p["property"] == name)


def planted_tree(source, tmp_path, relpath, line, new):
    """A copy of the release's tree (hard links) with `line` of `relpath` replaced by `new`, as a --from source."""
    tree = tmp_path / "sglang-planted"
    shutil.copytree(source.root, tree, copy_function=os.link)
    target = tree / relpath
    text = target.read_text()
    assert text.count(line) == 1, line
    target.unlink()  # a hard link: write a new file, never through the link into the cache
    target.write_text(text.replace(line, new))
    return resolve_source("sglang", from_path=str(tree))


def test_release_variants():
    mori, status = (select_targets("sglang", n)[0] for n in ("_get_mha_mem_desc_slices", "update_status"))
    assert [mori.variant_name(v) for v in ("0.5.13", "0.5.18", "0.5.19", "0.5.21", "0.5.22", "0.5.23", None)] == [
        "pre_35281", "pre_35281", "fixed", "fixed", "sglang_0_5_23", "sglang_0_5_23", "sglang_0_5_23"]
    assert [status.variant_name(v) for v in ("0.5.13", "0.5.19", "0.5.20", "0.5.23", None)] == [
        "fixed", "fixed", "sglang_0_5_23", "sglang_0_5_23", "sglang_0_5_23"]


def test_mori_rule_conforms_and_the_finding_is_confirmed_on_0_5_23(src23):
    result = _run("_get_mha_mem_desc_slices", src23)
    assert result.status == "conforms" and result.divergent == 0, result.divergences
    assert result.compared == NO_DESCRIPTORS + EXHAUSTIVE + 40  # then the property's cases, layer ids among them
    assert "the layer-id branch (dst_kv_layer_ids)" in result.note  # 0.5.22+: resolve_dcp_dst_entry_indices
    assert _prop(result, "layout_selects_main_kv")["status"] == "holds"
    wide = _prop(result, "layout_selects_main_kv_any_draft")
    assert wide["status"] == FINDING and wide["message"].startswith("sglang-pr35281-mori-wide-draft-layout: ")
    # the catalog's shrunk case, on upstream's own function, and the research note's case on every stage
    assert wide["input"] == {"num_layers": 1, "pp_size": 1, "stage": 0, "draft_layers": 1, "same_pp": False,
                             "attention": "mha"}
    assert "32 layers, prefill PP 3, 1 draft layer: stages [0, 1, 2] of 0-2 wrong" in result.note
    assert exit_code([result]) == 0  # a confirmed open finding keeps CI green


def test_common_rule_conforms_and_its_finding_is_confirmed(src23):
    result = _run("get_mha_kv_ptrs_with_pp", src23)
    assert result.status == "conforms" and result.compared == EXHAUSTIVE + 40, result.divergences
    prop = _prop(result, "common_rule_selects_main_kv")
    assert prop["status"] == FINDING and prop["message"].startswith("sglang-common-mha-pp-v-offset: ")
    assert prop["input"]["rule"] == "common" and prop["input"]["draft_layers"] == 1
    assert "32 layers, prefill PP 3, 1 draft layer: stages [0, 1, 2] of 0-2 wrong" in result.note


def test_update_status_conforms_on_0_5_23_and_failed_stays_failed(src23):
    result = _run("update_status", src23)
    assert result.status == "conforms" and result.compared == 2 * 6 * (5 + 25 + 125), result.divergences
    assert _prop(result, "failed_is_sticky")["status"] == "holds"


def test_seed_bugs_reproduce_across_their_fix(capsys):
    code = cli.main(["sglang", "--versions", "0.5.18,0.5.19,0.5.20", "--target", "update_status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # the pre-fix releases diverge on the seed bug's property
    rows = {r["bug"]: r for r in doc["seed_bugs"]}
    sticky = rows["sglang-pd-common-failed-not-sticky"]
    assert sticky["statuses"] == {"0.5.18": "fails", "0.5.19": "fails", "0.5.20": "holds"}
    assert sticky["reproduced_across_fix"] is True
    assert all(r["divergent"] == 0 for r in doc["table"]["update_status"].values())  # model agrees on each side
    message = doc["table"]["update_status"]["0.5.19"]["properties"][0]["message"]
    assert "a TransferInfo (WaitingForInput) on a Failed room leaves it WaitingForInput" in message
    # the whole protocol explored with 0.5.19's own update_status finds the catalog's counterexample, step for step
    catalog_trace = reproduce(catalog.load().bug("sglang-pd-common-failed-not-sticky")).counterexample["trace"]
    assert "5 steps over 2516 states" in message and f"trace {canonical_json(catalog_trace)}" in message

    cli.main(["sglang", "--versions", "0.5.18,0.5.19", "--target", "_get_mha_mem_desc_slices", "--max-examples",
              "30", "--json"])
    doc = json.loads(capsys.readouterr().out)
    row = next(r for r in doc["seed_bugs"] if r["bug"] == "sglang-pr35281-mori-draft-layout")
    assert row["statuses"] == {"0.5.18": "fails", "0.5.19": "holds"} and row["reproduced_across_fix"] is True
    old = doc["table"]["_get_mha_mem_desc_slices"]["0.5.18"]
    assert old["divergent"] == 0 and old["properties"][0]["input"]["num_layers"] == 2
    assert old["properties"][0]["input"]["pp_size"] == 1


def test_planted_mori_offset_change_diverges(src23, tmp_path):
    planted = planted_tree(src23, tmp_path, MORI, "dst_v_offset = num_local_layers * multiplier_ratio",
                       "dst_v_offset = dst_total_layers")
    result = _run("_get_mha_mem_desc_slices", planted)
    assert result.status == "diverges" and result.divergent == 1
    first = result.divergences[0]  # the smallest input of the exhaustive domain with decode draft entries
    assert first["input"] == {"n": 2, "start_layer": 0, "dst_len": 6}
    assert first["difference"] == "dst_v[0]: model 2, upstream 3"


def test_planted_common_rule_change_diverges(src23, tmp_path):
    planted = planted_tree(src23, tmp_path, CONN, "v_ptr_offset = num_kv_layers * multiplier_ratio",
                       "v_ptr_offset = num_kv_layers * (multiplier_ratio + 1)")
    result = _run("get_mha_kv_ptrs_with_pp", planted)
    assert result.divergent == 1 and result.divergences[0]["input"] == {"n": 2, "start_layer": 0, "dst_len": 6}
    assert result.divergences[0]["difference"] == "dst_v[0]: model 2, upstream 4"


def test_planted_update_status_without_the_early_return_fails(src23, tmp_path):
    planted = planted_tree(src23, tmp_path, CONN,
                       "            # Failed is terminal. It also sorts lowest, so the max() below would\n",
                       "            pass\n        if False:\n")
    result = _run("update_status", planted)  # no version: compared with the newest variant
    assert result.status == "diverges" and result.divergent == 1
    first = result.divergences[0]  # the shortest trace that un-fails a room (the sweep stops there)
    assert first["input"] == {"start": "Failed", "updates": ["Bootstrapping"], "deferred_bootstrap": False}
    assert first["difference"] == "statuses[0]: model Failed, upstream Bootstrapping"


def test_model_pp_split_is_upstreams_get_pp_indices(src23, monkeypatch):
    """The widened strategies' uneven splits are upstream's own: get_pp_indices from distributed/utils.py."""
    from kvsim.conform.loader import load_definitions
    from kvsim.models.pd_protocol.mori_layout import get_pp_indices

    monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION", raising=False)
    relpath = "sglang/srt/distributed/utils.py"
    upstream = load_definitions(src23.file(relpath), ["get_pp_indices"], where=relpath).get_pp_indices
    cases = [(layers, stage, pp) for pp in range(1, 9) for layers in range(pp, 100) for stage in range(pp)]
    assert all(tuple(upstream(layers, stage, pp)) == get_pp_indices(layers, stage, pp) for layers, stage, pp in cases)
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "5,2,4")
    assert [tuple(upstream(11, s, 3)) for s in range(3)] == [get_pp_indices(11, s, 3, (5, 2, 4)) for s in range(3)]


def test_a_changed_signature_is_exit_2_naming_the_method(src23, tmp_path, capsys):
    planted = planted_tree(src23, tmp_path, CONN, "self, src_kv_ptrs: List[int], dst_kv_ptrs: List[int]",
                       "self, src_kv_ptrs: List[int], dst_kv_ptrs: List[int], pp_rank: int = 0")
    assert cli.main(["sglang", "--from", str(planted.root), "--target", "get_mha_kv_ptrs_with_pp"]) == 2
    assert "CommonKVManager.get_mha_kv_ptrs_with_pp" in capsys.readouterr().out
