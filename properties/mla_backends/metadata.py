"""Metadata properties: both conversions round-trip, the derived forms validate, broken rules are named,
and a dual form is accepted exactly when its halves describe the same requests."""

from __future__ import annotations

from dataclasses import replace

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.mla_backends.metadata import (DenseMetadata, MetadataError, PlanMetadata, csr_from_dense,
                                               dense_from_csr, pad_dense, pages_for, resolve_csr, resolve_dense,
                                               table_width_for, validate_csr, validate_dense)
from kvsim.models.mla_backends.variants import MlaBackendsVariant

from .cases import DECODE_BATCH, METADATA_SOMETIMES, BrokenMetadataCase, MetadataCase

MODEL = "mla-backends"


def live_rows(dense: DenseMetadata, page_size: int) -> list[tuple[int, ...]]:
    return [row[:pages_for(n, page_size)] for row, n in zip(dense.block_tables, dense.seq_lens)]


@kv_property(model=MODEL, strategy="METADATA_CASES", examples=[DECODE_BATCH], sometimes=METADATA_SOMETIMES)
def dense_csr_dense_round_trip(case: MetadataCase, variant: MlaBackendsVariant) -> None:
    """dense -> CSR -> dense equals the original on the live prefix of every row; the derived CSR validates."""
    dense = validate_dense(case.dense(), case.page_size)
    csr = validate_csr(csr_from_dense(dense, case.page_size), case.page_size)
    back = dense_from_csr(csr, case.alignment)
    if live_rows(back, case.page_size) != live_rows(dense, case.page_size):
        raise PropertyViolation(f"live rows after dense -> CSR -> dense: expected {live_rows(dense, case.page_size)}, "
                                f"got {live_rows(back, case.page_size)}")
    if (back.cum_seq_lens_q, back.seq_lens) != (dense.cum_seq_lens_q, dense.seq_lens):
        raise PropertyViolation("cum_seq_lens_q / seq_lens after the round trip: expected unchanged")


@kv_property(model=MODEL, strategy="METADATA_CASES", examples=[DECODE_BATCH], sometimes=METADATA_SOMETIMES)
def csr_dense_csr_round_trip(case: MetadataCase, variant: MlaBackendsVariant) -> None:
    """CSR -> dense (native width, or the alignment's) -> CSR gives the CSR back (indices on the live prefix); the
    derived table is `max(1, max pages)` wide, or the smallest positive multiple of the alignment, padded with 0."""
    csr = validate_csr(case.csr(), case.page_size)
    dense = validate_dense(dense_from_csr(csr, case.alignment), case.page_size, case.alignment)
    max_pages = max([b - a for a, b in zip(csr.kv_indptr, csr.kv_indptr[1:])] + [0])
    want_width = table_width_for(max_pages, case.alignment)
    if dense.width != want_width or any(len(r) != want_width for r in dense.block_tables):
        raise PropertyViolation(f"derived table width (max pages {max_pages}, alignment {case.alignment}): expected "
                                f"{want_width}, got {dense.width}")
    pads = [x for row, live in zip(dense.block_tables, live_rows(dense, case.page_size)) for x in row[len(live):]]
    if any(pads):
        raise PropertyViolation(f"padding of the derived table: expected 0, got {sorted(set(pads))}")
    back = csr_from_dense(dense, case.page_size)
    end = csr.kv_indptr[-1]
    if (back.qo_indptr, back.kv_indptr, back.kv_indices, back.kv_len_arr) != \
            (csr.qo_indptr, csr.kv_indptr, csr.kv_indices[:end], csr.kv_len_arr):
        raise PropertyViolation(f"CSR after CSR -> dense -> CSR: expected {csr}, got {back}")


