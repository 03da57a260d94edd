"""The base-2 merge algebra (research note 2.5) and chunked attention against full attention.

`merge_state` is commutative (exactly, in float32), associative (to float32 rounding), has the
identity `(0, -inf)`, weights that sum to 1 and a merged LSE no smaller than either side's; merging
any split of the keys, in any order, gives the full attention state (chunk-size invariance); and two
empty states merge to the empty state, not NaN (#4051), which a causal row that sees no key must
be (#4452).
"""

from __future__ import annotations

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.mla_backends.merge import (attention_state, chunked_attention_state, empty_state, merge_state,
                                            merge_weights)
from kvsim.models.mla_backends.variants import MlaBackendsVariant

from .cases import (EMPTY_PAIR, MASKED_ROWS, MERGE_SOMETIMES, PAGED_DECODE, PAGED_PREFILL, ChunkCase, MergeCase,
                    PagedCase)

MODEL = "mla-backends"
RTOL, ATOL = 1e-5, 1e-5  # float32 with a different summation order
LSE_ATOL = 1e-4


def states_close(what: str, got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray],
                 rtol: float = RTOL, atol: float = ATOL) -> None:
    """Outputs and LSEs agree; -inf LSEs exactly; nothing is NaN."""
    (v, s), (wv, ws) = got, want
    if np.isnan(v).any() or np.isnan(s).any():
        t = np.argwhere(np.isnan(s) | np.isnan(v).any(axis=-1))[0].tolist()
        raise PropertyViolation(f"{what} at (token, head) {t}: expected ({wv[tuple(t)][:2].tolist()}..., "
                                f"{float(ws[tuple(t)])}), got ({v[tuple(t)][:2].tolist()}..., {float(s[tuple(t)])})")
    bad_s = ~((s == ws) | np.isclose(s, ws, rtol=rtol, atol=LSE_ATOL))
    bad_v = ~np.isclose(v, wv, rtol=rtol, atol=atol).all(axis=-1)
    bad = bad_s | bad_v
    if bad.any():
        t = tuple(np.argwhere(bad)[0].tolist())
        raise PropertyViolation(f"{what} at (token, head) {list(t)}: expected ({np.round(wv[t][:3], 6).tolist()}..., "
                                f"lse {float(ws[t])}), got ({np.round(v[t][:3], 6).tolist()}..., lse {float(s[t])})")


@kv_property(model=MODEL, strategy="MERGE_CASES", examples=[EMPTY_PAIR], sometimes=MERGE_SOMETIMES)
def merge_is_commutative(case: MergeCase, variant: MlaBackendsVariant) -> None:
    """`a ⊕ b` equals `b ⊕ a` bit for bit (empty rows included)."""
    a, b, _ = case.states()
    ab, ba = merge_state(*a, *b, variant), merge_state(*b, *a, variant)
    same = [np.array_equal(x, y, equal_nan=True) for x, y in zip(ab, ba)]
    if not all(same):
        raise PropertyViolation(f"a ⊕ b vs b ⊕ a: expected equal, got lse {ab[1].tolist()} vs {ba[1].tolist()}")
    states_close("a ⊕ b", ab, ab)  # and no NaN


@kv_property(model=MODEL, strategy="MERGE_CASES", examples=[EMPTY_PAIR], sometimes=MERGE_SOMETIMES)
def merge_is_associative(case: MergeCase, variant: MlaBackendsVariant) -> None:
    """`(a ⊕ b) ⊕ c` equals `a ⊕ (b ⊕ c)` to float32 rounding."""
    a, b, c = case.states()
    left = merge_state(*merge_state(*a, *b, variant), *c, variant)
    right = merge_state(*a, *merge_state(*b, *c, variant), variant)
    states_close("(a ⊕ b) ⊕ c vs a ⊕ (b ⊕ c)", left, right)


@kv_property(model=MODEL, strategy="MERGE_CASES", examples=[EMPTY_PAIR], sometimes=MERGE_SOMETIMES)
def merge_identity_is_empty_state(case: MergeCase, variant: MlaBackendsVariant) -> None:
    """`a ⊕ (0, -inf)` and `(0, -inf) ⊕ a` equal `a` exactly."""
    a, _, _ = case.states()
    e = empty_state(case.tokens, case.heads, case.dim)
    for what, got in (("a ⊕ (0, -inf)", merge_state(*a, *e, variant)),
                      ("(0, -inf) ⊕ a", merge_state(*e, *a, variant))):
        states_close(what, got, a, rtol=0, atol=0)


