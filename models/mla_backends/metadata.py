"""Batch MLA plan metadata (FlashInfer 0.7.4, `mla/_batch_mla/_contracts.py` and `_planning.py`).

Two forms describe the same requests:

* CSR (`MLAPlanMetadata.csr`, native to fa2/fa3): `qo_indptr`, `kv_indptr`, `kv_indices`,
  `kv_len_arr`; request `b` owns pages `kv_indices[kv_indptr[b]:kv_indptr[b+1]]`, exactly
  `ceil(kv_len_arr[b] / page_size)` of them.
* dense (`MLAPlanMetadata.dense`, native to cutlass, trtllm-gen, xqa, the CuTe DSL backends):
  `cum_seq_lens_q`, `block_tables` (one row per request, `width` columns), `seq_lens`,
  `max_q_len`.
* dual: both, which must describe the same requests.

Validation rules (`_validate_csr_metadata`, `_validate_dense_metadata`) are checked in upstream's
order, so the first broken rule is the one reported. Conversions: dense -> CSR takes each row's
live entries (`_derive_csr_from_dense`); CSR -> dense pads each row with 0 to `max(1, max pages)`
or to a backend's table-width alignment (`_derive_dense_from_csr`); a dense table whose width is
not a positive multiple of the alignment is padded the same way (`resolve_dense`).

Values are plain Python integers (tensor rank, dtype, device and contiguity are upstream's
concern before these rules, and are not modelled). A broken rule raises `MetadataError`, a
`ValueError` (upstream raises `ValueError`) carrying the rule's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

RULES = ("page_size", "indptr_empty", "indptr_start", "indptr_order", "batch_mismatch", "indices_short",
         "negative_length", "page_count", "table_width", "table_alignment", "max_q_len", "partial_form",
         "no_form", "dual_mismatch", "dense_batch")
CSR_FIELDS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")
DENSE_FIELDS = ("cum_seq_lens_q", "block_tables", "seq_lens")


class MetadataError(ValueError):
    """A metadata rule is broken: `rule` (one of RULES), the field and what was found."""

    def __init__(self, rule: str, field: str, detail: str) -> None:
        assert rule in RULES, rule
        self.rule, self.field = rule, field
        super().__init__(f"{field}: {detail} [{rule}]")


@dataclass(frozen=True)
class CsrMetadata:
    qo_indptr: tuple[int, ...]
    kv_indptr: tuple[int, ...]
    kv_indices: tuple[int, ...]
    kv_len_arr: tuple[int, ...]

    @property
    def batch(self) -> int:
        return len(self.qo_indptr) - 1


@dataclass(frozen=True)
class DenseMetadata:
    cum_seq_lens_q: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]  # one row per request, each `width` long
    width: int
    seq_lens: tuple[int, ...]
    max_q_len: int | None = None

    @property
    def batch(self) -> int:
        return len(self.cum_seq_lens_q) - 1


@dataclass(frozen=True)
class PlanMetadata:
    """`MLAPlanMetadata`: a CSR form, a dense form, or both (dual)."""

    csr: CsrMetadata | None = None
    dense: DenseMetadata | None = None

    @property
    def form(self) -> str:
        return "dual" if self.csr and self.dense else "csr" if self.csr else "dense" if self.dense else "none"


def pages_for(length: int, page_size: int) -> int:
    return -(-length // page_size)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _check_page_size(page_size: object) -> int:
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0:
        raise MetadataError("page_size", "page_size", f"expected a positive int, got {page_size!r}")
    return page_size


def check_indptr(name: str, indptr: Sequence[int]) -> None:
    """An indptr is non-empty, starts at 0 and never decreases."""
    if not indptr:
        raise MetadataError("indptr_empty", name, "expected at least one element, got none")
    if indptr[0] != 0:
        raise MetadataError("indptr_start", name, f"expected to start at 0, got {indptr[0]}")
    for i in range(1, len(indptr)):
        if indptr[i] < indptr[i - 1]:
            raise MetadataError("indptr_order", name, f"expected non-decreasing, got {indptr[i - 1]} then "
                                f"{indptr[i]} at {i}")


def max_q_len_of(cum_seq_lens_q: Sequence[int]) -> int:
    return max((b - a for a, b in zip(cum_seq_lens_q, cum_seq_lens_q[1:])), default=0)


def check_alignment(alignment: object) -> int:
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
        raise MetadataError("table_alignment", "table_width_alignment", f"expected a positive int, got {alignment!r}")
    return alignment


def canonical(csr: CsrMetadata) -> bool:
    """One kv_indptr span and one length per request of qo_indptr (the historical flat CSR of FA need not be)."""
    return len(csr.kv_indptr) == csr.batch + 1 and len(csr.kv_len_arr) == csr.batch


def validate_csr(csr: CsrMetadata, page_size: int, strict: bool = True) -> CsrMetadata:
    """`_validate_csr_metadata`: the rules in upstream's order; not `strict` (the historical flat CSR FA takes),
    batch arrays of other sizes are let through, unchecked against each other."""
    _check_page_size(page_size)
    check_indptr("qo_indptr", csr.qo_indptr)
    check_indptr("kv_indptr", csr.kv_indptr)
    batch = csr.batch
    whole = canonical(csr)
    if strict and not whole:
        raise MetadataError("batch_mismatch", "kv_indptr/kv_len_arr",
                            f"expected {batch + 1} and {batch} entries (qo_indptr's batch), got "
                            f"{len(csr.kv_indptr)} and {len(csr.kv_len_arr)}")
    if (strict or whole) and csr.kv_indptr[-1] > len(csr.kv_indices):
        raise MetadataError("indices_short", "kv_indices",
                            f"expected >= kv_indptr[-1] = {csr.kv_indptr[-1]} entries, got {len(csr.kv_indices)}")
    if any(n < 0 for n in csr.kv_len_arr):
        raise MetadataError("negative_length", "kv_len_arr", f"expected lengths >= 0, got {list(csr.kv_len_arr)}")
    if not whole:
        return csr
    for b in range(batch):
        have, want = csr.kv_indptr[b + 1] - csr.kv_indptr[b], pages_for(csr.kv_len_arr[b], page_size)
        if have != want:
            raise MetadataError("page_count", "kv_indptr",
                                f"request {b}: expected ceil({csr.kv_len_arr[b]} / {page_size}) = {want} pages, "
                                f"got {have}")
    return csr


def validate_dense(dense: DenseMetadata, page_size: int, table_width_alignment: int | None = None) -> DenseMetadata:
    """`_validate_dense_metadata`: the rules in upstream's order; returns the form with `max_q_len` resolved."""
    _check_page_size(page_size)
    check_indptr("cum_seq_lens_q", dense.cum_seq_lens_q)
    batch = dense.batch
    if len(dense.block_tables) != batch or len(dense.seq_lens) != batch:
        raise MetadataError("batch_mismatch", "block_tables/seq_lens",
                            f"expected {batch} rows (cum_seq_lens_q's batch), got {len(dense.block_tables)} and "
                            f"{len(dense.seq_lens)}")
    if any(n < 0 for n in dense.seq_lens):
        raise MetadataError("negative_length", "seq_lens", f"expected lengths >= 0, got {list(dense.seq_lens)}")
    live = max((pages_for(n, page_size) for n in dense.seq_lens), default=0)
    if live > dense.width:
        raise MetadataError("table_width", "block_tables",
                            f"expected width >= {live} live pages, got {dense.width}")
    if table_width_alignment is not None:
        check_alignment(table_width_alignment)
        if dense.width == 0 or dense.width % table_width_alignment:
            raise MetadataError("table_alignment", "block_tables",
                                f"expected a positive multiple of {table_width_alignment}, got width {dense.width}")
    actual = max_q_len_of(dense.cum_seq_lens_q)
    if dense.max_q_len is None:
        return DenseMetadata(dense.cum_seq_lens_q, dense.block_tables, dense.width, dense.seq_lens, actual)
    if not isinstance(dense.max_q_len, int) or isinstance(dense.max_q_len, bool):
        raise MetadataError("max_q_len", "max_q_len", f"expected an int or None, got {dense.max_q_len!r}")
    if dense.max_q_len < actual:
        raise MetadataError("max_q_len", "max_q_len", f"expected >= {actual}, got {dense.max_q_len}")
    return dense


