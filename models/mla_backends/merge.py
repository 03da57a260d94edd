"""Attention states and their merge in base 2 (FlashInfer `merge_state`, `merge_states`; research note 2.5).

A state of one (query, head) over a set of keys is `(v, s)`: `v` the softmax-weighted value (0 if
no key is visible) and `s = log2(sum_j 2^(s_j log2 e))` the base-2 log-sum-exp of its logits
(`-inf` if empty), in float32, shapes `v [T, H, D]`, `s [T, H]`. Merging two states is

    m = max(s_a, s_b),  w_a = 2^(s_a - m),  w_b = 2^(s_b - m)
    v = (v_a w_a + v_b w_b) / (w_a + w_b),  s = m + log2(w_a + w_b)

and `(0, -inf)` is its identity. With both sides empty, `m = -inf` and `s - m = -inf - -inf` is
NaN unless the kernel guards it (`MlaBackendsVariant.merge_guards_empty_state`: FlashInfer's CUDA
paths since #4401; the Python trace references and the Triton merges of 0.7.4 do not, #4051).

`attention_state` is the reference attention of one request (absorbed MLA: the query `[q_lat, q_pe]`
576 wide, the shared key `[c, k_pe]`, the value `c`), causal bottom-right aligned: query `i` of a
`q_len` block sits at `kv_len - q_len + i`. A row with no visible key is the empty state, unless
`masked_rows_lse_neg_inf` is off (#4452: the kernel filled masked base-2 logits with a finite -5e4 and
returned LSE -5e4 + log2(kv_len), -49994 for 64 keys, and the mean of the values for such rows).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .variants import FIXED, MlaBackendsVariant

LOG2E = 1.0 / math.log(2.0)
MASK_FILL_BASE2 = -5.0e4  # the finite mask value of the pre-#4452 kernel, on its base-2 logits


def empty_state(tokens: int, heads: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((tokens, heads, dim), np.float32), np.full((tokens, heads), -np.inf, np.float32)


def check_states(*states: tuple[np.ndarray, np.ndarray], stacked: bool = False, lse_float32: bool = False) -> None:
    """States that merge: each `v [T, H, D]` with `s [T, H]` (`stacked`: `v [T, n, H, D]`, `s [T, n, H]`), all of
    the same shapes; `lse_float32`: the LSEs are float32 (a merge in place writes them). ValueError otherwise
    (FlashInfer's launchers assert the same; numpy would broadcast)."""
    rank = 4 if stacked else 3
    for v, s in states:
        v, s = np.asarray(v), np.asarray(s)
        if v.ndim != rank or s.ndim != rank - 1 or v.shape[:-1] != s.shape:
            raise ValueError(f"state: expected v of rank {rank} and s of its shape less the last, got v "
                             f"{list(v.shape)} and s {list(s.shape)}")
        if lse_float32 and s.dtype != np.float32:
            raise ValueError(f"state: expected a float32 LSE, got {s.dtype}")
    shapes = {(np.shape(v), np.shape(s)) for v, s in states}
    if len(shapes) > 1:
        raise ValueError(f"states: expected one shape, got {sorted(shapes)}")


def merge_state(v_a: np.ndarray, s_a: np.ndarray, v_b: np.ndarray, s_b: np.ndarray,
                variant: MlaBackendsVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """Merge two base-2 states in float32 (`flashinfer.merge_state`)."""
    s_a, s_b = np.asarray(s_a, np.float32), np.asarray(s_b, np.float32)
    v_a, v_b = np.asarray(v_a, np.float32), np.asarray(v_b, np.float32)
    m = np.maximum(s_a, s_b)
    # the empty-state guard (#4401): with both sides empty shift by 0, so both weights are 2^-inf = 0
    shift = np.where(np.isneginf(m), np.float32(0), m) if variant.merge_guards_empty_state else m
    with np.errstate(invalid="ignore", divide="ignore"):
        w_a, w_b = np.exp2(s_a - shift), np.exp2(s_b - shift)
        total = w_a + w_b
        denom = np.where(total > 0, total, np.float32(1)) if variant.merge_guards_empty_state else total
        v = (v_a * w_a[..., None] + v_b * w_b[..., None]) / denom[..., None]
        s = shift + np.log2(total)
    return v.astype(np.float32), s.astype(np.float32)


def merge_states(v: np.ndarray, s: np.ndarray, variant: MlaBackendsVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """Merge `n` states in one pass (`flashinfer.merge_states`): `v [T, n, H, D]`, `s [T, n, H]`."""
    s, v = np.asarray(s, np.float32), np.asarray(v, np.float32)
    m = s.max(axis=1)
    shift = np.where(np.isneginf(m), np.float32(0), m) if variant.merge_guards_empty_state else m
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.exp2(s - shift[:, None, :])
        total = w.sum(axis=1)
        denom = np.where(total > 0, total, np.float32(1)) if variant.merge_guards_empty_state else total
        out = (v * w[..., None]).sum(axis=1) / denom[..., None]
        lse = shift + np.log2(total)
    return out.astype(np.float32), lse.astype(np.float32)


def merge_all(states: Sequence[tuple[np.ndarray, np.ndarray]],
              variant: MlaBackendsVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """Fold `merge_state` left to right over a non-empty list of states."""
    v, s = states[0]
    for v_b, s_b in states[1:]:
        v, s = merge_state(v, s, v_b, s_b, variant)
    return v, s


def merge_weights(s_parts: Sequence[np.ndarray], s_merged: np.ndarray) -> list[np.ndarray]:
    """Each part's weight in the merged state, `2^(s_c - s)` (0 for an empty part)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return [np.where(np.isneginf(sc), 0.0, np.exp2(np.float64(sc) - np.float64(s_merged))) for sc in s_parts]


def attention_state(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, *, causal: bool = False,
                    key_offset: int = 0, kv_len: int | None = None, logit_cap: float = 0.0,
                    variant: MlaBackendsVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """The base-2 state of queries `q [Tq, H, Dqk]` over keys `k [Tk, Dqk]`, values `v [Tk, Dv]` (MLA: one
    shared latent key and value for every head).

    The keys are positions `key_offset .. key_offset + Tk` of a request of `kv_len` keys (default `Tk`),
    so a chunk of a longer context masks causally against its absolute positions. `logit_cap` > 0 soft-caps
    the scaled logits, `cap * tanh(logit / cap)` (vLLM's Triton decode `logit_cap`; 0: none).
    """
    tq, heads = q.shape[0], q.shape[1]
    tk, dv = k.shape[0], v.shape[1]
    total = tk if kv_len is None else kv_len
    if tk == 0:
        return empty_state(tq, heads, dv)
    logits = np.einsum("thd,sd->ths", q.astype(np.float64), k.astype(np.float64)) * scale
    if logit_cap > 0:
        logits = logit_cap * np.tanh(logits / logit_cap)
    if causal:
        pos = key_offset + np.arange(tk)
        visible = pos[None, :] <= (total - tq + np.arange(tq))[:, None]
        fill = -np.inf if variant.masked_rows_lse_neg_inf else MASK_FILL_BASE2 / LOG2E  # #4452: a finite fill
        logits = np.where(visible[:, None, :], logits, fill)
    peak = logits.max(axis=-1)
    safe = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.exp(logits - safe[..., None])
    norm = weights.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = (np.log(norm) + safe) * LOG2E
    probs = weights / np.where(norm > 0, norm, 1.0)[..., None]
    out = np.einsum("ths,sd->thd", probs, v.astype(np.float64))
    return out.astype(np.float32), lse.astype(np.float32)


def chunked_attention_state(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, bounds: Sequence[int], *,
                            causal: bool = False, order: Sequence[int] | None = None,
                            variant: MlaBackendsVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """Attention over key chunks `[bounds[i], bounds[i+1])`, each a state, merged in `order` (default: in turn)."""
    parts = [attention_state(q, k[a:b], v[a:b], scale, causal=causal, key_offset=a, kv_len=k.shape[0],
                             variant=variant) for a, b in zip(bounds, bounds[1:])]
    if not parts:
        return empty_state(q.shape[0], q.shape[1], v.shape[1])
    chosen = [parts[i] for i in (order if order is not None else range(len(parts)))]
    return merge_all(chosen, variant)


def to_natural_lse(lse2: np.ndarray) -> np.ndarray:
    """A base-2 LSE as the natural-log LSE vLLM and FlashAttention use (`basee = base2 * ln 2`)."""
    return np.asarray(lse2, np.float64) * math.log(2.0)
