"""Differential checks of the PD staging kernels against `models.pd_staging_copy` (SGLang 05c7ebf, PR #30545).

* `staging_gather_head_slice.differential`: random paged pools (any bit pattern, four
  dtypes), every writer of every decode rank of a TP pairing, any page list (repeats
  included), the writer at its slot offset or at an explicit offset in a larger buffer
  holding garbage: the staging buffer from the backend equals
  `gather_head_slice_to_staging` bit for bit, bytes outside the region included.
* `staging_scatter.differential`: the mirror, distinct destination pages: the whole pool
  after the backend's scatter equals `scatter_staging_to_pages` bit for bit, so other
  heads and pages are untouched.
* `staging_gather_head_slice.asan_catches_slot_overrun`: section 2.9 scenario A (prefill
  radix hit 608, ps 16, cps 256, L 1000, prefill TP 1 -> decode TP 4): the fixed plan's
  first send gathered into its slot runs clean with the reference bytes; the pre-05c7ebf
  first send (54 pages named chunk 0) gathered into that 16-page slot stops the ASan
  build with a heap-buffer-overflow WRITE in staging_gather_head_slice.cu, and scattering
  it back with its 54-page layout from the slot is a READ overflow in staging_scatter.cu.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.errors import PropertyViolation
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging.copy import gather_head_slice_to_staging, scatter_staging_to_pages
from kvsim.models.pd_staging.layout import HeadReshard, HeadSliceParams, StagingLayout
from kvsim.models.pd_staging.plan import StagingPlanConfig, plan_room_sends

from ...runtime import asan
from ...runtime.checks import CheckOutcome, hypothesis_check, oracle_check
from .backends import gather_head_slice, scatter_staging

DTYPES = ("float16", "uint8", "float32", "float64")
SCENARIO_A_PREFILL_HIT = 608  # section 2.9: the first batch then ends at 864
_RESHARDS = ((8, 4, 2), (8, 2, 4), (2, 8, 2), (2, 2, 8), (4, 4, 4), (1, 1, 2), (4, 1, 1), (16, 2, 8))


@dataclass(frozen=True)
class CopyCase:
    """One writer's copy between a paged pool and a staging buffer."""

    reshard: tuple[int, int, int]  # H, P_tp, D_tp
    decode_rank: int
    writer: int
    num_layers: int
    head_dim: int
    dtype: str
    page_size: int
    pool_pages: int
    pages: tuple[int, ...]
    pad: int  # garbage bytes after the slot
    offset: int | None  # None: the writer's offset in the slot
    threads: int
    seed: int

    @property
    def params(self) -> HeadSliceParams:
        cfg = HeadReshard(*self.reshard)
        return layout.writers_of_decode_rank(cfg, self.decode_rank)[self.writer][1]

    @property
    def layout(self) -> StagingLayout:
        head_bytes = self.head_dim * np.dtype(self.dtype).itemsize
        return layout.compute_staging_layout(HeadReshard(*self.reshard), self.decode_rank,
                                             len(self.pages) * self.page_size, self.num_layers, head_bytes)

    def pool(self, heads: int, salt: int) -> np.ndarray:
        shape = (self.num_layers, 2, self.pool_pages, self.page_size, heads, self.head_dim)
        rng = np.random.default_rng([self.seed, salt])
        nbytes = int(np.prod(shape)) * np.dtype(self.dtype).itemsize
        return rng.integers(0, 256, nbytes, dtype=np.uint8).view(self.dtype).reshape(shape)

    def staging(self) -> np.ndarray:
        lay = self.layout
        size = max(lay.total_bytes, (self.offset or 0) + lay.writer_size(self.writer)) + self.pad
        return np.random.default_rng([self.seed, 7]).integers(0, 256, size, dtype=np.uint8)


@st.composite
def copy_cases(draw: st.DrawFn, distinct_pages: bool = False) -> CopyCase:
    h, p, d = draw(st.sampled_from(_RESHARDS))
    cfg = HeadReshard(h, p, d)
    rank = draw(st.integers(0, d - 1))
    writer = draw(st.integers(0, len(cfg.writer_ranks(rank)) - 1))
    ps, pool_pages = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    n = draw(st.integers(0, pool_pages))
    if distinct_pages:
        pages = tuple(draw(st.permutations(range(pool_pages)))[:n])
    else:
        pages = tuple(draw(st.lists(st.integers(0, pool_pages - 1), min_size=n, max_size=n)))
    offset = draw(st.none() | st.integers(0, 64))
    return CopyCase((h, p, d), rank, writer, draw(st.integers(1, 3)), draw(st.integers(1, 5)),
                    draw(st.sampled_from(DTYPES)), ps, pool_pages, pages, draw(st.integers(0, 8)), offset,
                    draw(st.sampled_from((128, 1, 3, 64))), draw(st.integers(0, 2**16)))


def _differ(what: str, expected: np.ndarray, got: np.ndarray) -> str | None:
    a, b = expected.view(np.uint8).reshape(-1), got.view(np.uint8).reshape(-1)
    if a.shape != b.shape:
        return f"{what}: expected {a.size} bytes, got {b.size}"
    bad = np.flatnonzero(a != b)
    if not bad.size:
        return None
    return f"{what}: {bad.size} bytes differ, first at byte {bad[0]}: reference {a[bad[0]]}, backend {b[bad[0]]}"