@kv_property(model=MODEL, strategy="FINITE_MERGE_CASES")
def merge_weights_sum_to_one(case: MergeCase, variant: MlaBackendsVariant) -> None:
    """The parts' weights `2^(s_c - s)` in the merged state sum to 1, and the output is their weighted sum."""
    a, b, _ = case.states()
    v, s = merge_state(*a, *b, variant)
    w_a, w_b = merge_weights([a[1], b[1]], s)
    total = w_a + w_b
    if not np.allclose(total, 1.0, rtol=0, atol=1e-5):
        raise PropertyViolation(f"sum of merge weights: expected 1, got {total.ravel().tolist()}")
    want = a[0] * w_a[..., None] + b[0] * w_b[..., None]
    if not np.allclose(v, want, rtol=RTOL, atol=ATOL):
        raise PropertyViolation(f"merged output: expected the weighted sum {want.ravel()[:3].tolist()}..., got "
                                f"{v.ravel()[:3].tolist()}...")


@kv_property(model=MODEL, strategy="MERGE_CASES", examples=[EMPTY_PAIR], sometimes=MERGE_SOMETIMES)
def merged_lse_at_least_max(case: MergeCase, variant: MlaBackendsVariant) -> None:
    """The merged LSE is >= the larger of the two parts' (and never NaN)."""
    a, b, _ = case.states()
    _, s = merge_state(*a, *b, variant)
    peak = np.maximum(a[1], b[1])
    bad = np.isnan(s) | (s < peak)
    if bad.any():
        t = tuple(np.argwhere(bad)[0].tolist())
        raise PropertyViolation(f"merged lse at {list(t)}: expected >= max({float(a[1][t])}, {float(b[1][t])}), "
                                f"got {float(s[t])}")


@kv_property(model=MODEL, strategy="MERGE_CASES", examples=[EMPTY_PAIR], sometimes=MERGE_SOMETIMES)
def empty_states_merge_to_empty(case: MergeCase, variant: MlaBackendsVariant) -> None:
    """`(0, -inf) ⊕ (0, -inf)` is `(0, -inf)`: output exactly 0, LSE -inf, no NaN (#4051)."""
    a, b, _ = case.states()
    e = empty_state(case.tokens, case.heads, case.dim)
    v, s = merge_state(*e, *e, variant)
    if not (np.array_equal(v, e[0]) and np.array_equal(s, e[1])):
        raise PropertyViolation(f"(0, -inf) ⊕ (0, -inf): expected (0, -inf), got ({v.ravel()[0]}, {s.ravel()[0]})")
    both = np.isneginf(a[1]) & np.isneginf(b[1])
    v, s = merge_state(*a, *b, variant)
    if both.any() and not (np.all(np.isneginf(s[both])) and np.all(v[both] == 0)):
        t = tuple(np.argwhere(both & ~(np.isneginf(s)))[0].tolist()) if (~np.isneginf(s[both])).any() else \
            tuple(np.argwhere(both)[0].tolist())
        raise PropertyViolation(f"rows empty on both sides at {list(t)}: expected (0, -inf), got "
                                f"({v[t].tolist()}, {float(s[t])})")


@kv_property(model=MODEL, strategy="CHUNK_CASES", examples=[MASKED_ROWS])
def chunked_attention_matches_full(case: ChunkCase, variant: MlaBackendsVariant) -> None:
    """Attention over any split of the keys, merged in any order, equals full attention; two splits agree."""
    q, k, v, scale = case.tensors()
    full = attention_state(q, k, v, scale, causal=case.causal, variant=variant)
    one = chunked_attention_state(q, k, v, scale, case.bounds, causal=case.causal, order=case.order, variant=variant)
    two = chunked_attention_state(q, k, v, scale, case.other_bounds, causal=case.causal, variant=variant)
    states_close(f"chunks {list(case.bounds)} merged in order {list(case.order)} vs full attention", one, full,
                 rtol=1e-4)
    states_close(f"chunks {list(case.other_bounds)} vs chunks {list(case.bounds)}", two, one, rtol=1e-4)


