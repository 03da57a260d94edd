"""The mla-chunks properties on every variant, the pinned upstream cases through the properties, and the four
bug reports reproduced by Hypothesis from scratch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvsim.app.catalog import load
from kvsim.engine.errors import PropertyViolation
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.models.mla_chunks.planner import FIXED
from kvsim.models.mla_chunks.variants import VARIANTS
from kvsim.properties.mla_chunks.cases import (BACKEND_CASE, CONTEXT_ORDER_CASE, DCP_MISALIGNED_CASE, KIMI_K3_CASE,
                                         TILING_CASES, case)
from kvsim.properties.mla_chunks.dcp import dcp_ranks_cover_each_span_exactly, dcp_reorg_matches_chunk_spans
from kvsim.properties.mla_chunks.numeric import (chunked_prefill_matches_full_attention,
                                           context_partial_matches_context_attention)
from kvsim.properties.mla_chunks.plan import chunk_count_within_alignment_slack

MODEL = "mla-chunks"
PRE, UNMASKED = VARIANTS["pre_b38e111d"], VARIANTS["uniform_unmasked"]
PLAN = ("chunks_tile_every_context_row_once", "chunks_have_no_empty_spans", "chunks_fit_the_row_budget",
        "chunks_follow_request_order", "continuation_only_at_first_request", "chunk_starts_are_aligned",
        "token_bookkeeping_matches_query_start_loc", "context_free_prefills_are_neutralised",
        "accumulation_copies_once_then_merges", "chunk_count_meets_lower_bound", "chunk_count_within_alignment_slack",
        "workspace_size_is_aligned")
DCP = ("dcp_ranks_cover_each_span_exactly", "dcp_reorg_matches_chunk_spans")
NUMERIC = ("chunked_prefill_matches_full_attention", "context_partial_matches_context_attention",
           "uniform_and_per_request_plans_agree", "output_independent_of_workspace_block_and_alignment")
ALL = PLAN + DCP + NUMERIC

# What Hypothesis finds on the uniform variants without the pinned cases (the rest hold there by design:
# one rank gathers every row once, the token ranges and the lower bound are right, and where the old plan
# is sound it agrees with the new one).
HOLD_ON_BOTH_UNIFORM = ("chunks_tile_every_context_row_once", "token_bookkeeping_matches_query_start_loc",
                        "chunk_count_meets_lower_bound")
FAIL_ON_BOTH_UNIFORM = ("chunks_have_no_empty_spans", "chunks_fit_the_row_budget", "chunks_follow_request_order",
                        "continuation_only_at_first_request", "chunk_starts_are_aligned",
                        "accumulation_copies_once_then_merges", "chunk_count_within_alignment_slack",
                        "workspace_size_is_aligned", *DCP, "chunked_prefill_matches_full_attention",
                        "context_partial_matches_context_attention",
                        "output_independent_of_workspace_block_and_alignment")
EXPECTED = {
    "pre_b38e111d": {"hold": HOLD_ON_BOTH_UNIFORM + ("context_free_prefills_are_neutralised",
                                                     "uniform_and_per_request_plans_agree"),
                     "fail": FAIL_ON_BOTH_UNIFORM},
    "uniform_unmasked": {"hold": HOLD_ON_BOTH_UNIFORM,
                         "fail": FAIL_ON_BOTH_UNIFORM + ("context_free_prefills_are_neutralised",
                                                         "uniform_and_per_request_plans_agree")},
}
BUGS = {
    "vllm-b38e111d-mla-dcp-misaligned-chunk": ("pre_b38e111d", "dcp_reorg_matches_chunk_spans"),
    "vllm-b38e111d-mla-context-order": ("pre_b38e111d", "chunked_prefill_matches_full_attention"),
    "vllm-b38e111d-mla-chunk-blowup": ("pre_b38e111d", "chunk_count_within_alignment_slack"),
    "vllm-49294-mla-empty-span": ("uniform_unmasked", "context_partial_matches_context_attention"),
}


def test_model_properties_and_bugs_are_registered() -> None:
    registry = load()
    assert registry.model(MODEL).variants.names == ("fixed", "b38e111d", "pre_b38e111d", "uniform_unmasked")
    assert sorted(p.name for p in registry.properties_of(MODEL) if not p.is_kernel) == sorted(ALL)
    assert all(p.doc for p in registry.properties_of(MODEL))
    for bug_id, (variant, prop) in BUGS.items():
        bug = registry.bug(bug_id)
        assert (bug.model, bug.variant, bug.property) == (MODEL, variant, prop)
    for variant, table in EXPECTED.items():
        assert sorted(table["hold"] + table["fail"]) == sorted(ALL), variant


def test_registration_order_and_no_hypothesis_import() -> None:
    """`kvsim list` order: the DCP, numeric, then planner properties; registering them does not import Hypothesis."""
    assert [p.name for p in load().properties_of(MODEL) if not p.is_kernel] == list(DCP + NUMERIC + PLAN)
    code = ("import sys; from kvsim.engine.registry import Registry; import kvsim.models.mla_chunks as m; "
            "import kvsim.properties.mla_chunks as p; r = Registry(); r.add_model(m.DESCRIPTOR); p.register(r); "
            "assert len([q for q in r.properties_of('mla-chunks') if not q.is_kernel]) == 18 and len(r.bugs) == 4; "
            "assert 'hypothesis' not in sys.modules, 'hypothesis imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ALL)
def test_every_property_holds_on_fixed(name: str) -> None:
    n = 40 if name in NUMERIC else 60
    result = run_property(load().property(MODEL, name), "fixed", max_examples=n, seed=0)
    assert result.status == "passed", result.message
    assert result.examples >= n


@pytest.mark.parametrize("variant, name", [(v, n) for v, t in EXPECTED.items() for n in t["fail"]])
def test_hypothesis_finds_each_uniform_variant_violation(variant: str, name: str) -> None:
    result = run_property(load().property(MODEL, name), variant, max_examples=300, seed=0, use_examples=False)
    assert result.status == "failed", f"{name} held on {variant} over {result.examples} examples: {result.message}"
    json.dumps(result.counterexample)


def test_hypothesis_finds_the_seed_commits_own_workspace_bound_too_large() -> None:
    """`b38e111d` (the seed commit, with its `max_num_seqs * alignment` floor) differs from `fixed` (#51733) in the
    workspace bound alone: the bound the releases promise fails there, and the seed commit's planner holds."""
    found = run_property(load().property(MODEL, "workspace_size_is_aligned"), "b38e111d", max_examples=300, seed=0,
                         use_examples=False)
    assert found.status == "failed", found.message
    plan = run_property(load().property(MODEL, "chunk_count_within_alignment_slack"), "b38e111d", max_examples=60,
                        seed=0)
    assert plan.status == "passed", plan.message


@pytest.mark.parametrize("variant, name", [(v, n) for v, t in EXPECTED.items() for n in t["hold"]])
def test_properties_that_hold_on_the_uniform_variants(variant: str, name: str) -> None:
    result = run_property(load().property(MODEL, name), variant, max_examples=60, seed=0)
    assert result.status == "passed", result.message


@pytest.mark.parametrize("bug_id", sorted(BUGS))
def test_bug_reports_reproduce_from_scratch_and_the_fix_passes(bug_id: str) -> None:
    result = reproduce(load().bug(bug_id), seed=0)
    assert result.reproduced and result.fixed_passes, result.message
    assert result.seconds < 10  # well under 2 s here; generous for a loaded CI machine
    json.dumps(result.counterexample)
    ctx = result.counterexample["case"]["context_lens"]
    assert len(ctx) <= 3 and max(ctx) <= 16, ctx  # shrunk to a handful of small requests


# -- the pinned upstream cases through the properties -------------------------------------------

def test_pinned_dcp_misaligned_numbers() -> None:
    with pytest.raises(PropertyViolation, match=r"rows after reorg_kvcache of chunk 0: expected 960 "
                                                r"\(cu_seq_lens\[-1\]\), got 1152"):
        dcp_reorg_matches_chunk_spans(DCP_MISALIGNED_CASE, PRE)
    with pytest.raises(PropertyViolation, match=r"expected \[0, 320\) \(320 rows\), got 384: beyond the span "
                                                r"\[320, 384\)"):
        dcp_ranks_cover_each_span_exactly(DCP_MISALIGNED_CASE, PRE)
    dcp_reorg_matches_chunk_spans(DCP_MISALIGNED_CASE, FIXED)
    dcp_ranks_cover_each_span_exactly(DCP_MISALIGNED_CASE, FIXED)


def test_pinned_chunk_blowup_numbers() -> None:
    with pytest.raises(PropertyViolation, match=r"W 1024, alignment 16: expected <= 2, got 8"):
        chunk_count_within_alignment_slack(TILING_CASES[0], PRE)
    with pytest.raises(PropertyViolation, match=r"expected <= 4, got 6"):
        chunk_count_within_alignment_slack(BACKEND_CASE, PRE)
    for c in TILING_CASES + (BACKEND_CASE, KIMI_K3_CASE):
        chunk_count_within_alignment_slack(c, FIXED)


def test_pinned_context_order_and_empty_span() -> None:
    with pytest.raises(PropertyViolation, match=r"attention output of token 4 \(request 1, context 64\)"):
        chunked_prefill_matches_full_attention(CONTEXT_ORDER_CASE, PRE)
    chunked_prefill_matches_full_attention(case([64, 0]), PRE)  # context-ful first: the cut-off is right
    with pytest.raises(PropertyViolation, match=r"context partial of token 0 \(request 0, context 0\): expected "
                                                r"output \[0.0, 0.0, 0.0\]\.\.\. lse \[-inf, -inf\], got output "
                                                r"\[nan, nan, nan\]\.\.\. lse \[0.0, 0.0\]"):
        context_partial_matches_context_attention(CONTEXT_ORDER_CASE, UNMASKED)
    # a context-ful request with an empty span in a later column leaks too: [32, 16] with mcc 16
    with pytest.raises(PropertyViolation, match=r"context partial of token 4 \(request 1, context 16\)"):
        context_partial_matches_context_attention(case([32, 16], workspace_size=32), UNMASKED)
    for variant in (FIXED, PRE):
        context_partial_matches_context_attention(case([32, 16], workspace_size=32), variant)
        context_partial_matches_context_attention(CONTEXT_ORDER_CASE, variant)
    chunked_prefill_matches_full_attention(CONTEXT_ORDER_CASE, FIXED)