@oracle_check("staging_gather_head_slice.differential")
def gather_differential(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """For every writer of every decode rank of eight TP pairings (GQA replication both ways), random pools of any
    bit pattern in four dtypes, any page list and the writer at its slot offset or anywhere in a larger garbage
    buffer, the staging buffer the backend's gather leaves equals models.pd_staging_copy's bit for bit."""

    def test(case: CopyCase) -> None:
        cfg = HeadReshard(*case.reshard)
        pool = case.pool(cfg.src_per, 1)
        staging = case.staging()
        want = gather_head_slice_to_staging(pool, case.pages, case.params, case.layout, staging.copy(), case.offset)
        got = gather_head_slice(backend, pool, case.pages, case.params, case.layout, staging, case.offset,
                                threads=case.threads)
        if message := _differ(f"staging bytes after the gather on {backend}", want, got):
            raise PropertyViolation(message)

    return hypothesis_check(copy_cases(), test, max_examples, seed)


@oracle_check("staging_scatter.differential")
def scatter_differential(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """For the same writers, pools and offsets, and distinct destination pages, the whole decode pool after the
    backend's scatter of a garbage-filled slot equals models.pd_staging_copy's bit for bit (other heads, pages
    and layers untouched)."""

    def test(case: CopyCase) -> None:
        cfg = HeadReshard(*case.reshard)
        pool = case.pool(cfg.dst_per, 2)
        staging = case.staging()
        want = scatter_staging_to_pages(pool.copy(), staging, case.pages, case.params, case.layout, case.offset)
        got = scatter_staging(backend, pool, staging, case.pages, case.params, case.layout, case.offset,
                              threads=case.threads)
        if message := _differ(f"decode pool after the scatter on {backend}", want, got):
            raise PropertyViolation(message)

    return hypothesis_check(copy_cases(distinct_pages=True), test, max_examples, seed)


# --- AddressSanitizer: the pre-05c7ebf multi-slot send -------------------------------------------------------

def overrun_cases() -> list[tuple[str, str, np.ndarray, np.ndarray, HeadSliceParams, StagingLayout, np.ndarray]]:
    """(what, kernel, pool, pages, params, layout, slot buffer) for scenario A on prefill TP 1 -> decode TP 4.

    The slot buffer is slot 0's 16 pages for decode rank 0; uint8 KV, one layer, head_dim 1.
    """
    cfg, res = StagingPlanConfig(1000, 0, 16, 256), HeadReshard(8, 1, 4)
    (_, params), = layout.writers_of_decode_rank(res, 0)
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 256, (1, 2, cfg.suffix_pages, cfg.page_size, res.src_per, 1), dtype=np.uint8)
    slot = layout.compute_staging_layout(res, 0, cfg.full_chunk_pages * cfg.page_size, 1, 1)
    buffer = np.zeros(slot.total_bytes, dtype=np.uint8)
    cases = []
    for variant in ("fixed", "pre_05c7ebf"):
        send = plan_room_sends(cfg, SCENARIO_A_PREFILL_HIT, variant=variant).sends[0]
        sent = layout.compute_staging_layout(res, 0, send.num_pages * cfg.page_size, 1, 1)
        pages = np.arange(send.page_start, send.page_end)
        what = f"{variant} send 0 ({send.num_pages} pages, chunk {send.chunk_idx})"
        cases.append((f"{what} gathered into slot 0", "gather", pool, pages, params, sent, buffer))
        if variant != "fixed":
            decode_pool = rng.integers(0, 256, (1, 2, cfg.suffix_pages, cfg.page_size, res.dst_per, 1), dtype=np.uint8)
            cases.append((f"{what} scattered from slot 0", "scatter", decode_pool, pages, params, sent, buffer))
    return cases


@oracle_check("staging_gather_head_slice.asan_catches_slot_overrun", backends=("cpu-shim-asan",),
              asan_in_child=False)
def staging_asan(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """Scenario A of section 2.9 (prefill radix hit 608, page 16, cps 256, prefill TP 1 -> decode TP 4): the
    pre-05c7ebf first send, 54 pages named chunk 0, gathered into that 16-page slot stops the ASan build with a
    heap-buffer-overflow WRITE in staging_gather_head_slice.cu, and its scatter out of the slot with a READ in
    staging_scatter.cu; the fixed plan's 16-page first send runs clean and gives the reference bytes."""
    caught = []
    for examples, (what, kernel, pool, pages, params, sent, buffer) in enumerate(overrun_cases(), 1):
        child = asan.run_staging_case(kernel, pool, pages, params, sent, buffer, 0)
        if what.startswith("fixed"):
            digest = hashlib.sha256(gather_head_slice_to_staging(pool, pages, params, sent, buffer.copy(), 0)
                                    .tobytes()).hexdigest()
            if not child.clean or child.output is None or child.output["sha256"] != digest:
                return CheckOutcome(examples, "failed", f"{what}: expected a clean run with the reference bytes, "
                                    f"got {child.explain()}")
            continue
        access, source = ("WRITE", "staging_gather_head_slice.cu") if kernel == "gather" else \
            ("READ", "staging_scatter.cu")
        report = child.report
        if report is None or report.kind != "heap-buffer-overflow" or report.access != access \
                or not report.file.endswith(source):
            return CheckOutcome(examples, "failed", f"{what}: expected an ASan heap-buffer-overflow {access} in "
                                f"{source}, got {child.explain()}")
        caught.append(f"{what}: {report}")
    return CheckOutcome(len(caught) + 1, "passed", "caught " + "; ".join(caught))
