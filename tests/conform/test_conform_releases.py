"""Releases across a fix: the seed bug reports' properties on the real vllm 0.27.1 / 0.28.0 / 0.33.0 code."""

from __future__ import annotations

import json

from kvsim.conform import cli
from kvsim.conform.releases import bug_rows
from kvsim.conform.report import format_table, release_table
from kvsim.conform.targets import RunOptions, targets


def test_release_table_reproduces_d6af803_across_its_fix(capsys):
    code = cli.main(["vllm", "--versions", "0.27.1,0.28.0,0.33.0", "--target", "KVBlockZeroer",
                     "--max-examples", "20", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # the zeroer diverges on the documented page check
    rows = {r["bug"]: r for r in doc["seed_bugs"]}
    d6 = rows["vllm-d6af803-packed-zeroing-stride"]
    assert d6["statuses"] == {"0.27.1": "fails", "0.28.0": "holds", "0.33.0": "holds"}
    assert d6["reproduced_across_fix"] is True
    finding = next(r for b, r in rows.items() if b.startswith("finding: vllm 0.28.0 overlaid"))
    assert finding["statuses"]["0.28.0"] == "fails" and finding["statuses"]["0.33.0"] == "holds"


def _table(names, versions, max_examples):
    chosen = [t for t in targets("vllm") if t.name in names]
    return release_table("vllm", versions, chosen, RunOptions(max_examples=max_examples))


def test_b38e111d_reproduced_across_its_fix_on_the_uniform_and_the_per_request_planner():
    """0.27.1 has no plan_mla_context_chunks: its uniform plan (inline in the metadata builder) runs the property."""
    versions, table = _table(("mla_uniform_plan_properties", "plan_mla_context_chunks"), ["0.27.1", "0.28.0"], 10)
    row = next(r for r in bug_rows("vllm", versions, table) if r["bug"] == "vllm-b38e111d-mla-chunk-blowup")
    assert row["statuses"] == {"0.27.1": "fails", "0.28.0": "holds"}
    assert row["targets"] == {"0.27.1": "mla_uniform_plan_properties", "0.28.0": "plan_mla_context_chunks"}
    assert row["reproduced_across_fix"] is True
    text = format_table("vllm", versions, table)
    assert "on mla_uniform_plan_properties/plan_mla_context_chunks" in text and "reproduced" in text


def test_d6af803_reproduced_across_its_fix_on_the_real_kernel():
    """Upstream's plan zeroed by upstream's Triton kernel: guard bytes hit on 0.27.1, none on 0.28.0."""
    versions, table = _table(("zero-kv-blocks-kernel",), ["0.27.1", "0.28.0"], 3)
    before = table["zero-kv-blocks-kernel"]["0.27.1"]
    # 0.27.1's launcher (no stride column) with the model's pre_d6af803 plans: byte for byte the model's memset
    assert before.divergent == 0 and before.compared >= 3 + 6, before.divergences
    row = next(r for r in bug_rows("vllm", versions, table) if r["targets"]["0.27.1"] == "zero-kv-blocks-kernel")
    assert row["bug"] == "vllm-d6af803-packed-zeroing-stride"
    assert row["statuses"] == {"0.27.1": "fails", "0.28.0": "holds"} and row["reproduced_across_fix"] is True
    message = next(p["message"] for p in table["zero-kv-blocks-kernel"]["0.27.1"].properties
                   if p["property"] == "zeroing_preserves_other_bytes")
    # the pinned (4, 12) int32 case: the old plan clears 9 words and writes 3 (12 bytes) past the allocation
    assert message.startswith("last block page (4, 12) int32") and "12 of them guard bytes outside every" in message


def test_release_table_lists_confirmed_findings_apart_from_failures():
    from kvsim.conform.report import format_table
    from kvsim.conform.targets import TargetResult

    confirmed = TargetResult("get_mha_kv_ptrs_with_pp", "0.5.23")
    confirmed.prop("common_rule_selects_main_kv", "finding confirmed", "stage 0: V offset wrong")
    plain = TargetResult("compute_staging_layout", "0.5.23")
    plain.prop("layout_property", "holds")
    text = format_table("sglang", ["0.5.23"], {"get_mha_kv_ptrs_with_pp": {"0.5.23": confirmed},
                                               "compute_staging_layout": {"0.5.23": plain}})
    head, _, rest = text.partition("open-upstream findings confirmed on the real code:")
    assert rest.strip() == "0.5.23 get_mha_kv_ptrs_with_pp: common_rule_selects_main_kv: stage 0: V offset wrong"
    assert "properties failing" not in head and confirmed.status == "conforms"
