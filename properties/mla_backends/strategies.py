"""Hypothesis strategies of the mla-backends properties (imported only when a property runs)."""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import strategies as st

from kvsim.models.mla_backends.capabilities import KV_LAYOUTS, LSE_MODES, OUTPUT_SCALES, SCALE_MODES, PlanContract
from kvsim.models.mla_backends.contract import InputContract, RunArguments
from kvsim.models.mla_backends.metadata import PlanMetadata
from kvsim.models.mla_backends.selection import COMPUTE_CAPABILITIES, OUTCOMES, REQUESTS, PlanRequest

from .cases import BrokenMetadataCase, ChunkCase, MergeCase, MetadataCase, PagedCase, SelectionCase

CSR_MUTATIONS = ("indptr_start", "indptr_order", "batch_mismatch", "indices_short", "negative_length", "page_count")
DENSE_MUTATIONS = ("indptr_start", "batch_mismatch", "negative_length", "table_width", "max_q_len")


@st.composite
def merge_cases(draw: st.DrawFn, *, empties: bool = True) -> MergeCase:
    tokens, heads = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    n = tokens * heads
    rows = st.lists(st.booleans(), min_size=n, max_size=n).map(tuple) if empties else st.just(())
    return MergeCase(seed=draw(st.integers(0, 2 ** 16)), tokens=tokens, heads=heads, dim=draw(st.integers(1, 4)),
                     empty=(draw(rows), draw(rows), draw(rows)), lse_scale=draw(st.sampled_from((1.0, 8.0, 60.0))))


def _bounds(draw: st.DrawFn, kv_len: int) -> tuple[int, ...]:
    cuts = draw(st.lists(st.integers(0, kv_len), max_size=4))
    return (0, *sorted(cuts), kv_len)


@st.composite
def chunk_cases(draw: st.DrawFn) -> ChunkCase:
    kv_len = draw(st.integers(0, 12))
    bounds = _bounds(draw, kv_len)
    order = tuple(draw(st.permutations(range(len(bounds) - 1))))
    return ChunkCase(seed=draw(st.integers(0, 2 ** 16)), q_len=draw(st.integers(1, 5)), kv_len=kv_len,
                     heads=draw(st.integers(1, 2)), causal=draw(st.booleans()), bounds=bounds,
                     other_bounds=_bounds(draw, kv_len), order=order)


# A strategy that a composite draws on every example is built (and validated) once, here, for each argument set it
# takes: the same strategies, so the same draws.

@functools.lru_cache(maxsize=None)
def _kv_lists(page: int, batch: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.one_of(st.sampled_from((0, 1, page, page + 1)), st.integers(0, 4 * page)),
                    min_size=batch, max_size=batch)


@functools.lru_cache(maxsize=None)
def _q_lists(batch: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, 4), min_size=batch, max_size=batch)


@functools.lru_cache(maxsize=None)
@st.composite
def metadata_cases(draw: st.DrawFn) -> MetadataCase:
    batch = draw(st.integers(0, 5))
    page = draw(st.sampled_from((1, 2, 16, 32, 64)))
    kv = tuple(draw(_kv_lists(page, batch)))
    q = tuple(draw(_q_lists(batch)))
    return MetadataCase(q, kv, page, seed=draw(st.integers(0, 2 ** 16)), extra_width=draw(st.integers(0, 3)),
                        alignment=draw(st.one_of(st.none(), st.integers(1, 8))),
                        spare_indices=draw(st.integers(0, 2)))


@st.composite
def broken_metadata_cases(draw: st.DrawFn) -> BrokenMetadataCase:
    base = draw(metadata_cases())
    form = draw(st.sampled_from(("csr", "dense")))
    mutation = draw(st.sampled_from(CSR_MUTATIONS if form == "csr" else DENSE_MUTATIONS))
    return BrokenMetadataCase(base, form, mutation)


@functools.lru_cache(maxsize=None)
@st.composite
def contracts(draw: st.DrawFn) -> PlanContract:
    kv_cache_layout = draw(st.sampled_from(("packed", "split")))
    kv_kind = draw(st.sampled_from(("packed", "adjacent-split", "independent-split", "dual")))
    return PlanContract(query_layout=draw(st.sampled_from(("packed", "split"))), kv_cache_layout=kv_cache_layout,
                        query_kind=draw(st.sampled_from(("packed", "adjacent-split", "independent-split", None))),
                        kv_kind=kv_kind, lse_mode=draw(st.sampled_from(LSE_MODES)),
                        kv_layout=draw(st.sampled_from(KV_LAYOUTS)), output_scale=draw(st.sampled_from(OUTPUT_SCALES)),
                        scale_mode=draw(st.sampled_from(SCALE_MODES)), skip_softmax=draw(st.booleans()),
                        enable_pdl=draw(st.sampled_from((None, False, True))), use_sinks=draw(st.booleans()))


