"""kvsim conform sglang --target eagle_prepare_for_decode: EAGLE's decode allocation length on the real releases
across #31616 (0.5.15 before, 0.5.16 and 0.5.23 after), and a planted change."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_conform_layout import planted_tree

from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets

TARGET = "eagle_prepare_for_decode"
EAGLE_UTILS = "sglang/srt/speculative/eagle_utils.py"


def _run(source, n=20, target=None):
    return run_target(target or select_targets("sglang", TARGET)[0], source, RunOptions(max_examples=n))


def _whole_pages(result):
    return {p["property"]: p for p in result.properties}["kv_allocated_whole_pages"]


@pytest.mark.parametrize("version, variant, holds", [("0.5.15", "pre_31616", False), ("0.5.16", "fixed", True),
                                                     ("0.5.23", "fixed", True)])
def test_the_property_fails_before_31616_and_holds_after(version, variant, holds):
    result = _run(resolve_source("sglang", version=version))
    assert result.divergent == 0 and result.note == f"model variant {variant}"
    prop = _whole_pages(result)
    if holds:
        assert result.status == "conforms" and prop["status"] == "holds"
    else:  # the first pinned case: committed 5 + reserve 4 = nxt 9 recorded at page size 2
        assert result.status == "diverges" and prop["status"] == "fails"
        assert prop["input"]["page_size"] == 2 and "(5, 9, 9)" in prop["message"]


def test_0_5_15_diverges_from_the_fixed_model():
    """The release table is what keeps 0.5.15 in agreement: against `fixed` its unaligned nxt is a divergence."""
    target = select_targets("sglang", TARGET)[0]
    assert target.variant_name("0.5.15") == "pre_31616" and target.variant_name("0.5.16") == "fixed"
    wrong = _run(resolve_source("sglang", version="0.5.15"), target=replace(target, releases=((None, "fixed"),)))
    assert wrong.divergent and wrong.divergences[0]["field"].startswith(("lens", "needed", "asked"))


def test_a_planted_unaligned_nxt_on_0_5_16_diverges_and_fails_the_property(tmp_path):
    """0.5.16 with #31616's rounding taken out again: nxt = committed + reserve + page_size - 1 - (page_size - 1)."""
    source = resolve_source("sglang", version="0.5.16")
    planted = planted_tree(source, tmp_path, EAGLE_UTILS, "            // page_size\n            * page_size,\n",
                           "            - (page_size - 1),\n")
    result = _run(planted)
    assert result.status == "diverges" and result.divergent == 1
    assert _whole_pages(result)["status"] == "fails"
