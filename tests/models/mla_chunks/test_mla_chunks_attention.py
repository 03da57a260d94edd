"""Numeric kernels (gather, attention with LSE, merge) and the torch SDPA cross-check of the full-attention
reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.engine.errors import ConfigError
from kvsim.models.mla_chunks.attention import (attention_with_lse, fp8_e4m3, gather_context_rows,
                                               init_mla_context_partial, mask_empty_context, merge_attn_states,
                                               run_prefill_context_chunk)
from kvsim.models.mla_chunks.prefill import (MlaShape, chunked_prefill_attention, full_attention_reference,
                                make_mla_prefill_inputs, up_project)
from kvsim.properties.mla_chunks.cases import BACKEND_CASE, KIMI_K3_SHAPE

torch = pytest.importorskip("torch")


def naive_attention(q, k, v, scale, causal=False):
    """Loops over tokens and heads: the textbook softmax, for one request."""
    tq, h = q.shape[:2]
    out, lse = np.zeros((tq, h, v.shape[2])), np.full((h, tq), -np.inf)
    for t in range(tq):
        for j in range(h):
            visible = k.shape[0] - tq + t + 1 if causal else k.shape[0]
            if visible <= 0:
                continue
            s = np.array([scale * q[t, j] @ k[i, j] for i in range(visible)])
            m = s.max()
            w = np.exp(s - m)
            out[t, j] = (w[:, None] * v[:visible, j]).sum(0) / w.sum()
            lse[j, t] = m + np.log(w.sum())
    return out, lse


def random_qkv(rng, tq, tk, h=2, d=5, dv=3):
    return rng.standard_normal((tq, h, d)), rng.standard_normal((tk, h, d)), rng.standard_normal((tk, h, dv))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq, tk", [(1, 1), (3, 7), (4, 4), (5, 2)])
def test_attention_with_lse_matches_the_textbook_loop(causal, tq, tk) -> None:
    q, k, v = random_qkv(np.random.default_rng(tq * 10 + tk), tq, tk)
    out, lse = attention_with_lse(q, k, v, 0.4, causal=causal)
    want_out, want_lse = naive_attention(q, k, v, 0.4, causal=causal)
    assert np.allclose(out, want_out, atol=1e-12) and np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    assert np.allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)], atol=1e-12)


def test_attention_over_no_keys_is_the_empty_state() -> None:
    q, k, v = random_qkv(np.random.default_rng(0), 3, 0)
    out, lse = attention_with_lse(q, k, v, 1.0)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


# -- merge_attn_states algebra (trtllm_flashinfer.md 2.5) --------------------------------------

def state(rng, t=3, h=2, d=4, empty=()):
    out, lse = rng.standard_normal((t, h, d)), rng.standard_normal((h, t)) * 3
    for i in empty:
        out[i], lse[:, i] = 0.0, -np.inf
    return out, lse


def test_merging_two_empty_states_stays_empty_without_nan() -> None:
    empty = (np.zeros((2, 2, 3)), np.full((2, 2), -np.inf))
    out, lse = merge_attn_states(*empty, *empty)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_empty_state_is_the_identity_and_plus_inf_reads_as_empty() -> None:
    rng = np.random.default_rng(1)
    s = state(rng)
    for empty_lse in (-np.inf, np.inf):  # FA2 reports +inf for an empty row (#15492)
        e = (np.zeros_like(s[0]), np.full_like(s[1], empty_lse))
        for merged in (merge_attn_states(*s, *e), merge_attn_states(*e, *s)):
            assert np.allclose(merged[0], s[0], rtol=0, atol=1e-15) and np.allclose(merged[1], s[1], atol=1e-15)


def test_a_nan_output_poisons_the_merge_even_with_zero_weight() -> None:
    """The kernels compute `op * wp + os * ws`, so masking must zero the output, not only set lse -inf."""
    rng = np.random.default_rng(2)
    good = state(rng)
    garbage = (np.full_like(good[0], np.nan), np.full_like(good[1], -np.inf))
    assert np.isnan(merge_attn_states(*garbage, *good)[0]).all()


@given(st.integers(0, 2 ** 16), st.lists(st.integers(0, 6), min_size=1, max_size=5))
def test_merging_any_split_of_the_keys_gives_full_attention(seed: int, sizes: list[int]) -> None:
    """Commutative, associative, empty pieces neutral: any split, merged in any order, is one softmax."""
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 3, sum(sizes))
    want_out, want_lse = attention_with_lse(q, k, v, 0.5)
    bounds = np.cumsum([0] + sizes)
    parts = [attention_with_lse(q, k[a:b], v[a:b], 0.5) for a, b in zip(bounds, bounds[1:])]
    order = rng.permutation(len(parts))
    acc = parts[order[0]]
    for i in order[1:]:
        acc = merge_attn_states(*acc, *parts[i]) if rng.random() < 0.5 else merge_attn_states(*parts[i], *acc)
        assert np.all(acc[1] >= np.maximum(parts[i][1], -np.inf) - 1e-12)  # lse >= each merged part's
    if sum(sizes) == 0:
        assert np.all(acc[0] == 0) and np.all(np.isneginf(acc[1]))
    else:
        assert np.allclose(acc[0], want_out, atol=1e-12) and np.allclose(acc[1], want_lse, atol=1e-12)


def test_tokens_past_the_context_cutoff_take_the_suffix_state_as_it_is() -> None:
    """`prefill_tokens_with_context` (the uniform plan's cut-off, vLLM's merge_attn_states parameter): tokens from
    the cut on copy the suffix, its LSE unconverted (+inf stays +inf); None merges every token."""
    rng = np.random.default_rng(3)
    (op, lp), (os_, ls) = state(rng, t=4), state(rng, t=4)
    ls[0, 3] = np.inf
    merged, merged_lse = merge_attn_states(op, lp, os_, ls)
    out, lse = merge_attn_states(op, lp, os_, ls, prefill_tokens_with_context=2)
    assert np.array_equal(out[:2], merged[:2]) and np.array_equal(lse[:, :2], merged_lse[:, :2])
    assert np.array_equal(out[2:], os_[2:]) and np.array_equal(lse[:, 2:], ls[:, 2:]) and lse[0, 3] == np.inf
    for cut in (-1, 0):
        assert np.array_equal(merge_attn_states(op, lp, os_, ls, prefill_tokens_with_context=cut)[0], os_)
    assert np.array_equal(merge_attn_states(op, lp, os_, ls, prefill_tokens_with_context=9)[0], merged)


def test_fp8_output_saturates_and_rounds_to_nearest_even_on_the_e4m3_grid() -> None:
    """The FP8 path (`output_scale`): `out / scale`, clamped to +-448, rounded to float8 e4m3fn (3 mantissa bits,
    subnormals in 2**-9 steps); the carry of a mantissa that rounds up moves to the next binade."""
    got = fp8_e4m3(np.array([31.73, -31.73, 1.9490, 17.0, 19.0, 500.0, -np.inf, 2.0 ** -10, 3 * 2.0 ** -10, 0.0,
                             np.nan]))
    assert got[:10].tolist() == [32.0, -32.0, 2.0, 16.0, 20.0, 448.0, -448.0, 0.0, 2.0 ** -8, 0.0]
    assert np.isnan(got[10])
    rng = np.random.default_rng(4)
    (op, lp), (os_, ls) = state(rng), state(rng)
    merged, merged_lse = merge_attn_states(op, lp, os_, ls)
    out, lse = merge_attn_states(op, lp, os_, ls, output_scale=0.25)
    assert np.array_equal(out, fp8_e4m3(merged * 4.0)) and np.array_equal(lse, merged_lse)  # the LSE stays fp32


def test_merge_rejects_mismatched_shapes() -> None:
    with pytest.raises(ConfigError, match="merge_attn_states shapes"):
        merge_attn_states(np.zeros((2, 1, 3)), np.zeros((1, 2)), np.zeros((3, 1, 3)), np.zeros((1, 3)))


# -- gather, masking, init ------------------------------------------------------------------------

def test_gather_follows_the_block_table() -> None:
    cache = np.arange(4 * 2 * 1, dtype=float).reshape(4, 2, 1)  # block b holds rows 2b, 2b+1
    table = np.array([[3, 1], [2, 0]])  # request 0: blocks 3 then 1; request 1: blocks 2 then 0
    rows = gather_context_rows(cache, table, cu_seq_lens=[0, 3, 4], token_to_seq=[0, 0, 0, 1], seq_starts=[1, 2])
    # request 0 positions 1,2,3 -> block 3 slot 1, block 1 slots 0,1; request 1 position 2 -> block 0 slot 0
    assert rows[:, 0].tolist() == [7.0, 2.0, 3.0, 0.0]
    assert gather_context_rows(cache, table, [0, 0], [], [0]).shape == (0, 1)
    with pytest.raises(ConfigError, match="kv_cache"):
        gather_context_rows(cache[0], table, [0], [], [0])


def test_mask_empty_context_and_init_partial() -> None:
    out, lse = np.ones((6, 2, 3)), np.zeros((2, 6))
    mask_empty_context(lse, out, query_start_loc=[0, 2, 5, 6], cu_seq_lens=[0, 4, 4, 9])
    assert np.all(out[2:5] == 0) and np.all(np.isneginf(lse[:, 2:5]))
    assert np.all(out[:2] == 1) and np.all(out[5:] == 1) and np.all(lse[:, :2] == 0)
    acc, acc_lse = init_mla_context_partial(np.zeros((1, 2, 3)), 6, [slice(1, 3)])
    assert np.all(acc[1:3] == 0) and np.all(np.isneginf(acc_lse[:, 1:3]))
    assert np.isnan(acc[0]).all() and np.isnan(acc[3:]).all()  # torch.empty: never read before written


def test_backend_scratch_for_an_empty_span_is_nan_with_finite_lse() -> None:
    q, k, v = random_qkv(np.random.default_rng(3), 3, 2)
    out, lse = run_prefill_context_chunk(q, k, v, query_start_loc=[0, 1, 3], cu_seq_lens=[0, 0, 2], scale=1.0)
    assert np.isnan(out[0]).all() and np.isfinite(lse[:, 0]).all()
    assert np.allclose(out[1:], attention_with_lse(q[1:], k, v, 1.0)[0])


# -- torch scaled_dot_product_attention: the independent full-attention oracle ------------------

def sdpa_full_attention(inputs, dtype):
    """Per request: SDPA over [context | new], the mask all-true on the context and lower-triangular on the new
    tokens (the mask vLLM's test_mla_backends.py builds)."""
    qsl = inputs.query_start_loc
    outs = []
    for r, (c, lat) in enumerate(zip(inputs.context_lens, inputs.latent)):
        k, v = up_project(lat, inputs)
        n = inputs.query_lens[r]
        mask = torch.ones((n, c + n), dtype=torch.bool)
        mask[:, c:] = torch.tril(torch.ones((n, n), dtype=torch.bool))
        q = torch.from_numpy(inputs.q[qsl[r]:qsl[r + 1]]).to(dtype).transpose(0, 1)  # [H, T, D]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, torch.from_numpy(np.ascontiguousarray(k)).to(dtype).transpose(0, 1),
            torch.from_numpy(v).to(dtype).transpose(0, 1), attn_mask=mask, scale=inputs.shape.softmax_scale)
        outs.append(out.transpose(0, 1).to(torch.float64).numpy())
    return np.concatenate(outs, axis=0)


