"""End-to-end MLA prefill with chunked context, and the full-attention reference it must equal.

Follows vLLM commit b38e111d (PR #50613): `_compute_prefill_context`,
`_context_parallel_compute_prefill_context` and `forward_mha` of the MLA attention module,
and for the pre-fix variants the uniform loop with `mask_empty_context` and the
`prefill_tokens_with_context` cut-off. Research note `vllm.md` 1.1-1.3 and
`trtllm_flashinfer.md` 2.5 (non-absorbed "MHA" prefill maths).

Data: each request has `context_len + query_len` latent rows `[kv_c (kv_lora_rank) | k_pe
(rope)]`; the context rows live in a paged cache (one per DCP rank). Keys and values are
up-projected per head (`kv_b_proj` as `W_UK`, `W_UV`), `k_pe` is shared by the heads, and
the softmax scale is `1/sqrt(qk_nope + rope)`. Everything is float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kvsim.engine.errors import check_int

from .attention import (attention_with_lse, gather_context_rows, init_mla_context_partial, mask_empty_context,
                            merge_attn_states, run_prefill_context_chunk)
from .planner import FIXED, MlaVariant, check_counts
from .dcp import DcpConfig, cdiv, dcp_local_positions, reorg_kvcache, reorg_kvcache_by_chunk_index
from .metadata import (ContextChunk, ContextMetadata, UniformChunkedContextMetadata, UniformContextChunk,
                           build_context_metadata, mla_accumulation_schedule, query_start_loc_of)


@dataclass(frozen=True)
class MlaShape:
    """MLA dimensions; DeepSeek's are kv_lora 512, rope 64, qk_nope 128, v 128."""

    num_heads: int = 2
    kv_lora_rank: int = 8
    qk_rope_head_dim: int = 4
    qk_nope_head_dim: int = 4
    v_head_dim: int = 4

    def __post_init__(self) -> None:
        for name in ("num_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            check_int(getattr(self, name), name, minimum=1)

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)

    @property
    def latent_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, eq=False)
class MlaPrefillInputs:
    """One prefill batch: queries `[T, H, nope+rope]`, per-request latent rows, up-projections."""

    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    shape: MlaShape
    q: np.ndarray
    latent: tuple[np.ndarray, ...]  # per request [context_len + query_len, kv_lora + rope]
    w_uk: np.ndarray  # [kv_lora, H, qk_nope]
    w_uv: np.ndarray  # [kv_lora, H, v]

    @property
    def query_start_loc(self) -> tuple[int, ...]:
        return query_start_loc_of(self.query_lens)


def make_mla_prefill_inputs(context_lens: Sequence[int], query_lens: Sequence[int], shape: MlaShape = MlaShape(),
                            seed: int = 0) -> MlaPrefillInputs:
    """Random float64 inputs from `numpy.random.default_rng(seed)` (weights scaled to keep logits O(1))."""
    ctx = check_counts(context_lens, "context_lens")
    qsl = query_start_loc_of(query_lens)
    rng = np.random.default_rng(seed)
    h, lora, rope = shape.num_heads, shape.kv_lora_rank, shape.qk_rope_head_dim
    q = rng.standard_normal((qsl[-1], h, shape.qk_nope_head_dim + rope))
    latent = tuple(rng.standard_normal((c + n, lora + rope)) for c, n in zip(ctx, query_lens))
    w_uk = rng.standard_normal((lora, h, shape.qk_nope_head_dim)) / math.sqrt(lora)
    w_uv = rng.standard_normal((lora, h, shape.v_head_dim)) / math.sqrt(lora)
    return MlaPrefillInputs(ctx, tuple(query_lens), shape, q, latent, w_uk, w_uv)


