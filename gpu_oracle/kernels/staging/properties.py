"""Kernel properties of the PD staging kernels against model `pd-staging` (SGLang 05c7ebf, PR #30545).

* `staging_gather_head_slice_differential`: random paged pools (any bit pattern, four
  dtypes), every writer of every decode rank of a TP pairing, any page list (repeats
  included), the writer at its slot offset or at an explicit offset in a larger buffer
  holding garbage: the staging buffer from the backend equals
  `gather_head_slice_to_staging` bit for bit, bytes outside the region included.
* `staging_scatter_differential`: the mirror, distinct destination pages: the whole pool
  after the backend's scatter equals `scatter_staging_to_pages` bit for bit, so other
  heads and pages are untouched.
* `decode_kv_through_kernels_matches_single_server`: the model's end-to-end property
  (`kvsim.properties.pd_staging.e2e`) with both copies done by the backend's kernels:
  every decode rank's paged KV equals a single server's, bit for bit.
* `staging_gather_head_slice_asan_catches_slot_overrun`: section 2.9 scenario A (prefill
  radix hit 608, ps 16, cps 256, L 1000, prefill TP 1 -> decode TP 4): the fixed plan's
  first send gathered into its slot runs clean with the reference bytes; the pre-05c7ebf
  first send (54 pages named chunk 0) gathered into that 16-page slot stops the ASan
  build with a heap-buffer-overflow WRITE in staging_gather_head_slice.cu, and scattering
  it back with its 54-page layout from the slot is a READ overflow in staging_scatter.cu.

The kernels have no variants: these properties hold on every variant of the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kernel_property
from kvsim.models.pd_staging.copy import gather_head_slice_to_staging, scatter_staging_to_pages
from kvsim.models.pd_staging.layout import HeadReshard

from ...runtime import asan
from ...runtime.discovery import BACKEND_NAMES
from kvsim.properties.pd_staging.cases import LLAMA_CASES, TransferCase
from kvsim.properties.pd_staging.e2e import Copies, check_transfer

from .backends import case_document, gather_head_slice, scatter_staging
from .cases import CopyCase, OverrunCase

MODEL = "pd-staging"


def _differ(what: str, expected: np.ndarray, got: np.ndarray) -> None:
    a, b = expected.view(np.uint8).reshape(-1), got.view(np.uint8).reshape(-1)
    if a.shape != b.shape:
        raise PropertyViolation(f"{what}: expected {a.size} bytes, got {b.size}")
    bad = np.flatnonzero(a != b)
    if bad.size:
        raise PropertyViolation(f"{what}: {bad.size} bytes differ, first at byte {bad[0]}: reference {a[bad[0]]}, "
                                f"backend {b[bad[0]]}")


@kernel_property(model=MODEL, strategy="GATHER_CASES", backends=BACKEND_NAMES)
def staging_gather_head_slice_differential(case: CopyCase, variant: Any, backend: str) -> None:
    """For every writer of every decode rank of eight TP pairings (GQA replication both ways), random pools of any
    bit pattern in four dtypes, any page list and the writer at its slot offset or anywhere in a larger garbage
    buffer, the staging buffer the backend's gather leaves equals the model's gather_head_slice_to_staging bit
    for bit."""
    pool = case.pool(HeadReshard(*case.reshard).src_per, 1)
    staging = case.staging()
    want = gather_head_slice_to_staging(pool, case.pages, case.params, case.layout, staging.copy(), case.offset)
    got = gather_head_slice(backend, pool, case.pages, case.params, case.layout, staging, case.offset,
                            threads=case.threads)
    _differ(f"staging bytes after the gather on {backend}", want, got)


@kernel_property(model=MODEL, strategy="SCATTER_CASES", backends=BACKEND_NAMES)
def staging_scatter_differential(case: CopyCase, variant: Any, backend: str) -> None:
    """For the same writers, pools and offsets, and distinct destination pages, the whole decode pool after the
    backend's scatter of a garbage-filled slot equals the model's scatter_staging_to_pages bit for bit (other
    heads, pages and layers untouched)."""
    pool = case.pool(HeadReshard(*case.reshard).dst_per, 2)
    staging = case.staging()
    want = scatter_staging_to_pages(pool.copy(), staging, case.pages, case.params, case.layout, case.offset)
    got = scatter_staging(backend, pool, staging, case.pages, case.params, case.layout, case.offset,
                          threads=case.threads)
    _differ(f"decode pool after the scatter on {backend}", want, got)


@kernel_property(model=MODEL, strategy="OVERRUNS", backends=("cpu-shim-asan",), asan_in_child=False)
def staging_gather_head_slice_asan_catches_slot_overrun(case: OverrunCase, variant: Any, backend: str) -> None:
    """Scenario A of section 2.9 (prefill radix hit 608, page 16, cps 256, prefill TP 1 -> decode TP 4): the
    pre-05c7ebf first send, 54 pages named chunk 0, gathered into that 16-page slot stops the ASan build with a
    heap-buffer-overflow WRITE in staging_gather_head_slice.cu, and its scatter out of the slot with a READ in
    staging_scatter.cu; the fixed plan's 16-page first send runs clean and gives the reference bytes."""
    child = asan.run_case("staging", case_document(case.kernel, case.pool, case.pages, case.params, case.sent,
                                                   case.slot, 0))
    if not case.overrun:
        reference = gather_head_slice_to_staging(case.pool, case.pages, case.params, case.sent, case.slot.copy(), 0)
        asan.expect_clean(case.what, child, reference)
    elif case.kernel == "gather":
        asan.expect_overflow(case.what, child, "WRITE", "staging_gather_head_slice.cu")
    else:
        asan.expect_overflow(case.what, child, "READ", "staging_scatter.cu")


@kernel_property(model=MODEL, strategy="TRANSFER_CASES", backends=BACKEND_NAMES, examples=LLAMA_CASES)
def decode_kv_through_kernels_matches_single_server(case: TransferCase, variant: Any, backend: str) -> None:
    """The model's end-to-end transfer (send plan, staging ring, every writer of every decode rank) with both the
    head-slice gather and the scatter done by the backend's kernels: every decode rank's paged KV equals, bit for
    bit, the KV a single non-disaggregated server holds (the Llama-3.1-8B cases and random rooms)."""
    copies = Copies(lambda *a: gather_head_slice(backend, *a), lambda *a: scatter_staging(backend, *a))
    check_transfer(case, variant, copies)