BATCHES = [
    ((64, 0, 64, 0), (4, 4, 4, 4), MlaShape()),
    ((37, 100, 5), (3, 2, 1), MlaShape(num_heads=3, kv_lora_rank=16, qk_rope_head_dim=8)),
    ((200, 48, 32, 0), (8, 4, 6, 5), KIMI_K3_SHAPE),  # kv_lora 512 + rope 64, the real latent width
]


@pytest.mark.parametrize("ctx, q, shape", BATCHES)
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-5)])
def test_full_attention_reference_matches_torch_sdpa(ctx, q, shape, dtype, tol) -> None:
    inputs = make_mla_prefill_inputs(ctx, q, shape, seed=7)
    want = sdpa_full_attention(inputs, getattr(torch, dtype))
    got, _ = full_attention_reference(inputs)
    assert np.allclose(got, want, rtol=tol, atol=tol), np.abs(got - want).max()


@pytest.mark.parametrize("ctx, q, shape", BATCHES)
def test_chunked_prefill_matches_torch_sdpa(ctx, q, shape) -> None:
    inputs = make_mla_prefill_inputs(ctx, q, shape, seed=11)
    want = sdpa_full_attention(inputs, torch.float64)
    for workspace, block in ((32, 16), (128, 16), (7, 1)):
        got = chunked_prefill_attention(inputs, workspace_size=workspace, max_num_seqs=1, block_size=block)
        assert np.allclose(got.output, want, rtol=1e-10, atol=1e-12), (workspace, block)