@kv_property(model=MODEL, strategy="METADATA_CASES", examples=[DECODE_BATCH], sometimes=METADATA_SOMETIMES)
def dual_forms_resolve_alike(case: MetadataCase, variant: MlaBackendsVariant) -> None:
    """A dual form of equivalent halves resolves to the same CSR and dense as either half alone; a dual form
    whose live indices differ is refused as `dual_mismatch`."""
    csr, dense = case.csr(), case.dense()
    dual = PlanMetadata(csr, dense)
    if resolve_csr(dual, case.page_size) != resolve_csr(PlanMetadata(csr=csr), case.page_size):
        raise PropertyViolation("CSR of the dual form: expected the CSR half")
    if live_rows(resolve_dense(dual, case.page_size), case.page_size) != \
            live_rows(resolve_dense(PlanMetadata(csr=csr), case.page_size), case.page_size):
        raise PropertyViolation("dense of the dual form: expected the CSR half's live rows")
    if case.alignment is not None:
        padded = resolve_dense(PlanMetadata(dense=dense), case.page_size, case.alignment)
        if padded != pad_dense(validate_dense(dense, case.page_size), case.alignment) or padded.width % case.alignment:
            raise PropertyViolation(f"dense table aligned to {case.alignment}: expected width a multiple, got "
                                    f"{padded.width}")
    if csr.kv_indptr[-1] == 0:
        return
    wrong = replace(csr, kv_indices=(csr.kv_indices[0] + 1,) + csr.kv_indices[1:])
    try:
        resolve_csr(PlanMetadata(wrong, dense), case.page_size)
    except MetadataError as exc:
        if exc.rule != "dual_mismatch":
            raise PropertyViolation(f"dual form with a differing page: expected dual_mismatch, got {exc.rule}")
        return
    raise PropertyViolation("dual form with a differing page: expected a refusal, got acceptance")


def broken(case: BrokenMetadataCase) -> tuple[PlanMetadata, str] | None:
    """The mutated metadata and the rule it must break first (None when this batch cannot carry the mutation)."""
    base, m = case.base, case.mutation
    csr, dense = base.csr(), base.dense()
    batch = len(base.kv_lens)
    if case.form == "csr":
        if m == "indptr_start":
            return PlanMetadata(csr=replace(csr, qo_indptr=(1,) + csr.qo_indptr[1:])), m
        if m == "indptr_order":
            if batch == 0:
                return None
            return PlanMetadata(csr=replace(csr, qo_indptr=csr.qo_indptr[:-1] + (csr.qo_indptr[-2] - 1,))), m
        if m == "batch_mismatch":
            return PlanMetadata(csr=replace(csr, kv_len_arr=csr.kv_len_arr + (0,))), m
        if m == "indices_short":
            if csr.kv_indptr[-1] == 0:
                return None
            return PlanMetadata(csr=replace(csr, kv_indices=csr.kv_indices[:csr.kv_indptr[-1] - 1])), m
        if m == "negative_length":
            if batch == 0:
                return None
            return PlanMetadata(csr=replace(csr, kv_len_arr=(-1,) + csr.kv_len_arr[1:])), m
        if batch == 0:
            return None
        return PlanMetadata(csr=replace(csr, kv_len_arr=(csr.kv_len_arr[0] + base.page_size,) + csr.kv_len_arr[1:])), \
            "page_count"
    if m == "indptr_start":
        return PlanMetadata(dense=replace(dense, cum_seq_lens_q=(2,) + dense.cum_seq_lens_q[1:])), m
    if m == "batch_mismatch":
        return PlanMetadata(dense=replace(dense, seq_lens=dense.seq_lens + (1,))), m
    if batch == 0:
        return None
    if m == "negative_length":
        return PlanMetadata(dense=replace(dense, seq_lens=(-1,) + dense.seq_lens[1:])), m
    if m == "table_width":
        longest = max(range(batch), key=lambda b: dense.seq_lens[b])
        grown = list(dense.seq_lens)
        grown[longest] = (dense.width + 1) * base.page_size
        return PlanMetadata(dense=replace(dense, seq_lens=tuple(grown))), m
    biggest = max(b - a for a, b in zip(dense.cum_seq_lens_q, dense.cum_seq_lens_q[1:]))
    if biggest == 0:
        return None
    return PlanMetadata(dense=replace(dense, max_q_len=biggest - 1)), "max_q_len"


@kv_property(model=MODEL, strategy="BROKEN_METADATA_CASES")
def broken_metadata_is_refused_by_its_rule(case: BrokenMetadataCase, variant: MlaBackendsVariant) -> None:
    """Metadata with one rule broken is refused, naming that rule (never silently planned)."""
    found = broken(case)
    if found is None:
        return
    metadata, rule = found
    resolve = resolve_csr if case.form == "csr" else resolve_dense
    try:
        resolve(metadata, case.base.page_size)
    except MetadataError as exc:
        if exc.rule != rule:
            raise PropertyViolation(f"{case.form} metadata with {case.mutation}: expected rule {rule}, got {exc.rule} "
                                    f"({exc})")
        return
    raise PropertyViolation(f"{case.form} metadata with {case.mutation}: expected a refusal, got acceptance")
