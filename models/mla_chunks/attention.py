"""Numeric kernels of MLA chunked context, in float64 numpy: gather, attention with LSE, merge.

CPU references for the kernels the MLA prefill path launches (vLLM b38e111d, research
note `vllm.md` 1.6 and `trtllm_flashinfer.md` 2.5):

* `gather_context_rows`: `gather_and_maybe_dequant_cache` / `cp_gather_cache`
  (`csrc/cache_kernels.cu`) without dequantisation;
* `attention_with_lse`: one request's (causal or non-causal) attention returning the
  natural-log LSE in the `[H, T]` layout vLLM and FlashAttention use;
* `merge_attn_states`: the log-sum-exp merge, with `+inf` LSE read as `-inf` (#15492) and
  two empty states giving output 0 and LSE `-inf` (#28181, #39148), never NaN;
* `mask_empty_context` (#49294) and `init_mla_context_partial` (b38e111d).

Shapes: outputs `[T, H, D]`, LSEs `[H, T]`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kvsim.engine.errors import ConfigError

# What a backend leaves for a query whose KV span is empty: uninitialised scratch. #49294
# describes NaN/Inf output with a *finite* LSE, the case that defeats an LSE-only guard.
EMPTY_SPAN_OUTPUT = float("nan")
EMPTY_SPAN_LSE = 0.0


def gather_context_rows(kv_cache: np.ndarray, block_table: np.ndarray, cu_seq_lens: Sequence[int],
                        token_to_seq: Sequence[int], seq_starts: Sequence[int]) -> np.ndarray:
    """Row `t` of the workspace: request `b = token_to_seq[t]`, position `seq_starts[b] + t - cu_seq_lens[b]`,
    read from `kv_cache[block_table[b, pos // block_size], pos % block_size]`.

    `kv_cache` is `[num_blocks, block_size, D]`; `block_table` has one row per request of
    the chunk (upstream passes `block_table[chunk.request_slice]`).
    """
    if kv_cache.ndim != 3:
        raise ConfigError("kv_cache", "a [num_blocks, block_size, D] array", kv_cache.shape)
    block_size = kv_cache.shape[1]
    seq = np.asarray(token_to_seq, dtype=np.int64)
    cu = np.asarray(cu_seq_lens, dtype=np.int64)
    starts = np.asarray(seq_starts, dtype=np.int64)
    if seq.size == 0:
        return np.empty((0, kv_cache.shape[2]), dtype=kv_cache.dtype)
    table = np.asarray(block_table, dtype=np.int64)
    # numpy would wrap a negative index silently; the kernel would read foreign memory: both are wrong
    if seq.min() < 0 or seq.max() >= min(len(cu), len(starts), len(table)):
        raise ConfigError("token_to_seq", f"request indices in [0, {min(len(cu), len(starts), len(table))})",
                          (int(seq.min()), int(seq.max())))
    pos = starts[seq] + np.arange(seq.size) - cu[seq]
    if pos.min() < 0 or pos.max() // block_size >= table.shape[1]:
        raise ConfigError("cu_seq_lens/seq_starts", f"positions in [0, {table.shape[1] * block_size})",
                          (int(pos.min()), int(pos.max())))
    blocks = table[seq, pos // block_size]
    if blocks.min() < 0 or blocks.max() >= kv_cache.shape[0]:
        raise ConfigError("block_table", f"block ids in [0, {kv_cache.shape[0]})", (int(blocks.min()), int(blocks.max())))
    return kv_cache[blocks, pos % block_size]


def attention_with_lse(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, *,
                       causal: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale * q k^T) v for one request, with its LSE.

    `q [Tq, H, Dqk]`, `k [Tk, H, Dqk]`, `v [Tk, H, Dv]`. Causal masking is bottom-right
    aligned: query `i` sits at key position `Tk - Tq + i`. A query with no visible key gets
    output 0 and LSE `-inf` (the mathematical empty state, not a backend's scratch).
    """
    tq, heads = q.shape[0], q.shape[1]
    tk, dv = k.shape[0], v.shape[2]
    if tk == 0:
        return np.zeros((tq, heads, dv)), np.full((heads, tq), -np.inf)
    logits = np.einsum("thd,shd->hts", q, k) * scale
    if causal:
        visible = np.arange(tk)[None, :] <= (tk - tq + np.arange(tq))[:, None]
        logits = np.where(visible[None], logits, -np.inf)
    peak = logits.max(axis=-1)
    safe = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.exp(logits - safe[..., None])
    total = weights.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.log(total) + safe
    probs = weights / np.where(total > 0, total, 1.0)[..., None]
    return np.einsum("hts,shd->thd", probs, v), lse


