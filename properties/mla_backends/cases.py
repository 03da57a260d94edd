"""Inputs of the mla-backends properties and the pinned cases (no Hypothesis here)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from kvsim.engine.system import Sometimes
from kvsim.models.mla_backends.capabilities import PlanContract
from kvsim.models.mla_backends.metadata import CsrMetadata, DenseMetadata, PlanMetadata, pages_for
from kvsim.models.mla_backends.selection import PlanRequest


@dataclass(frozen=True)
class MergeCase:
    """Three base-2 states `[T, H, D]` / `[T, H]`; `empty` marks, per state, the (t, h) rows that are empty."""

    seed: int
    tokens: int = 2
    heads: int = 2
    dim: int = 4
    empty: tuple[tuple[bool, ...], ...] = ((), (), ())
    lse_scale: float = 8.0

    def states(self) -> list[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng(self.seed)
        out = []
        for i in range(3):
            v = rng.standard_normal((self.tokens, self.heads, self.dim)).astype(np.float32)
            s = (rng.standard_normal((self.tokens, self.heads)) * self.lse_scale).astype(np.float32)
            mask = np.array(self.empty[i] if self.empty[i] else (False,) * (self.tokens * self.heads), bool)
            mask = mask.reshape(self.tokens, self.heads)
            v[mask] = 0.0
            s[mask] = -np.inf
            out.append((v, s))
        return out


@dataclass(frozen=True)
class ChunkCase:
    """One request's absorbed MLA attention (576 / 512 scaled down to `dim_qk` / `dim_v`) split into key chunks
    two ways (`bounds`, `other_bounds`) and merged in `order`."""

    seed: int
    q_len: int
    kv_len: int
    heads: int = 2
    dim_qk: int = 6
    dim_v: int = 4
    causal: bool = False
    bounds: tuple[int, ...] = (0,)
    other_bounds: tuple[int, ...] = (0,)
    order: tuple[int, ...] = ()

    def tensors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        rng = np.random.default_rng(self.seed)
        q = rng.standard_normal((self.q_len, self.heads, self.dim_qk))
        k = rng.standard_normal((self.kv_len, self.dim_qk))
        v = rng.standard_normal((self.kv_len, self.dim_v))
        return q, k, v[:, :self.dim_v], self.dim_qk ** -0.5


@dataclass(frozen=True)
class MetadataCase:
    """A batch described once: query lengths, KV lengths, page size, a page permutation, the dense table's extra
    width and a backend's table-width alignment (None: the native width)."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int = 1
    seed: int = 0
    extra_width: int = 0
    alignment: int | None = None
    spare_indices: int = 0  # kv_indices entries past kv_indptr[-1]

    def csr(self) -> CsrMetadata:
        pages = [pages_for(n, self.page_size) for n in self.kv_lens]
        total = sum(pages) + self.spare_indices
        perm = list(range(total))
        random.Random(self.seed).shuffle(perm)
        qo, kv = [0], [0]
        for q, p in zip(self.q_lens, pages):
            qo.append(qo[-1] + q)
            kv.append(kv[-1] + p)
        return CsrMetadata(tuple(qo), tuple(kv), tuple(perm), tuple(self.kv_lens))

    def dense(self) -> DenseMetadata:
        csr = self.csr()
        width = max([b - a for a, b in zip(csr.kv_indptr, csr.kv_indptr[1:])] + [0]) + self.extra_width
        rng = random.Random(self.seed + 1)
        rows = tuple(tuple(csr.kv_indices[a:b]) + tuple(rng.randrange(100, 200) for _ in range(width - (b - a)))
                     for a, b in zip(csr.kv_indptr, csr.kv_indptr[1:]))
        return DenseMetadata(csr.qo_indptr, rows, width, csr.kv_len_arr, None)


@dataclass(frozen=True)
class BrokenMetadataCase:
    """A valid batch with one rule broken (`mutation`), and the form it is given in."""

    base: MetadataCase
    form: str  # "csr" or "dense"
    mutation: str


@dataclass(frozen=True)
class SelectionCase:
    request: PlanRequest
    backend: str = "auto"
    cc: tuple[int, int] = (9, 0)
    outcomes: tuple[tuple[str, str], ...] = ()  # (backend, outcome) beyond the capability matrix
    allow_experimental: bool = False
    previous: str | None = None

    @property
    def outcome_map(self) -> dict[str, str]:
        return dict(self.outcomes)


def request_of(case: MetadataCase, contract: PlanContract = PlanContract(), **kw: object) -> PlanRequest:
    metadata = PlanMetadata(csr=case.csr())
    return PlanRequest(metadata, page_size=case.page_size, contract=contract, **kw)  # type: ignore[arg-type]


# Pinned: two empty states (#4051's reproducer, and vLLM #28181 / #39148's).
EMPTY_PAIR = MergeCase(seed=0, tokens=1, heads=1, dim=2, empty=((True,), (True,), (False,)))
# #4452: causal prefill with qo_len > kv_len: the first two query rows see no key.
MASKED_ROWS = ChunkCase(seed=3, q_len=4, kv_len=2, causal=True, bounds=(0, 1, 2), other_bounds=(0, 2), order=(1, 0))
# The note's DeepSeek decode batch: page 64, contexts 0, 1 and a non-multiple of the page size.
DECODE_BATCH = MetadataCase(q_lens=(1, 1, 1), kv_lens=(0, 1, 130), page_size=64, seed=7, extra_width=1,
                            alignment=2)
