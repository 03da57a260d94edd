"""The model's merge follows the kernels' fmax on a NaN LSE (divergence found by `kvsim conform vllm` against
vLLM 0.33.0's Triton merge_attn_states, settled as a model fix)."""

import numpy as np

from kvsim.models.mla_chunks.attention import merge_attn_states


def _one(lp: float, ls: float) -> tuple[np.ndarray, np.ndarray]:
    out = np.ones((1, 1, 2))
    return merge_attn_states(out, np.array([[lp]]), 2 * out, np.array([[ls]]))


def test_nan_beside_an_empty_state_merges_to_the_empty_state():
    for empty in (-np.inf, np.inf):  # +inf: FA2's report of an empty row
        for lp, ls in ((np.nan, empty), (empty, np.nan)):
            out, lse = _one(lp, ls)
            assert np.all(out == 0) and np.isneginf(lse).all(), (lp, ls, out, lse)


def test_nan_beside_a_finite_lse_stays_nan_and_finite_pairs_are_unchanged():
    out, lse = _one(np.nan, 0.5)
    assert np.isnan(lse).all() and np.isnan(out).all()
    out, lse = _one(0.0, 0.0)
    assert np.allclose(out, 1.5) and np.allclose(lse, np.log(2.0))
    out, lse = _one(-np.inf, -np.inf)
    assert np.all(out == 0) and np.isneginf(lse).all()
