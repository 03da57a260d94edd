"""pd-staging byte movement (kvsim.models.pd_staging.copy) and the end-to-end KV property on both variants."""

from dataclasses import replace

import numpy as np
import pytest

from kvsim.app import catalog
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.runner import run_property
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging.copy import (decode_scatter_pages, gather_head_slice_to_staging, scatter_staging_to_paged,
                                    scatter_staging_to_pages, stack_paged_kv)
from kvsim.models.pd_staging.layout import HeadReshard, compute_staging_layout
from kvsim.models.pd_staging.variants import FIXED, VARIANTS
from kvsim.properties.pd_staging import e2e
from kvsim.properties.pd_staging.cases import (LLAMA_31_8B, LLAMA_CASES, LLAMA_COLD, LLAMA_DECODE_HIT,
                                               LLAMA_PREFILL_HIT, SCENARIO_A, SCENARIO_B, TransferCase)
from kvsim.properties.pd_staging.e2e import check_transfer

PRE = VARIANTS["pre_05c7ebf"]

PROP = {p.name: p for p in catalog.load().properties_of("pd-staging")}["decode_kv_matches_single_server"]


def _pool(layers: int, pages: int, ps: int, heads: int, dim: int) -> np.ndarray:
    n = layers * 2 * pages * ps * heads * dim
    return np.arange(n, dtype=np.int32).reshape(layers, 2, pages, ps, heads, dim)


# ---- the copies --------------------------------------------------------------------------------------------

def test_gather_packs_writer_major_k_before_v_token_major():
    """Llama pairing, decode rank 1, writer 1 (prefill rank 3): its bytes follow writer 0's, K layers then V."""
    (_, w0), (_, w1) = layout.writers_of_decode_rank(LLAMA_31_8B, 1)
    pool = _pool(2, 3, 2, 2, 1)  # int32, head_dim 1: head_bytes 4
    lay = compute_staging_layout(LLAMA_31_8B, 1, 4, 2, 4)
    slot = gather_head_slice_to_staging(pool, [2, 0], w1, lay)
    assert lay.writer_offsets == (0, 128) and len(slot) == 256 and not slot[:128].any()
    values = slot[128:].view(np.int32)
    want = np.concatenate([pool[layer, kv, [2, 0]].reshape(-1) for kv in (0, 1) for layer in (0, 1)])
    assert values.tolist() == want.tolist()
    local = gather_head_slice_to_staging(pool, [2, 0], w1, lay, np.zeros(128, np.uint8), offset=0)
    assert local.tobytes() == slot[128:].tobytes()  # the prefill-local buffer one RDMA write ships


def test_scatter_is_the_inverse_of_gather_on_the_writers_heads_only():
    res = HeadReshard(8, 1, 4)  # one writer sending heads [2, 4) of its 8
    (_, params), = layout.writers_of_decode_rank(res, 1)
    assert (params.src_head_start, params.num_heads, params.dst_head_start) == (2, 2, 0)
    src = _pool(3, 4, 2, 8, 3)
    lay = compute_staging_layout(res, 1, 6, 3, 12)
    slot = gather_head_slice_to_staging(src, [3, 1, 2], params, lay)
    dst = np.full((3, 2, 5, 2, 2, 3), -1, dtype=np.int32)
    scatter_staging_to_pages(dst, slot, [4, 0, 2], params, lay)
    assert (dst[:, :, [4, 0, 2]] == src[:, :, [3, 1, 2], :, 2:4]).all()
    assert (dst[:, :, [1, 3]] == -1).all()


