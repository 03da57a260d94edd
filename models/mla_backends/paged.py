"""Absorbed MLA over a paged KV cache, addressed through either metadata form (research note 2.3, 2.5).

The cache holds pages of `page_size` rows: `ckv [pages, page_size, 512]` (the latent `c`) and
`kpe [pages, page_size, 64]`. Request `b`'s key `j` is row `j % page_size` of its page `j // page_size`,
the page named by `kv_indices[kv_indptr[b] + j // page_size]` (CSR) or `block_tables[b][j // page_size]`
(dense). The query of head `h` is `[q_nope_h (512, already absorbed), q_pe_h (64)]`, the shared key
`[c, k_pe]` (576), the shared value `c` (512): output `[T_q, H, 512]`, LSE base 2 `[T_q, H]`.
`paged_mla_attention` attends each request chunk by chunk (`chunk_pages` pages at a time), each
chunk a base-2 state, merged with `merge.merge_state`: what a split-KV backend computes.
"""

from __future__ import annotations

import numpy as np

from .merge import attention_state, empty_state, merge_state
from .metadata import CsrMetadata, DenseMetadata, pages_for
from .variants import FIXED, MlaBackendsVariant


def request_pages(metadata: CsrMetadata | DenseMetadata, b: int, page_size: int) -> tuple[int, ...]:
    """The pages that hold request `b`'s keys, in key order."""
    if isinstance(metadata, CsrMetadata):
        return metadata.kv_indices[metadata.kv_indptr[b]:metadata.kv_indptr[b + 1]]
    return metadata.block_tables[b][:pages_for(metadata.seq_lens[b], page_size)]


def gather_keys(ckv: np.ndarray, kpe: np.ndarray, pages: tuple[int, ...], kv_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Request rows `[kv_len, 512]` and `[kv_len, 64]` read page by page."""
    page_size = ckv.shape[1]
    rows = [(p, r) for p in pages for r in range(page_size)][:kv_len]
    if not rows:
        return np.zeros((0, ckv.shape[2]), ckv.dtype), np.zeros((0, kpe.shape[2]), kpe.dtype)
    index = np.array(rows)
    return ckv[index[:, 0], index[:, 1]], kpe[index[:, 0], index[:, 1]]


def paged_mla_attention(q_nope: np.ndarray, q_pe: np.ndarray, ckv: np.ndarray, kpe: np.ndarray,
                        metadata: CsrMetadata | DenseMetadata, scale: float, *, causal: bool = False,
                        chunk_pages: int = 1, logit_cap: float = 0.0,
                        variant: MlaBackendsVariant = FIXED) -> tuple[np.ndarray, np.ndarray]:
    """`(out [T_q, H, 512], lse2 [T_q, H])` of every request, from either metadata form (`logit_cap`: see
    `merge.attention_state`)."""
    page_size = ckv.shape[1]
    qo = metadata.qo_indptr if isinstance(metadata, CsrMetadata) else metadata.cum_seq_lens_q
    lens = metadata.kv_len_arr if isinstance(metadata, CsrMetadata) else metadata.seq_lens
    heads, dv = q_nope.shape[1], ckv.shape[2]
    out, lse = empty_state(qo[-1], heads, dv)
    for b, kv_len in enumerate(lens):
        c, k_pe = gather_keys(ckv, kpe, request_pages(metadata, b, page_size), kv_len)
        q = np.concatenate([q_nope[qo[b]:qo[b + 1]], q_pe[qo[b]:qo[b + 1]]], axis=-1)
        keys = np.concatenate([c, k_pe], axis=-1)
        state = empty_state(qo[b + 1] - qo[b], heads, dv)
        step = chunk_pages * page_size
        for start in range(0, kv_len, step):
            end = min(kv_len, start + step)
            part = attention_state(q, keys[start:end], c[start:end], scale, causal=causal, key_offset=start,
                                   kv_len=kv_len, logit_cap=logit_cap, variant=variant)
            state = merge_state(*state, *part, variant)
        out[qo[b]:qo[b + 1]], lse[qo[b]:qo[b + 1]] = state
    return out, lse
