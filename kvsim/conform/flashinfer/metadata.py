"""FlashInfer 0.7.4 plan metadata (`_planning.py`) against `mla-backends`' metadata model.

On random batches (the `METADATA_CASES` strategy, and `BROKEN_METADATA_CASES`: one rule broken):
`_validate_csr_metadata` / `_validate_dense_metadata` accept or refuse as the model does, naming the
same rule; `_derive_csr_from_dense` / `_derive_dense_from_csr` (native width and each alignment)
give the model's conversions; `_MLAPlanMetadataResolver` resolves dual forms (equivalent and not)
and pads a supplied dense table to an alignment as the model does. Convention: upstream takes int32
CPU tensors and raises `ValueError` with a message; the adapter names the rule by the message's
wording (`RULE_WORDS`). Tensor rank, dtype, device and contiguity checks are upstream's alone.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable

from kvsim.models.mla_backends.metadata import (CsrMetadata, DenseMetadata, MetadataError, PlanMetadata,
                                               csr_from_dense, dense_from_csr, resolve_csr, resolve_dense)

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .common import MLA, int32, load, table

PLANNING = f"{MLA}/_planning.py"
NAMES = ("_validate_csr_metadata", "_validate_dense_metadata", "_derive_csr_from_dense", "_derive_dense_from_csr",
         "_MLAPlanMetadataResolver")
RULE_WORDS = (("must start at zero", "indptr_start"), ("nondecreasing", "indptr_order"),
              ("at least one element", "indptr_empty"), ("batch dimensions must agree", "batch_mismatch"),
              ("kv_indices metadata has", "indices_short"), ("must be nonnegative", "negative_length"),
              ("page counts in kv_indptr", "page_count"), ("width is smaller", "table_width"),
              ("positive multiple", "table_alignment"), ("max_q_len metadata must be at least", "max_q_len"),
              ("logically equivalent", "dual_mismatch"), ("form is partial", "partial_form"),
              ("complete CSR or dense", "no_form"))


def rule_of(exc: BaseException) -> str:
    text = str(exc)
    return next((rule for words, rule in RULE_WORDS if words in text), f"unrecognised: {type(exc).__name__}: {text}")


def to_csr(t: Any) -> CsrMetadata:
    return CsrMetadata(*(tuple(int(x) for x in getattr(t, n).tolist())
                         for n in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")))


def to_dense(t: Any) -> DenseMetadata:
    rows = tuple(tuple(int(x) for x in r) for r in t.block_tables.tolist())
    return DenseMetadata(tuple(int(x) for x in t.cum_seq_lens_q.tolist()), rows, int(t.block_tables.shape[1]),
                         tuple(int(x) for x in t.seq_lens.tolist()), int(t.max_q_len))


def raw(metadata: PlanMetadata) -> SimpleNamespace:
    """`MLAPlanMetadata`'s eight fields as tensors (None where the form is absent)."""
    c, d = metadata.csr, metadata.dense
    return SimpleNamespace(
        qo_indptr=int32(c.qo_indptr) if c else None, kv_indptr=int32(c.kv_indptr) if c else None,
        kv_indices=int32(c.kv_indices) if c else None, kv_len_arr=int32(c.kv_len_arr) if c else None,
        cum_seq_lens_q=int32(d.cum_seq_lens_q) if d else None,
        block_tables=table(d.block_tables, d.width) if d else None, seq_lens=int32(d.seq_lens) if d else None,
        max_q_len=d.max_q_len if d else None)


def outcome(fn: Callable[[], Any], convert: Callable[[Any], Any]) -> Any:
    try:
        return convert(fn())
    except (ValueError, MetadataError) as exc:
        return ("refuses", exc.rule if isinstance(exc, MetadataError) else rule_of(exc))