def csr_from_dense(dense: DenseMetadata, page_size: int) -> CsrMetadata:
    """`_derive_csr_from_dense`: indptr is the cumulative live page count, indices each row's live entries."""
    live = [pages_for(n, page_size) for n in dense.seq_lens]
    indptr = [0]
    indices: list[int] = []
    for row, n in zip(dense.block_tables, live):
        indptr.append(indptr[-1] + n)
        indices.extend(row[:n])
    return CsrMetadata(dense.cum_seq_lens_q, tuple(indptr), tuple(indices), dense.seq_lens)


def table_width_for(max_pages: int, table_width_alignment: int | None) -> int:
    """Width of a derived (or padded) table: `max(1, max pages)`, or the alignment's smallest positive multiple."""
    if table_width_alignment is None:
        return max(1, max_pages)
    check_alignment(table_width_alignment)
    return max(table_width_alignment, round_up(max_pages, table_width_alignment))


def dense_from_csr(csr: CsrMetadata, table_width_alignment: int | None = None) -> DenseMetadata:
    """`_derive_dense_from_csr`: one row per request, live pages first, padded with page 0."""
    counts = [b - a for a, b in zip(csr.kv_indptr, csr.kv_indptr[1:])]
    width = table_width_for(max(counts, default=0), table_width_alignment)
    spans = zip(csr.kv_indptr, csr.kv_indptr[1:])
    rows = tuple(tuple(csr.kv_indices[a:b]) + (0,) * (width - (b - a)) for a, b in spans)
    return DenseMetadata(csr.qo_indptr, rows, width, csr.kv_len_arr, max_q_len_of(csr.qo_indptr))