@st.composite
def plan_requests(draw: st.DrawFn, *, contract: st.SearchStrategy[PlanContract] | None = None) -> PlanRequest:
    case = draw(metadata_cases())
    dense = draw(st.booleans())
    metadata = PlanMetadata(dense=case.dense()) if dense else PlanMetadata(csr=case.csr())
    return PlanRequest(metadata, page_size=case.page_size, num_heads=draw(st.sampled_from((1, 8, 16, 64, 128))),
                       causal=draw(st.booleans()), contract=draw(contract if contract is not None else contracts()),
                       use_cuda_graph=draw(st.booleans()), fp8=draw(st.booleans()))


@functools.lru_cache(maxsize=None)
def _selection_requests() -> st.SearchStrategy[PlanRequest]:
    return plan_requests(contract=st.one_of(st.just(PlanContract()), contracts()))


@functools.lru_cache(maxsize=None)
def _requests_on(contract: PlanContract) -> st.SearchStrategy[PlanRequest]:
    return plan_requests(contract=st.just(contract))


@st.composite
def selection_cases(draw: st.DrawFn) -> SelectionCase:
    request = draw(_selection_requests())
    backends = draw(st.lists(st.sampled_from(REQUESTS[2:]), max_size=3, unique=True))
    outcomes = tuple((b, draw(st.sampled_from(OUTCOMES))) for b in backends)
    return SelectionCase(request, backend=draw(st.sampled_from(REQUESTS)),
                         cc=draw(st.sampled_from(COMPUTE_CAPABILITIES)),
                         outcomes=outcomes, allow_experimental=draw(st.booleans()))


@st.composite
def auto_fault_cases(draw: st.DrawFn) -> SelectionCase:
    """Auto selection on a contract most backends serve, with plan-time faults on one to three backends."""
    contract = PlanContract(lse_mode=draw(st.sampled_from(("none", "none", "base2"))))
    request = draw(_requests_on(contract))
    backends = draw(st.lists(st.sampled_from(REQUESTS[2:]), min_size=1, max_size=3, unique=True))
    outcomes = tuple((b, draw(st.sampled_from(OUTCOMES[1:]))) for b in backends)
    return SelectionCase(request, backend="auto", cc=draw(st.sampled_from(COMPUTE_CAPABILITIES)), outcomes=outcomes,
                         allow_experimental=draw(st.booleans()))


@st.composite
def paged_cases(draw: st.DrawFn) -> PagedCase:
    """Page sizes 1/16/32/64, kv_len 0, 1, a page +- 1 or any up to 3 pages; 1-3 requests of 1-4 queries."""
    page = draw(st.sampled_from((1, 16, 32, 64)))
    batch = draw(st.integers(1, 3))
    kv = tuple(draw(st.one_of(st.sampled_from((0, 1, max(1, page - 1), page + 1)), st.integers(0, 3 * page)))
               for _ in range(batch))
    q = tuple(draw(st.integers(1, 4)) for _ in range(batch))
    return PagedCase(q, kv, page, seed=draw(st.integers(0, 2 ** 16)), chunk_pages=draw(st.integers(1, 3)),
                     causal=draw(st.booleans()), alignment=draw(st.one_of(st.none(), st.sampled_from((2, 8)))))


@st.composite
def run_contract_cases(draw: st.DrawFn) -> tuple[InputContract, str]:
    contract = InputContract(lse_mode=draw(st.sampled_from(LSE_MODES)),
                             output_dtype=draw(st.sampled_from(("bfloat16", "float8_e4m3fn"))),
                             output_scale=draw(st.sampled_from(OUTPUT_SCALES)),
                             scale_mode=draw(st.sampled_from(SCALE_MODES)), skip_softmax=draw(st.booleans()),
                             use_sinks=draw(st.booleans()))
    return contract, draw(st.sampled_from([f.name for f in dataclasses.fields(RunArguments)]))


MERGE_CASES = merge_cases()
FINITE_MERGE_CASES = merge_cases(empties=False)
CHUNK_CASES = chunk_cases()
METADATA_CASES = metadata_cases()
BROKEN_METADATA_CASES = broken_metadata_cases()
SELECTION_CASES = selection_cases()
AUTO_FAULT_CASES = auto_fault_cases()
CONTRACTS = contracts()
PAGED_CASES = paged_cases()
RUN_CONTRACT_CASES = run_contract_cases()