def merge_attn_states(prefix_output: np.ndarray, prefix_lse: np.ndarray, suffix_output: np.ndarray,
                      suffix_lse: np.ndarray, *, prefill_tokens_with_context: int | None = None,
                      output_scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Merge two partial states: `M = max(lp, ls)`, `out = (op e^{lp-M} + os e^{ls-M}) / (e^{lp-M} + e^{ls-M})`.

    Like the kernels, the output is `op * wp + os * ws`: a NaN output with weight 0 still
    poisons the result (which is why empty spans must be masked, not only their LSE). `M` is
    `fmax`, as in the kernels: a NaN LSE beside an empty state (-inf, or FA2's +inf) is dropped
    and the pair is empty; beside a finite LSE it gives NaN.

    `prefill_tokens_with_context`: tokens from this index on have no prefix and take the suffix
    state as it is (its LSE unconverted); None: every token merges. `output_scale`: the FP8
    output (`fp8_e4m3`) of `out / output_scale`, the LSE unscaled.
    """
    if prefix_output.shape != suffix_output.shape or prefix_lse.shape != suffix_lse.shape:
        raise ConfigError("merge_attn_states shapes", "equal prefix and suffix shapes",
                          (prefix_output.shape, suffix_output.shape, prefix_lse.shape, suffix_lse.shape))
    lp = np.where(np.isposinf(prefix_lse), -np.inf, prefix_lse)  # FA2 reports +inf for an empty row
    ls = np.where(np.isposinf(suffix_lse), -np.inf, suffix_lse)
    # fmax, as the kernels' max: a NaN LSE beside an empty side is dropped, the pair merges to (0, -inf)
    # (vLLM's Triton merge_attn_states does this; found by `kvsim conform vllm`)
    peak = np.fmax(lp, ls)
    safe = np.where(np.isneginf(peak), 0.0, peak)  # -inf - -inf would be NaN
    with np.errstate(invalid="ignore"):
        wp, ws = np.exp(lp - safe), np.exp(ls - safe)
    total = wp + ws
    empty = np.isneginf(peak)  # without NaNs the same as total == 0
    denom = np.where(empty, 1.0, total)
    scale_p = (wp / denom).T[..., None]  # [H, T] -> [T, H, 1]
    scale_s = (ws / denom).T[..., None]
    with np.errstate(invalid="ignore"):
        out = prefix_output * scale_p + suffix_output * scale_s
    out = np.where(empty.T[..., None], 0.0, out)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, safe + np.log(denom))
    if prefill_tokens_with_context is not None:
        cut = max(prefill_tokens_with_context, 0)  # tokens past it take the suffix as is
        out[cut:], lse[:, cut:] = suffix_output[cut:], suffix_lse[:, cut:]
    if output_scale is not None:
        out = fp8_e4m3(out * (1.0 / output_scale))
    return out, lse


FP8_E4M3_MAX = 448.0


def fp8_e4m3(x: np.ndarray) -> np.ndarray:
    """`x` saturated to +-448 and rounded to nearest even on the float8 e4m3fn grid (3 mantissa bits, normals
    from 2**-6, subnormals in steps of 2**-9), as a kernel's `clamp` then `.to(float8_e4m3fn)` gives; NaN stays NaN."""
    with np.errstate(invalid="ignore"):
        clamped = np.clip(np.asarray(x, dtype=np.float64), -FP8_E4M3_MAX, FP8_E4M3_MAX)
    _, exponent = np.frexp(np.abs(clamped))  # |x| = m * 2**exponent, m in [0.5, 1)
    step = np.ldexp(1.0, np.maximum(exponent - 1, -6) - 3)
    return np.round(clamped / step) * step


def mask_empty_context(lse: np.ndarray, out: np.ndarray, query_start_loc: Sequence[int],
                       cu_seq_lens: Sequence[int]) -> None:
    """In place: tokens of every request whose span in this chunk is empty get LSE `-inf` and output 0 (#49294)."""
    for r in range(len(query_start_loc) - 1):
        if cu_seq_lens[r] == cu_seq_lens[r + 1]:
            lse[:, query_start_loc[r]:query_start_loc[r + 1]] = -np.inf
            out[query_start_loc[r]:query_start_loc[r + 1]] = 0.0


def init_mla_context_partial(chunk_output: np.ndarray, num_tokens: int,
                             empty_token_slices: Sequence[slice]) -> tuple[np.ndarray, np.ndarray]:
    """The context accumulator `(output [T, H, D], lse [H, T])`, neutral (0, -inf) on the empty slices.

    Every other row is left uninitialised, as `torch.empty` would: NaN here, so a token the
    accumulation never writes shows up.
    """
    heads, dim = chunk_output.shape[1], chunk_output.shape[2]
    output = np.full((num_tokens, heads, dim), np.nan)
    lse = np.full((heads, num_tokens), np.nan)
    for s in empty_token_slices:
        output[s] = 0.0
        lse[:, s] = -np.inf
    return output, lse


def run_prefill_context_chunk(q: np.ndarray, k: np.ndarray, v: np.ndarray, query_start_loc: Sequence[int],
                              cu_seq_lens: Sequence[int], scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A prefill backend's non-causal varlen attention of each request's queries to its span.

    The model of the backend's contract: for a request whose span is empty the result is
    whatever was in the scratch buffer (`EMPTY_SPAN_OUTPUT`, finite `EMPTY_SPAN_LSE`).
    """
    tokens, heads, dv = q.shape[0], q.shape[1], v.shape[2]
    out = np.empty((tokens, heads, dv))
    lse = np.empty((heads, tokens))
    for r in range(len(query_start_loc) - 1):
        qs, qe = query_start_loc[r], query_start_loc[r + 1]
        ks, ke = cu_seq_lens[r], cu_seq_lens[r + 1]
        if ks == ke:
            out[qs:qe], lse[:, qs:qe] = EMPTY_SPAN_OUTPUT, EMPTY_SPAN_LSE
        else:
            out[qs:qe], lse[:, qs:qe] = attention_with_lse(q[qs:qe], k[ks:ke], v[ks:ke], scale)
    return out, lse
