"""The DCP rank model and both forms of `reorg_kvcache`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_chunks.dcp import (DcpConfig, dcp_global_position, dcp_local_index, dcp_local_positions, dcp_rank_of,
                            get_dcp_local_seq_lens, reorg_kvcache, reorg_kvcache_by_chunk_index, reorg_source_rows)
from kvsim.models.mla_chunks.planner import FIXED
from kvsim.models.mla_chunks.variants import VARIANTS
from kvsim.properties.mla_chunks.cases import case
from kvsim.properties.mla_chunks.dcp import _local_rows_in_span, check_dcp_coverage, check_dcp_reorg, rank_buffers

PRE = VARIANTS["pre_b38e111d"]

layouts = st.tuples(st.integers(1, 8), st.integers(1, 8)).map(lambda t: DcpConfig(*t))


def test_rank_model_by_hand() -> None:
    dcp = DcpConfig(world_size=2, interleave=2)  # positions 0,1 -> rank 0; 2,3 -> rank 1; 4,5 -> rank 0 ...
    assert [dcp_rank_of(p, dcp) for p in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [dcp_local_index(p, dcp) for p in range(8)] == [0, 1, 0, 1, 2, 3, 2, 3]
    assert get_dcp_local_seq_lens(7, dcp) == (4, 3)
    assert dcp_local_positions(7, 1, dcp).tolist() == [2, 3, 6]
    assert dcp.padded_rows(7) == 4 and dcp.padded_rows(8) == 4 and dcp.padded_rows(9) == 6


@given(layouts, st.integers(0, 500))
def test_rank_model_is_a_bijection(dcp: DcpConfig, n: int) -> None:
    lens = get_dcp_local_seq_lens(n, dcp)
    assert sum(lens) == n and max(lens) <= dcp.padded_rows(n)
    for rank in range(dcp.world_size):
        positions = dcp_local_positions(n, rank, dcp).tolist()
        assert len(positions) == lens[rank]
        assert all(dcp_rank_of(p, dcp) == rank and dcp_local_index(p, dcp) == j for j, p in enumerate(positions))
        assert all(dcp_global_position(rank, j, dcp) == p for j, p in enumerate(positions))
    assert sorted(p for r in range(dcp.world_size) for p in dcp_local_positions(n, r, dcp).tolist()) == list(range(n))


def test_dcp_config_validates() -> None:
    with pytest.raises(ConfigError, match="dcp_world_size: expected an integer >= 1, got 0"):
        DcpConfig(0)
    with pytest.raises(ConfigError, match="cp_kv_cache_interleave_size"):
        DcpConfig(2, interleave=True)


def test_reorg_forms_agree_on_the_uniform_plan_when_it_is_aligned() -> None:
    """mcc a multiple of world*interleave: local_starts of chunk i are all i*P, so both forms are the same call."""
    c = case([300, 200, 50], [1, 1, 1], block_size=128, workspace_size=1024, dcp_world_size=2, dcp_interleave=64)
    md = c.metadata(PRE)
    assert md.max_context_chunk % c.dcp.virtual_block == 0
    for ch in md.chunks:
        buffers = rank_buffers(ch, c.dcp)
        old, _ = reorg_kvcache_by_chunk_index(buffers, None, ch.padded_local_seq_lens, ch.local_context_lens_allranks,
                                              ch.cu_seq_lens[-1], ch.max_seq_len, md.local_chunk_size, ch.index,
                                              ch.num_local_context_tokens)
        new, _ = reorg_kvcache(buffers, None, ch.padded_local_seq_lens, ch.local_context_lens_allranks,
                               ch.local_starts, ch.cu_seq_lens[-1], ch.max_seq_len, ch.num_local_context_tokens)
        assert np.array_equal(old, new)
    check_dcp_coverage(md.chunks, c.dcp)
    check_dcp_reorg(md.chunks, c.dcp, md.local_chunk_size, PRE)


def test_reorg_applies_the_same_rows_to_kv_c_and_k_pe() -> None:
    kv_c = np.arange(8.0).reshape(8, 1)
    k_pe = -kv_c
    out_c, out_pe = reorg_kvcache(kv_c, k_pe, [2], [[2, 1]], [0], 3, 3, toks=4)
    assert out_c[:, 0].tolist() == [0.0, 1.0, 4.0] and np.array_equal(out_pe, -out_c)


def test_reorg_asserts_name_both_numbers() -> None:
    with pytest.raises(PropertyViolation, match=r"longest request: expected 5 \(max_seq_len\), got 3"):
        reorg_kvcache(np.zeros((8, 1)), None, [2], [[2, 1]], [0], 3, 5, toks=4)
    with pytest.raises(ConfigError, match="one per request"):
        reorg_source_rows([2, 2], [[2, 1]], [0, 0], 4)


def test_reorg_check_catches_the_old_form_on_the_new_plan(monkeypatch) -> None:
    """Planted mutation: the fixed variant calling the chunk-index form loses requests 1-2 of [3000, 200, 200]."""
    from kvsim.models.mla_chunks import prefill

    c = case([3000, 200, 200], block_size=128, dcp_world_size=2, dcp_interleave=64)
    md = c.metadata(FIXED)
    check_dcp_reorg(md.chunks, c.dcp, None, FIXED)
    real = prefill.reorg_kvcache

    def chunk_index_form(allgathered, k_pe, padded, local_ctx, local_starts, *rest, **kw):
        return real(allgathered, k_pe, padded, local_ctx, [512 * chunk] * len(local_starts), *rest, **kw)

    monkeypatch.setattr(prefill, "reorg_kvcache", chunk_index_form)
    for chunk in range(4):
        if chunk == 3:
            with pytest.raises(PropertyViolation, match=r"rows after reorg_kvcache of chunk 3: expected 400 "
                                                        r"\(cu_seq_lens\[-1\]\), got 0"):
                check_dcp_reorg(md.chunks[3:], c.dcp, None, FIXED)
        else:
            check_dcp_reorg(md.chunks[chunk:chunk + 1], c.dcp, None, FIXED)  # chunk i of request 0: i * 512 is right


@pytest.mark.parametrize("dcp", [DcpConfig(2, 1), DcpConfig(2, 4), DcpConfig(4, 2), DcpConfig(3, 3)])
def test_local_rows_in_span_are_the_filtered_local_rows(dcp: DcpConfig) -> None:
    """The reorg check's walk that stops past the span gives every local row whose position is in the span."""
    for rank in range(dcp.world_size):
        for first in range(0, 9):
            for start in range(0, 20, 3):
                for stop in range(start, 30, 4):
                    want = [j for j in range(first, 12) if start <= dcp_global_position(rank, j, dcp) < stop]
                    assert _local_rows_in_span(rank, first, 12, start, stop, dcp) == want