def run_metadata(source: EngineSource, options: RunOptions) -> TargetResult:
    import torch

    from kvsim.properties.mla_backends.metadata import broken
    from kvsim.properties.mla_backends.strategies import BROKEN_METADATA_CASES, METADATA_CASES

    started = time.perf_counter()
    result = TargetResult("metadata", source.version)
    ns = load(source, PLANNING, NAMES)
    cpu = torch.device("cpu")

    def compare(what: str, case: Any, want: Any, got: Any) -> None:
        result.compared += 1
        if want != got:
            result.diverge({"what": what, "case": repr(case)}, repr(want), repr(got))

    def resolver(metadata: PlanMetadata, page: int) -> Any:
        return ns._MLAPlanMetadataResolver(metadata=raw(metadata), page_size=page, device=cpu)

    def check_valid(case: Any) -> None:
        page, csr, dense = case.page_size, case.csr(), case.dense()
        t_csr, t_dense = raw(PlanMetadata(csr=csr)), raw(PlanMetadata(dense=dense))
        compare("validate csr", case, outcome(lambda: resolve_csr(PlanMetadata(csr=csr), page), lambda x: x),
                outcome(lambda: ns._validate_csr_metadata(qo_indptr=t_csr.qo_indptr, kv_indptr=t_csr.kv_indptr,
                                                          kv_indices=t_csr.kv_indices, kv_len_arr=t_csr.kv_len_arr,
                                                          page_size=page, device=cpu), to_csr))
        up_dense = ns._validate_dense_metadata(cum_seq_lens_q=t_dense.cum_seq_lens_q, block_tables=t_dense.block_tables,
                                               seq_lens=t_dense.seq_lens, max_q_len=None, page_size=page, device=cpu,
                                               table_width_alignment=None)
        compare("csr from dense", case, csr_from_dense(dense, page), to_csr(ns._derive_csr_from_dense(up_dense,
                                                                                                    page_size=page)))
        up_csr = ns._validate_csr_metadata(qo_indptr=t_csr.qo_indptr, kv_indptr=t_csr.kv_indptr,
                                           kv_indices=t_csr.kv_indices, kv_len_arr=t_csr.kv_len_arr, page_size=page,
                                           device=cpu)
        for alignment in (None, case.alignment or 1, 4):
            compare(f"dense from csr (alignment {alignment})", case, dense_from_csr(csr, alignment),
                    to_dense(ns._derive_dense_from_csr(up_csr, table_width_alignment=alignment)))
        if case.alignment is not None:
            compare(f"resolve_dense of a dense table (alignment {case.alignment})", case,
                    outcome(lambda: resolve_dense(PlanMetadata(dense=dense), page, case.alignment), lambda x: x),
                    outcome(lambda: resolver(PlanMetadata(dense=dense), page).resolve_dense(
                        table_width_alignment=case.alignment), to_dense))
        dual = PlanMetadata(csr, dense)
        compare("resolve_csr of a dual form", case, outcome(lambda: resolve_csr(dual, page), lambda x: x),
                outcome(lambda: resolver(dual, page).resolve_csr(), to_csr))
        if csr.kv_indptr[-1]:
            moved = (csr.kv_indices[0] + 1,) + csr.kv_indices[1:]
            wrong = PlanMetadata(CsrMetadata(csr.qo_indptr, csr.kv_indptr, moved, csr.kv_len_arr), dense)
            compare("resolve_dense of a mismatched dual form", case,
                    outcome(lambda: resolve_dense(wrong, page), lambda x: x),
                    outcome(lambda: resolver(wrong, page).resolve_native_dense(), to_dense))

    def check_broken(case: Any) -> None:
        found = broken(case)
        if found is None:
            return
        metadata, _ = found
        page = case.base.page_size
        model = resolve_csr if case.form == "csr" else resolve_dense
        up = resolver(metadata, page)
        up_fn = up.resolve_csr if case.form == "csr" else up.resolve_native_dense
        compare(f"{case.form} with {case.mutation}", case, outcome(lambda: model(metadata, page), lambda x: ("ok",)),
                outcome(up_fn, lambda x: ("ok",)))

    drive(METADATA_CASES, check_valid, options)
    drive(BROKEN_METADATA_CASES, check_broken, options)
    result.note = f"{options.max_examples} valid batches (validation, both conversions at 3 alignments, dual forms) " \
                  f"and {options.max_examples} batches with one rule broken"
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "metadata", PLANNING, NAMES, "mla-backends",
           "validation, CSR <-> dense conversions, alignment padding and dual forms on random batches", run_metadata),
)