# A plan with an independent split KV cache on SM100: every packed-only backend is pre-filtered.
SPLIT_ON_SM100 = SelectionCase(request_of(DECODE_BATCH, PlanContract(kv_cache_layout="split",
                                                                      kv_kind="independent-split",
                                                                      kv_layout="independent-split")),
                               cc=(10, 0))
# An fa3 JIT failure on SM90: it must propagate, not fall back to fa2.
JIT_FAILURE_ON_SM90 = SelectionCase(request_of(DECODE_BATCH), cc=(9, 0), outcomes=(("fa3", "error:jit"),))


@dataclass(frozen=True)
class PagedCase:
    """A paged absorbed-MLA batch: query and KV lengths, page size, a random page permutation, a chunk size in
    pages, causal or not, and a table-width alignment for the dense form."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int
    seed: int
    chunk_pages: int = 1
    causal: bool = False
    alignment: int | None = None
    heads: int = 2

    def metadata(self) -> MetadataCase:
        return MetadataCase(self.q_lens, self.kv_lens, self.page_size, seed=self.seed, alignment=self.alignment)

    def tensors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        rng = np.random.default_rng(self.seed)
        pages = sum(pages_for(n, self.page_size) for n in self.kv_lens) + 1
        total_q = sum(self.q_lens)
        q_nope = rng.standard_normal((total_q, self.heads, 512)).astype(np.float32)
        q_pe = rng.standard_normal((total_q, self.heads, 64)).astype(np.float32)
        ckv = rng.standard_normal((pages, self.page_size, 512)).astype(np.float32)
        kpe = rng.standard_normal((pages, self.page_size, 64)).astype(np.float32)
        return q_nope, q_pe, ckv, kpe, 192 ** -0.5


# vLLM / FlashInfer decode and prefill shapes at page 16 and 64: kv_len 0, 1 and non-multiples of the page size.
PAGED_DECODE = PagedCase(q_lens=(1, 1, 1), kv_lens=(0, 1, 70), page_size=16, seed=20260727, chunk_pages=2,
                         alignment=8)
PAGED_PREFILL = PagedCase(q_lens=(3, 5), kv_lens=(65, 3), page_size=64, seed=11, causal=True, chunk_pages=1)


# -- what some drawn merge must be (`sometimes`: a strategy that never draws these corners checks nothing there) ------

def _empty_in_both(case: MergeCase) -> bool:
    first, second = case.empty[0], case.empty[1]
    return any(a and b for a, b in zip(first, second))


def _empty_against_full(case: MergeCase) -> bool:
    first, second = case.empty[0], case.empty[1]
    return any(a != b for a, b in zip(first, second))


def _large_lse(case: MergeCase) -> bool:
    return case.lse_scale >= 60.0


# the strategy of the merge properties with empty rows (`MERGE_CASES`): #4051 is a row empty on both sides
MERGE_SOMETIMES = (
    Sometimes("a_row_empty_on_both_sides", _empty_in_both, "both states empty at one (token, head): #4051's NaN"),
    Sometimes("an_empty_row_against_a_full_one", _empty_against_full,
              "one state empty where the other is not (the merge takes the full one whole)"),
    Sometimes("large_lses", _large_lse, "LSEs scaled by 60 (base-2 exponents far from 0)"),
)


def _empty_batch(case: MetadataCase) -> bool:
    return not case.q_lens


def _no_kv(case: MetadataCase) -> bool:
    return 0 in case.kv_lens


def _partial_last_page(case: MetadataCase) -> bool:
    return any(kv % case.page_size for kv in case.kv_lens)


def _padded_table(case: MetadataCase) -> bool:
    return case.extra_width > 0 or case.alignment is not None


# the strategy of the metadata conversions (`METADATA_CASES`): the batches a conversion gets wrong first
METADATA_SOMETIMES = (
    Sometimes("an_empty_batch", _empty_batch, "no requests at all"),
    Sometimes("a_request_without_kv", _no_kv, "a request with no KV pages"),
    Sometimes("a_partial_last_page", _partial_last_page, "a request's KV ends inside its last page"),
    Sometimes("a_padded_table", _padded_table, "a dense table wider than the batch needs (extra width or alignment)"),
)


def _auto(case: SelectionCase) -> bool:
    return case.backend == "auto"


def _plan_fault(case: SelectionCase) -> bool:
    return any(outcome.startswith("error:") for _, outcome in case.outcomes)


def _unsupported(case: SelectionCase) -> bool:
    return any(outcome == "unsupported" for _, outcome in case.outcomes)


# the strategy of the selection properties (`SELECTION_CASES`): auto selection, and backends that fail or refuse
SELECTION_SOMETIMES = (
    Sometimes("auto_selection", _auto, "the request names no backend: the auto order picks one"),
    Sometimes("a_backend_fails_at_plan", _plan_fault,
              "a backend raises at plan time (JIT, allocation, runtime, input)"),
    Sometimes("a_backend_refuses", _unsupported, "a backend answers unsupported beyond its capability matrix"),
)