def pad_dense(dense: DenseMetadata, table_width_alignment: int) -> DenseMetadata:
    """`resolve_dense` on a supplied dense form: unchanged when its width is a positive multiple of the
    alignment, else padded with page 0 to the smallest such width >= its own."""
    check_alignment(table_width_alignment)
    if dense.width > 0 and dense.width % table_width_alignment == 0:
        return dense
    width = table_width_for(dense.width, table_width_alignment)
    rows = tuple(row + (0,) * (width - dense.width) for row in dense.block_tables)
    return DenseMetadata(dense.cum_seq_lens_q, rows, width, dense.seq_lens, dense.max_q_len)


def forms_equivalent(csr: CsrMetadata, dense: DenseMetadata, page_size: int) -> bool:
    """`_ensure_equivalent`: the dense form's CSR equals the CSR form (indices compared on the live prefix)."""
    derived = csr_from_dense(dense, page_size)
    live_end = csr.kv_indptr[-1]
    return (csr.qo_indptr == derived.qo_indptr and csr.kv_indptr == derived.kv_indptr
            and csr.kv_indices[:live_end] == derived.kv_indices and csr.kv_len_arr == derived.kv_len_arr)


def check_forms(metadata: PlanMetadata, page_size: object) -> None:
    """The resolver's first checks (`_MLAPlanMetadataResolver._check_forms`): the page size, then a form."""
    _check_page_size(page_size)
    if metadata.csr is None and metadata.dense is None:
        raise MetadataError("no_form", "metadata", "expected a complete CSR or dense form, got neither")


def check_fields(present: Sequence[str], max_q_len: bool = False, page_size: object = None) -> None:
    """The forms of `MLAPlanMetadata` as its fields are given (`present`, field names), in the resolver's order
    (`_MLAPlanMetadataResolver._check_forms`): the page size when given, then each form whole or absent,
    `max_q_len` only with the whole dense form, and at least one form."""
    if page_size is not None:
        _check_page_size(page_size)
    for form, names in (("CSR", CSR_FIELDS), ("dense", DENSE_FIELDS)):
        missing = [n for n in names if n not in present]
        if 0 < len(missing) < len(names):
            raise MetadataError("partial_form", "metadata", f"expected the whole {form} form, missing {missing}")
    dense = all(n in present for n in DENSE_FIELDS)
    if max_q_len and not dense:
        raise MetadataError("partial_form", "max_q_len", "expected the whole dense form with it, got none")
    if not dense and not all(n in present for n in CSR_FIELDS):
        raise MetadataError("no_form", "metadata", "expected a complete CSR or dense form, got neither")


def resolve_csr(metadata: PlanMetadata, page_size: int, strict: bool = True) -> CsrMetadata:
    """The CSR form a CSR-native backend plans from: validated (`strict`: see `validate_csr`), or derived from
    the dense form; a dual form must be equivalent (`_MLAPlanMetadataResolver.resolve_csr`)."""
    check_forms(metadata, page_size)
    if metadata.csr is not None:
        csr = validate_csr(metadata.csr, page_size, strict)
        if metadata.dense is not None:
            _ensure_equivalent(csr, validate_dense(metadata.dense, page_size), page_size)
        return csr
    assert metadata.dense is not None
    return csr_from_dense(validate_dense(metadata.dense, page_size), page_size)


def resolve_dense(metadata: PlanMetadata, page_size: int, table_width_alignment: int | None = None,
                  strict: bool = True) -> DenseMetadata:
    """The dense form a dense-native backend plans from (`resolve_dense` / `resolve_native_dense`); a CSR form
    of batch arrays of other sizes (not `strict`) has no dense form (`dense_batch`). The page size and the forms
    are checked before the alignment, as upstream's `resolve_dense` does."""
    check_forms(metadata, page_size)
    if table_width_alignment is not None:
        check_alignment(table_width_alignment)
    if metadata.dense is not None:
        dense = validate_dense(metadata.dense, page_size)
        if metadata.csr is not None:
            _ensure_equivalent(validate_csr(metadata.csr, page_size, strict), dense, page_size)
        return dense if table_width_alignment is None else pad_dense(dense, table_width_alignment)
    assert metadata.csr is not None
    csr = validate_csr(metadata.csr, page_size, strict)
    if not canonical(csr):
        raise MetadataError("dense_batch", "metadata", "expected matching query and KV batch dimensions for a dense "
                            "backend, got a flat CSR")
    return dense_from_csr(csr, table_width_alignment)


def _ensure_equivalent(csr: CsrMetadata, dense: DenseMetadata, page_size: int) -> None:
    if not forms_equivalent(csr, dense, page_size):
        raise MetadataError("dual_mismatch", "metadata", "expected the CSR and dense forms to describe the same "
                            "requests, they differ")


def dual_of(csr: CsrMetadata, table_width_alignment: int | None = None) -> PlanMetadata:
    """A dual form built from a CSR form (the dense half derived)."""
    return PlanMetadata(csr, dense_from_csr(csr, table_width_alignment))