def _latent_times(kv_c: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """`kv_c [N, kv_lora] x weight [kv_lora, H, d] -> [N, H, d]`: the one BLAS product `np.tensordot(kv_c, weight,
    axes=1)` makes (the same operands, so the same bits), without its per-call axis bookkeeping."""
    return np.dot(kv_c, weight.reshape(weight.shape[0], -1)).reshape(kv_c.shape[0], *weight.shape[1:])


def up_project(rows: np.ndarray, inputs: MlaPrefillInputs) -> tuple[np.ndarray, np.ndarray]:
    """Latent rows `[N, kv_lora + rope]` -> keys `[N, H, nope + rope]`, values `[N, H, v]`."""
    lora = inputs.shape.kv_lora_rank
    kv_c, k_pe = rows[:, :lora], rows[:, lora:]
    k_nope = _latent_times(kv_c, inputs.w_uk)  # [N, H, nope]
    v = _latent_times(kv_c, inputs.w_uv)
    k_pe = np.broadcast_to(k_pe[:, None, :], (rows.shape[0], inputs.shape.num_heads, k_pe.shape[1]))
    return np.concatenate([k_nope, k_pe], axis=-1), v


# -- paged caches --------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class PagedLatentCache:
    """`kv_cache [num_blocks, block_size, width]` and a block table with one row per request.

    Block 0 is a NaN poison block: unused table entries point at it, and unused slots of
    allocated blocks are NaN too, so a gather that reads a row it should not shows up.
    """

    kv_cache: np.ndarray
    block_table: np.ndarray


def build_paged_latent_cache(rows: Sequence[np.ndarray], capacities: Sequence[int], block_size: int, width: int,
                             rng: np.random.Generator) -> PagedLatentCache:
    check_int(block_size, "block_size", minimum=1)
    blocks_per_req = [cdiv(c, block_size) for c in capacities]
    total = sum(blocks_per_req)
    order = rng.permutation(total) + 1  # physical blocks in random order, as after real allocation churn
    kv_cache = np.full((total + 1, block_size, width), np.nan)
    table = np.zeros((len(rows), max(blocks_per_req, default=0) or 1), dtype=np.int64)
    cursor = 0
    for r, (data, nblocks) in enumerate(zip(rows, blocks_per_req)):
        table[r, :nblocks] = order[cursor:cursor + nblocks]
        cursor += nblocks
        for pos in range(0, data.shape[0], block_size):
            piece = data[pos:pos + block_size]
            kv_cache[table[r, pos // block_size], :piece.shape[0]] = piece
    return PagedLatentCache(kv_cache, table)


def build_context_caches(inputs: MlaPrefillInputs, block_size: int, dcp: DcpConfig | None = None,
                         seed: int = 0) -> tuple[PagedLatentCache, ...]:
    """The context rows in paged caches: one cache, or one per DCP rank holding its local rows."""
    rng = np.random.default_rng(seed)
    width = inputs.shape.latent_width
    ctx = inputs.context_lens
    if dcp is None:
        return (build_paged_latent_cache([lat[:c] for lat, c in zip(inputs.latent, ctx)], ctx, block_size, width, rng),)
    caches = []
    for rank in range(dcp.world_size):
        local_rows = [lat[dcp_local_positions(c, rank, dcp)] for lat, c in zip(inputs.latent, ctx)]
        caches.append(build_paged_latent_cache(local_rows, [dcp.padded_rows(c) for c in ctx], block_size, width, rng))
    return tuple(caches)


def gather_chunk_rows(chunk: ContextChunk | UniformContextChunk, caches: Sequence[PagedLatentCache],
                      dcp: DcpConfig | None, local_chunk_size: int | None = None,
                      variant: MlaVariant = FIXED) -> np.ndarray:
    """The chunk's workspace rows `[num_context_tokens, width]`, in `cu_seq_lens` order per request.

    Under DCP every rank gathers its padded local rows, the buffers are all-gathered
    (rank `r` at `r * toks`) and `reorg_kvcache` removes the padding.
    """
    rs = chunk.request_slice
    if dcp is None:
        cache = caches[0]
        return gather_context_rows(cache.kv_cache, cache.block_table[rs], chunk.cu_seq_lens, chunk.token_to_seq,
                                   chunk.starts)
    local = [gather_context_rows(c.kv_cache, c.block_table[rs], chunk.padded_local_cu_seq_lens,
                                 chunk.padded_local_token_to_seq, chunk.local_starts) for c in caches]
    return reorg_chunk_rows(chunk, np.concatenate(local, axis=0), local_chunk_size, variant=variant)


def reorg_chunk_rows(chunk: ContextChunk | UniformContextChunk, allgathered: np.ndarray,
                     local_chunk_size: int | None = None, *, strict: bool = True,
                     variant: MlaVariant = FIXED) -> np.ndarray:
    """`reorg_kvcache` of one chunk's all-gathered rows, in the variant's form.

    Per-request plan: each request's own `local_starts`. Uniform plan: `chunk_idx * P`
    (`local_chunk_size`), the pre-b38e111d call.
    """
    toks = chunk.num_local_context_tokens
    if variant.per_request_plan:
        rows, _ = reorg_kvcache(allgathered, None, chunk.padded_local_seq_lens, chunk.local_context_lens_allranks,
                                chunk.local_starts, chunk.cu_seq_lens[-1], chunk.max_seq_len, toks, strict=strict)
    else:
        rows, _ = reorg_kvcache_by_chunk_index(allgathered, None, chunk.padded_local_seq_lens,
                                               chunk.local_context_lens_allranks, chunk.cu_seq_lens[-1],
                                               chunk.max_seq_len, local_chunk_size, chunk.index, toks, strict=strict)
    return rows


# -- the prefill path ----------------------------------------------------------------------

def compute_prefill_context(inputs: MlaPrefillInputs, metadata: ContextMetadata, caches: Sequence[PagedLatentCache],
                            variant: MlaVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """The context partial `(output [T, H, v], lse [H, T])`: every chunk gathered, attended and accumulated."""
    uniform = isinstance(metadata, UniformChunkedContextMetadata)
    local_chunk = metadata.local_chunk_size if uniform else None
    scale = inputs.shape.softmax_scale
    ops = mla_accumulation_schedule(metadata)
    partials = []
    for chunk in metadata.chunks:
        k, v = up_project(gather_chunk_rows(chunk, caches, metadata.dcp, local_chunk, variant), inputs)
        ts = chunk.token_slice
        out, lse = run_prefill_context_chunk(inputs.q[ts], k, v, chunk.query_start_loc, chunk.cu_seq_lens, scale)
        if uniform and variant.mask_empty_context and chunk.has_empty_context:
            mask_empty_context(lse, out, chunk.query_start_loc, chunk.cu_seq_lens)
        partials.append((ts.start, out, lse))
    if not uniform and len(metadata.chunks) == 1 and not metadata.empty_token_slices:
        return partials[0][1], partials[0][2]  # the fast path: the only chunk covers every token
    # The uniform loop has no init step: its first column is copied over every token, so an
    # uninitialised accumulator with no empty slices is the same thing.
    empty = () if uniform else metadata.empty_token_slices
    acc_out, acc_lse = init_mla_context_partial(partials[0][1], metadata.num_tokens, empty)
    for op in ops:
        if op.kind == "init_empty":
            continue  # done by init_mla_context_partial
        base, out, lse = partials[op.chunk]
        a, b = op.token_start, op.token_end
        if op.kind == "copy":
            acc_out[a:b], acc_lse[:, a:b] = out[a - base:b - base], lse[:, a - base:b - base]
        else:
            acc_out[a:b], acc_lse[:, a:b] = merge_attn_states(acc_out[a:b], acc_lse[:, a:b], out[a - base:b - base],
                                                              lse[:, a - base:b - base])
    return acc_out, acc_lse


def suffix_attention(inputs: MlaPrefillInputs) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention of each request's new tokens to themselves."""
    qsl = inputs.query_start_loc
    outs, lses = [], []
    for r, (c, lat) in enumerate(zip(inputs.context_lens, inputs.latent)):
        k, v = up_project(lat[c:], inputs)
        out, lse = attention_with_lse(inputs.q[qsl[r]:qsl[r + 1]], k, v, inputs.shape.softmax_scale, causal=True)
        outs.append(out)
        lses.append(lse)
    return np.concatenate(outs, axis=0), np.concatenate(lses, axis=1)


@dataclass(frozen=True, eq=False)
class MlaPrefillResult:
    """The prefill output and LSE, the context partial before the suffix merge, and the metadata used."""

    metadata: ContextMetadata | None
    output: np.ndarray  # [T, H, v]
    lse: np.ndarray  # [H, T]
    context_output: np.ndarray | None
    context_lse: np.ndarray | None


def chunked_prefill_attention(inputs: MlaPrefillInputs, *, workspace_size: int, max_num_seqs: int, block_size: int,
                              dcp: DcpConfig | None = None, align_chunk_to_block: bool = True, cache_seed: int = 0,
                              variant: MlaVariant = FIXED) -> MlaPrefillResult:
    """`forward_mha` for the prefill tokens: context chunks, suffix, and their merge."""
    metadata = build_context_metadata(inputs.context_lens, inputs.query_lens, workspace_size, max_num_seqs,
                                      block_size, dcp=dcp, align_chunk_to_block=align_chunk_to_block, variant=variant)
    suffix_out, suffix_lse = suffix_attention(inputs)
    if metadata is None:
        return MlaPrefillResult(None, suffix_out, suffix_lse, None, None)
    caches = build_context_caches(inputs, block_size, dcp, cache_seed)
    ctx_out, ctx_lse = compute_prefill_context(inputs, metadata, caches, variant)
    cutoff = variant.tokens_with_context_cutoff and isinstance(metadata, UniformChunkedContextMetadata)
    out, lse = merge_attn_states(ctx_out, ctx_lse, suffix_out, suffix_lse,
                                 prefill_tokens_with_context=metadata.prefill_tokens_with_context if cutoff else None)
    return MlaPrefillResult(metadata, out, lse, ctx_out, ctx_lse)


# -- references ----------------------------------------------------------------------------

def context_attention_reference(inputs: MlaPrefillInputs) -> tuple[np.ndarray, np.ndarray]:
    """Each request's new tokens attending non-causally to its whole context, unchunked; (0, -inf) if none."""
    qsl = inputs.query_start_loc
    outs, lses = [], []
    for r, (c, lat) in enumerate(zip(inputs.context_lens, inputs.latent)):
        k, v = up_project(lat[:c], inputs)
        out, lse = attention_with_lse(inputs.q[qsl[r]:qsl[r + 1]], k, v, inputs.shape.softmax_scale)
        outs.append(out)
        lses.append(lse)
    return np.concatenate(outs, axis=0), np.concatenate(lses, axis=1)


def full_attention_reference(inputs: MlaPrefillInputs) -> tuple[np.ndarray, np.ndarray]:
    """Attention over `context + new tokens` in one softmax: all context visible, new tokens causal.

    Bottom-right causal masking over the concatenated keys is exactly that mask: query `i`
    of a request sees keys `< context_len + i + 1`.
    """
    qsl = inputs.query_start_loc
    outs, lses = [], []
    for r, lat in enumerate(inputs.latent):
        k, v = up_project(lat, inputs)
        out, lse = attention_with_lse(inputs.q[qsl[r]:qsl[r + 1]], k, v, inputs.shape.softmax_scale, causal=True)
        outs.append(out)
        lses.append(lse)
    return np.concatenate(outs, axis=0), np.concatenate(lses, axis=1)