@kv_property(model=MODEL, strategy="CHUNK_CASES", examples=[MASKED_ROWS])
def masked_causal_rows_are_empty(case: ChunkCase, variant: MlaBackendsVariant) -> None:
    """A causal query row that sees no key (`q_len > kv_len`) is the empty state: output 0, LSE -inf (#4452)."""
    if not case.causal or case.q_len <= case.kv_len:
        return
    q, k, v, scale = case.tensors()
    out, lse = attention_state(q, k, v, scale, causal=True, variant=variant)
    blind = case.q_len - case.kv_len  # rows 0 .. blind-1 sit before the first key
    rows_out, rows_lse = out[:blind], lse[:blind]
    if not (np.all(rows_out == 0) and np.all(np.isneginf(rows_lse))):
        raise PropertyViolation(f"query rows 0..{blind - 1} of q_len {case.q_len} > kv_len {case.kv_len}: expected "
                                f"output 0 and lse -inf, got output {np.round(rows_out[0, 0, :2], 4).tolist()}... "
                                f"lse {float(rows_lse[0, 0])}")


def sdpa_reference(case: PagedCase) -> tuple[np.ndarray, np.ndarray]:
    """torch SDPA in float64 on the absorbed form (576 / 512), one request at a time, keys gathered in order;
    with its natural-log LSE converted to base 2. A row that sees no key is (0, -inf)."""
    import torch

    from kvsim.models.mla_backends.paged import gather_keys, request_pages

    q_nope, q_pe, ckv, kpe, scale = case.tensors()
    csr = case.metadata().csr()
    out = np.zeros((sum(case.q_lens), case.heads, 512))
    lse = np.full((sum(case.q_lens), case.heads), -np.inf)
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens)):
        lo = csr.qo_indptr[b]
        c, k_pe = gather_keys(ckv, kpe, request_pages(csr, b, case.page_size), kv_len)
        if kv_len == 0 or q_len == 0:
            continue
        q = torch.from_numpy(np.concatenate([q_nope[lo:lo + q_len], q_pe[lo:lo + q_len]], -1)).double()
        k = torch.from_numpy(np.concatenate([c, k_pe], -1)).double()
        v = torch.from_numpy(c).double()
        mask = torch.ones(q_len, kv_len, dtype=torch.bool)
        if case.causal:  # bottom-right aligned
            mask = torch.arange(kv_len)[None, :] <= (kv_len - q_len + torch.arange(q_len))[:, None]
        seen = mask.any(-1).numpy()
        qh = q.transpose(0, 1)  # [H, T, 576]
        o = torch.nn.functional.scaled_dot_product_attention(qh, k[None].expand(case.heads, -1, -1),
                                                             v[None].expand(case.heads, -1, -1),
                                                             attn_mask=mask[None], scale=scale)
        logits = torch.einsum("htd,sd->hts", qh, k) * scale
        row_lse = torch.logsumexp(logits.masked_fill(~mask[None], float("-inf")), -1) / np.log(2.0)
        out[lo:lo + q_len][seen] = o.transpose(0, 1).numpy()[seen]
        lse[lo:lo + q_len][seen] = row_lse.T.numpy()[seen]
    return out, lse


@kv_property(model=MODEL, strategy="PAGED_CASES", examples=[PAGED_DECODE, PAGED_PREFILL])
def paged_mla_matches_sdpa(case: PagedCase, variant: MlaBackendsVariant) -> None:
    """Absorbed MLA (576 / 512) over a paged cache in random page order, chunked by pages and merged in base 2,
    gives the same result from the CSR and the (aligned) dense form, equal to float64 torch SDPA within
    float32 rounding; kv_len 0 and rows that see no key are (0, -inf)."""
    from kvsim.models.mla_backends.metadata import dense_from_csr
    from kvsim.models.mla_backends.paged import paged_mla_attention

    q_nope, q_pe, ckv, kpe, scale = case.tensors()
    csr = case.metadata().csr()
    kw = dict(causal=case.causal, chunk_pages=case.chunk_pages, variant=variant)
    by_csr = paged_mla_attention(q_nope, q_pe, ckv, kpe, csr, scale, **kw)  # type: ignore[arg-type]
    by_dense = paged_mla_attention(q_nope, q_pe, ckv, kpe, dense_from_csr(csr, case.alignment), scale,
                                   **kw)  # type: ignore[arg-type]
    if not all(np.array_equal(x, y, equal_nan=True) for x, y in zip(by_csr, by_dense)):
        raise PropertyViolation(f"paged MLA through the dense form (alignment {case.alignment}): expected the CSR "
                                f"form's result bit for bit, got a different one")
    states_close(f"paged MLA (page {case.page_size}, chunk {case.chunk_pages} pages) vs torch SDPA", by_csr,
                 sdpa_reference(case), rtol=1e-4, atol=1e-5)