@pytest.mark.parametrize("variant", [FIXED, PRE])
def test_slot_scatter_is_every_writer_at_the_rows_of_the_arrival(variant):
    """Decode rank 0 of the Llama pairing, decode prefix 4 pages: both writers land on the same pages."""
    writers = [p for _, p in layout.writers_of_decode_rank(LLAMA_31_8B, 0)]
    lay = compute_staging_layout(LLAMA_31_8B, 0, 2 * 4, 1, 4)
    slot = np.random.default_rng(0).integers(0, 256, lay.total_bytes, dtype=np.uint8)
    rows = np.random.default_rng(1).permutation(10)[:8].repeat(4) * 4 + np.tile(np.arange(4), 8)
    pool = _pool(1, 10, 4, 4, 1)
    got = scatter_staging_to_paged(pool.copy(), slot, rows, 1, 2, 16, writers, lay, variant=variant)
    pages = decode_scatter_pages(rows, 1, 2, 16, 4, variant)
    assert pages.tolist() == (rows[[20, 24]] // 4 if variant == FIXED else rows[[4, 8]] // 4).tolist()
    want = pool.copy()
    for params in writers:
        scatter_staging_to_pages(want, slot, pages, params, lay)
    assert got.tobytes() == want.tobytes()


def test_copies_refuse_inconsistent_arguments():
    (_, params), = layout.writers_of_decode_rank(HeadReshard(8, 1, 4), 0)
    pool = _pool(1, 2, 2, 8, 1)
    lay = compute_staging_layout(HeadReshard(8, 1, 4), 0, 4, 1, 4)
    with pytest.raises(ConfigError, match="layout.tokens"):
        gather_head_slice_to_staging(pool, [0], params, lay)
    with pytest.raises(ConfigError, match="page_indices"):
        gather_head_slice_to_staging(pool, [0, 2], params, lay)
    with pytest.raises(ConfigError, match="staging"):
        gather_head_slice_to_staging(pool, [0, 1], params, lay, np.zeros(8, np.uint8))
    with pytest.raises(ConfigError, match="kv"):
        scatter_staging_to_pages(pool[0], np.zeros(64, np.uint8), [0, 1], params, lay)
    k = np.zeros((2, 2, 8, 1), np.float16)
    assert stack_paged_kv([(k, k + 1)]).shape == (1, 2, 2, 2, 8, 1)
    with pytest.raises(ConfigError, match="layers"):
        stack_paged_kv([(k, k[:1])])


def test_scatter_rows_start_at_the_decode_prefix_only_after_the_fix():
    rows = np.arange(1024)[::-1].copy()  # slots in reverse: page of row r is (1023 - r) // 16
    fixed = decode_scatter_pages(rows, 0, 16, 512, 16, FIXED)
    old = decode_scatter_pages(rows, 0, 16, 512, 16, PRE)
    assert fixed.tolist() == [(1023 - r) // 16 for r in range(512, 768, 16)]  # scenario B: rows [512, 768)
    assert old.tolist() == [(1023 - r) // 16 for r in range(0, 256, 16)]  # the cached prefix rows [0, 256)
    with pytest.raises(ConfigError, match="req_to_token"):
        decode_scatter_pages(rows, 61, 4, 0, 16)


# ---- the end-to-end property --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", LLAMA_CASES, ids=["cold", "prefill-hit", "decode-hit"])
def test_llama_31_8b_accuracy_case_matches_a_single_server_after_the_fix(case):
    check_transfer(case, FIXED)
    check_transfer(replace(case, deferred_scatter=True), FIXED)


def test_llama_cold_request_is_the_same_on_both_variants():
    check_transfer(LLAMA_COLD, PRE)  # no radix hit on either side: nothing to get wrong


def test_llama_prefill_hit_fails_the_room_before_the_fix():
    """P_tp 4 > D_tp 2: the 56-page first send no longer fits the one-slot prefill buffer (#31217)."""
    with pytest.raises(PropertyViolation, match=r"failed room: prefill rank 0's write of send 0 .* refused"):
        check_transfer(LLAMA_PREFILL_HIT, PRE)


def test_llama_decode_hit_overwrites_the_cached_prefix_before_the_fix():
    """The 7 suffix pages land on rows [0, 112) of the shared prefix; rows [896, 1000) stay garbage."""
    with pytest.raises(PropertyViolation, match=r"216 prompt rows differ \(112 in the cached prefix \[0, 896\)\) "
                                                r"and 0 rows of other pages; first: token 0 \(cached prefix row\)"):
        check_transfer(LLAMA_DECODE_HIT, PRE)


def test_scenario_b_prefix_overwrite_and_scenario_a_overrun_before_the_fix():
    up = HeadReshard(8, 1, 4)  # one writer sending a subset of heads: the multi-slot send fits the prefill buffer
    b = TransferCase(SCENARIO_B, up, 1, 2)
    with pytest.raises(PropertyViolation, match="cached prefix row"):
        check_transfer(b, PRE)
    a = TransferCase(SCENARIO_A, up, 1, 2)
    check_transfer(a, PRE)  # scattered before anything else lands in the overrun slots: no harm
    with pytest.raises(PropertyViolation, match="suffix row"):  # the last send overwrote the overrun's V bytes
        check_transfer(replace(a, deferred_scatter=True), PRE)
    check_transfer(replace(a, deferred_scatter=True), FIXED)


def test_property_passes_on_fixed():
    result = run_property(PROP, FIXED, max_examples=200, seed=0)
    assert result.status == "passed", result.message
    assert result.examples >= 200


def test_property_fails_on_pre_fix_without_pinned_examples():
    result = run_property(PROP, PRE, max_examples=300, seed=0, use_examples=False)
    assert result.status == "failed"
    case = result.counterexample["case"]
    assert case["room"]["prompt_len"] == 2 and (case["room"]["prefill_hit"] or case["room"]["decode_prefix_len"])


def test_property_catches_a_planted_head_offset_mutation(monkeypatch):
    """Every writer landing at local head 0 (dst_head_start dropped): two writers overwrite each other."""
    real = layout.writers_of_decode_rank

    def mutant(cfg, rank):
        return tuple((r, replace(p, dst_head_start=0)) for r, p in real(cfg, rank))

    monkeypatch.setattr(e2e.layout, "writers_of_decode_rank", mutant)
    with pytest.raises(PropertyViolation, match="paged KV of decode rank 0"):
        check_transfer(LLAMA_COLD, FIXED)
    result = run_property(PROP, FIXED, max_examples=300, seed=0, use_examples=False)
    assert result.status == "failed"
    reshard = result.counterexample["case"]["reshard"]
    assert reshard["prefill_tp"] > reshard["decode_tp"]


def test_case_validation_names_the_field():
    with pytest.raises(ConfigError, match="dtype"):
        TransferCase(SCENARIO_A, LLAMA_31_8B, dtype="bfloat16")
    with pytest.raises(ConfigError, match="head_dim"):
        TransferCase(SCENARIO_A, LLAMA_31_8B, head_dim=0)