@pytest.mark.parametrize("nope, v_dim", [(128, 128), (192, 256)])  # DeepSeek-R1 and the "glm" dims
def test_backend_correctness_batch_at_deepseek_r1_tp16_dims(nope, v_dim) -> None:
    """seq_lens [1568, 520, 8, 80, 96, 8], query_lens [32, 8, 8, 16, 16, 8], W 1024, 128 / 16 = 8 heads per rank."""
    shape = MlaShape(num_heads=8, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=nope, v_head_dim=v_dim)
    inputs = make_mla_prefill_inputs(BACKEND_CASE.context_lens, BACKEND_CASE.query_lens, shape, seed=42)
    got = chunked_prefill_attention(inputs, workspace_size=1024, max_num_seqs=1, block_size=16)
    assert len(got.metadata.chunks) == 3
    assert np.allclose(got.output, sdpa_full_attention(inputs, torch.float64), rtol=1e-10, atol=1e-12)


def test_sdpa_cross_check_can_fail(monkeypatch) -> None:
    """Planted mutation: a reference that forgets the causal mask on the new tokens disagrees with SDPA."""
    from kvsim.models.mla_chunks import prefill

    inputs = make_mla_prefill_inputs((16, 3), (3, 2), MlaShape(), seed=5)
    want = sdpa_full_attention(inputs, torch.float64)
    real = prefill.attention_with_lse
    monkeypatch.setattr(prefill, "attention_with_lse", lambda q, k, v, scale, causal=False: real(q, k, v, scale))
    assert not np.allclose(full_attention_reference(inputs)[0], want, atol=1e-6)


def test_gather_rejects_metadata_that_would_read_out_of_bounds():
    import numpy as np
    import pytest as _pytest

    from kvsim.engine.errors import ConfigError
    from kvsim.models.mla_chunks.attention import gather_context_rows
    cache = np.arange(4 * 2 * 1, dtype=np.float64).reshape(4, 2, 1)
    table = np.array([[0, 1]])
    assert gather_context_rows(cache, table, [0, 3], [0, 0, 0], [0]).ravel().tolist() == [0.0, 1.0, 2.0]
    with _pytest.raises(ConfigError, match="cu_seq_lens/seq_starts"):
        gather_context_rows(cache, table, [1, 3], [0, 0, 0], [0])  # position -1 would wrap to the last row
    with _pytest.raises(ConfigError, match="block_table"):
        gather_context_rows(cache, np.array([[0, 4]]), [0, 3], [0, 0, 0], [0])
    with _pytest.raises(ConfigError, match="token_to_seq"):
        gather_context_rows(cache, table, [0, 3], [0, 0, 1], [0])


@pytest.mark.parametrize("rows, lora, heads, dim", [(0, 8, 2, 4), (7, 8, 2, 4), (130, 512, 2, 128), (3, 4, 1, 1)])
def test_latent_times_is_tensordot_to_the_bit(rows, lora, heads, dim) -> None:
    """The up-projection's product is `np.tensordot(kv_c, w, axes=1)` byte for byte, on the strided latent slice."""
    from kvsim.models.mla_chunks.prefill import _latent_times

    rng = np.random.default_rng(rows)
    kv_c = rng.standard_normal((rows, lora + 64))[:, :lora]
    weight = rng.standard_normal((lora, heads, dim)) / 3
    got, want = _latent_times(kv_c, weight), np.tensordot(kv_c, weight, axes=1)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
