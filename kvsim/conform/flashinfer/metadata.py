"""FlashInfer 0.7.4 plan metadata (`_planning.py`) against `mla-backends`' metadata model.

`METADATA` (a Differential): one call on one batch (the `METADATA_CASES` strategy: page sizes 1-64, lengths 0,
1, a page and past it, spare indices, a dense table wider than needed), the batch given valid, with one rule
broken (`broken`, and an empty or decreasing indptr), as a flat CSR of batch arrays of other sizes (FA's
historical form), or as a dual form whose halves differ. The call is one of

* `_validate_csr_metadata` (every argument: `strict` too) and `_validate_dense_metadata` (`max_q_len` None,
  the batch's, larger, smaller or not an int; `table_width_alignment` None, any, or invalid);
* `_derive_csr_from_dense` and `_derive_dense_from_csr` (native width, any alignment, an invalid one);
* `_MLAPlanMetadataResolver(metadata, page_size, device, strict_csr)` and one to three of its methods
  (`resolve_csr`, `resolve_dense`, `resolve_device_dense`, `resolve_native_dense`,
  `resolve_native_device_dense`: the later calls read what the first cached), on any form: CSR, dense, dual,
  none, or a form with fields missing (and `max_q_len` without the dense form), on the CPU or the `meta`
  device (where the device forms are moved: their answer is then their shapes and device);

against the model's `validate_csr`, `validate_dense`, `csr_from_dense`, `dense_from_csr`, `check_fields`,
`resolve_csr` and `resolve_dense`. Answers are the forms' values (tensors as lists) with their field names;
upstream's raise equals the model's refusal when its message names the same rule (`RULE_WORDS`, and for an
indptr rule the same field, for a partial form the same missing fields; `NamedRefusals`). Page sizes and alignments are sometimes invalid (0, -1, True, 2.0).

Conventions: upstream takes int32 CPU tensors; tensor rank, dtype, device and contiguity checks are upstream's
alone (never drawn); derivations are given validated forms (upstream's `_CSRPlanMetadata` /
`_DensePlanMetadata`, as the resolver hands them); a form with fields missing is the model's `check_fields` on
the names given, before it resolves.


Survivors (declared in `models/mla_backends/conform.py`): symmetric calls with their arguments swapped
(`torch.equal`, `max`); `strict or has_canonical_batch_shape` without `strict` (strict without a canonical batch
has raised before); an empty batch's max page count, an empty row's copy, a width-1 table at alignment 1 and
the padded width's rounding term, each giving the same table; the cached form passed to the dual check. Unreached:
`_validate_dense`'s check of an alignment on a cached form (every caller passes None).

Settled (model fixes, `tests/conform/flashinfer/test_conform_flashinfer.py`): the model had no non-strict CSR (FA's flat CSR, and
the dense backends' refusal of it, `dense_batch`), no partial-form rule and no type check of `max_q_len`; with an
invalid `page_size` the resolver reports `page_size` before a missing or partial form and before an invalid
alignment (`_check_forms` checks it first), where the model reported the form or the alignment.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential
from kvsim.engine.errors import ConfigError
from kvsim.models.mla_backends.metadata import (CSR_FIELDS, DENSE_FIELDS, CsrMetadata, DenseMetadata, MetadataError,
                                               PlanMetadata, check_alignment, check_fields, csr_from_dense, dense_from_csr,
                                               resolve_csr, resolve_dense, validate_csr, validate_dense)

from .common import MLA, NamedRefusals, int32, refuse, rule_by_words, table

PLANNING = f"{MLA}/_planning.py"
RESOLVER = "_MLAPlanMetadataResolver"
NAMES = ("_validate_csr_metadata", "_validate_dense_metadata", "_derive_csr_from_dense", "_derive_dense_from_csr",
         RESOLVER, "_CSRPlanMetadata", "_DensePlanMetadata")
RULE_WORDS = (("page_size must be a positive int", "page_size"), ("at least one element", "indptr_empty"),
              ("must start at zero", "indptr_start"), ("nondecreasing", "indptr_order"),
              ("batch dimensions must agree", "batch_mismatch"), ("kv_indices metadata has", "indices_short"),
              ("must be nonnegative", "negative_length"), ("page counts in kv_indptr", "page_count"),
              ("width is smaller", "table_width"), ("positive multiple", "table_alignment"),
              ("table-width alignment must be positive", "table_alignment"),
              ("max_q_len metadata must be", "max_q_len"), ("max_q_len metadata requires", "partial_form"),
              ("logically equivalent", "dual_mismatch"), ("form is partial", "partial_form"),
              ("complete CSR or dense", "no_form"), ("require matching query/KV batch", "dense_batch"))
INDPTR_RULES = ("indptr_empty", "indptr_start", "indptr_order")
OPERATIONS = ("validate_csr", "validate_dense", "csr_from_dense", "dense_from_csr", "resolver")
METHODS = ("resolve_csr", "resolve_dense", "resolve_device_dense", "resolve_native_dense",
           "resolve_native_device_dense")
ALIGNED = ("resolve_dense", "resolve_device_dense")
INVALID = (0, -1, True, 2.0)  # page sizes and alignments upstream and the model refuse
FIELDS = CSR_FIELDS + DENSE_FIELDS


@dataclass(frozen=True)
class MetadataCall:
    """One call: `operation` on `metadata` (`PlanMetadata`; `dropped`: fields given as None, `max_q_len`: whether
    the dense form's is given) with its arguments; `calls`: the resolver's (method, alignment) calls."""

    operation: str
    metadata: PlanMetadata
    page_size: Any
    how: str = "valid"  # valid / a broken rule / flat / mismatch (how the batch was made)
    alignment: Any = None
    strict: bool = True
    device: str = "cpu"
    dropped: tuple[str, ...] = ()
    calls: tuple[tuple[str, Any], ...] = ()

    @property
    def present(self) -> tuple[str, ...]:
        m = self.metadata
        given = (CSR_FIELDS if m.csr else ()) + (DENSE_FIELDS if m.dense else ())
        return tuple(f for f in given if f not in self.dropped)

    @property
    def has_max_q_len(self) -> bool:
        return self.metadata.dense is not None and self.metadata.dense.max_q_len is not None \
            and "max_q_len" not in self.dropped


# -- inputs -------------------------------------------------------------------------------------------------

def _flat(csr: CsrMetadata, extra_query: bool) -> CsrMetadata:
    """FA's historical flat CSR: one more query offset, or one length fewer."""
    if extra_query:
        return replace(csr, qo_indptr=csr.qo_indptr + (csr.qo_indptr[-1] + 1,))
    return replace(csr, kv_len_arr=csr.kv_len_arr[:-1], kv_indptr=csr.kv_indptr[:-1]) if csr.batch else csr


def _batch(draw: st.DrawFn, base: Any) -> tuple[PlanMetadata, str]:
    """The batch as a CSR, dense or dual form: valid, with one rule broken, flat, or a dual form that differs."""
    from kvsim.properties.mla_backends.cases import BrokenMetadataCase
    from kvsim.properties.mla_backends.metadata import broken
    from kvsim.properties.mla_backends.strategies import CSR_MUTATIONS, DENSE_MUTATIONS

    csr, dense = base.csr(), base.dense()
    how = draw(st.sampled_from(("valid", "valid", "broken", "empty", "flat", "mismatch", "max_q_len")))
    form = draw(st.sampled_from(("csr", "dense", "dual")))
    if how == "broken":
        which = draw(st.sampled_from(("csr", "dense")))
        mutation = draw(st.sampled_from(CSR_MUTATIONS if which == "csr" else DENSE_MUTATIONS))
        found = broken(BrokenMetadataCase(base, which, mutation))
        if found is not None:
            bad = found[0]
            return PlanMetadata(bad.csr or (csr if form == "dual" else None),
                                bad.dense or (dense if form == "dual" else None)), found[1]
        how = "valid"
    if how == "empty":
        field = draw(st.sampled_from(("qo_indptr", "kv_indptr", "cum_seq_lens_q", "kv_order")))
        if field == "cum_seq_lens_q":
            return PlanMetadata(dense=replace(dense, cum_seq_lens_q=())), "indptr_empty"
        if field == "kv_order":
            if csr.kv_indptr[-1] == 0:
                return PlanMetadata(csr=csr), "valid"
            return PlanMetadata(csr=replace(csr, kv_indptr=csr.kv_indptr[:-1] + (0,))), "indptr_order"
        return PlanMetadata(csr=replace(csr, **{field: ()})), "indptr_empty"
    if how == "flat":
        return PlanMetadata(_flat(csr, draw(st.booleans())), dense if form == "dual" else None), "flat"
    if how == "mismatch" and csr.kv_indptr[-1]:
        moved = (csr.kv_indices[0] + 1,) + csr.kv_indices[1:]
        return PlanMetadata(replace(csr, kv_indices=moved), dense), "mismatch"
    if how == "max_q_len":
        actual = max([b - a for a, b in zip(dense.cum_seq_lens_q, dense.cum_seq_lens_q[1:])], default=0)
        given = draw(st.sampled_from((actual, actual + 2, actual - 1, 2.0, True)))
        return PlanMetadata(csr if form == "dual" else None, replace(dense, max_q_len=given)), "max_q_len"
    return PlanMetadata(csr if form != "dense" else None, dense if form != "csr" else None), "valid"


def _alignment(draw: st.DrawFn, base: Any) -> Any:
    """None, the batch's, any from 1 to 8, or (one in eight) an invalid one."""
    if draw(st.integers(0, 7)) == 0:
        return draw(st.sampled_from(INVALID))
    return draw(st.sampled_from((None, base.alignment or 1, draw(st.integers(1, 8)))))


@st.composite
def metadata_calls(draw: st.DrawFn) -> MetadataCall:
    from kvsim.properties.mla_backends.strategies import METADATA_CASES

    base = draw(METADATA_CASES)
    operation = draw(st.sampled_from(OPERATIONS + ("resolver",) * 4))
    metadata, how = _batch(draw, base)
    page = base.page_size
    if operation in ("csr_from_dense", "dense_from_csr"):  # derivations take validated forms
        return MetadataCall(operation, PlanMetadata(base.csr(), base.dense()), page,
                            alignment=_alignment(draw, base))
    strict = draw(st.booleans())
    if operation == "validate_csr":
        csr = metadata.csr or base.csr()
        return MetadataCall(operation, PlanMetadata(csr=csr), _page(draw, page), how, strict=strict)
    if operation == "validate_dense":
        dense = metadata.dense or base.dense()
        return MetadataCall(operation, PlanMetadata(dense=dense), _page(draw, page), how,
                            alignment=_alignment(draw, base))
    dropped: tuple[str, ...] = ()
    if draw(st.integers(0, 5)) == 0:
        dropped = tuple(draw(st.lists(st.sampled_from(FIELDS + ("max_q_len",)), unique=True, min_size=1,
                                      max_size=3)))
    calls = tuple((m, _alignment(draw, base) if m in ALIGNED else None)
                  for m in draw(st.lists(st.sampled_from(METHODS), min_size=1, max_size=3)))
    call = MetadataCall(operation, metadata, page, how, strict=strict, device=draw(st.sampled_from(("cpu", "meta"))),
                        dropped=dropped, calls=calls)
    return replace(call, page_size=_page(draw, page))  # with forms dropped and alignments invalid too


def _page(draw: st.DrawFn, page: int) -> Any:
    """The batch's page size, or (one in ten) an invalid one."""
    return draw(st.sampled_from(INVALID)) if draw(st.integers(0, 9)) == 0 else page


def pinned(ctx: Context) -> list[MetadataCall]:
    """Each broken rule through its validator and the resolver, every empty or partial form (and each with an invalid
    page size, which the resolver reports first, as before an invalid alignment), the flat CSR
    strict and not, a dense table padded to an alignment (twice: the second read from the cache), a `max_q_len`
    given equal to the batch's longest query, larger and smaller, on the note's decode batch (page 64: lengths 0, 1 and 130), and a batch with no
    live page (the native table width is then 1)."""
    from kvsim.properties.mla_backends.cases import DECODE_BATCH, BrokenMetadataCase
    from kvsim.properties.mla_backends.metadata import broken
    from kvsim.properties.mla_backends.strategies import CSR_MUTATIONS, DENSE_MUTATIONS

    base, page = DECODE_BATCH, DECODE_BATCH.page_size
    csr, dense = base.csr(), base.dense()
    out = []
    for form, mutations in (("csr", CSR_MUTATIONS), ("dense", DENSE_MUTATIONS)):
        for mutation in mutations:
            found = broken(BrokenMetadataCase(base, form, mutation))
            if found is None:
                continue
            bad, rule = found
            out.append(MetadataCall(f"validate_{form}", bad, page, rule))
            if form == "csr":  # a canonical batch is checked whole when not strict too
                out.append(MetadataCall("validate_csr", bad, page, rule, strict=False))
            out.append(MetadataCall("resolver", bad, page, rule, calls=(("resolve_csr", None),)))
            out.append(MetadataCall("resolver", bad, page, rule, calls=(("resolve_native_dense", None),)))
    flats = (_flat(csr, True), _flat(csr, False), replace(csr, kv_indptr=csr.kv_indptr[:-1]),
             replace(csr, kv_len_arr=csr.kv_len_arr[:-1]), replace(_flat(csr, True), kv_indices=csr.kv_indices[:1]))
    for flat in flats:  # FA's two, one batch array short alone (each size rule), one with short indices
        for strict in (True, False):
            out.append(MetadataCall("validate_csr", PlanMetadata(csr=flat), page, "flat", strict=strict))
            for method in ("resolve_csr", "resolve_native_dense", "resolve_dense"):
                out.append(MetadataCall("resolver", PlanMetadata(csr=flat), page, "flat", strict=strict,
                                        calls=((method, 4 if method == "resolve_dense" else None),)))
    both = PlanMetadata(csr, dense)
    for field in FIELDS + ("max_q_len",):
        out.append(MetadataCall("resolver", PlanMetadata(csr, replace(dense, max_q_len=3)), page, dropped=(field,),
                                calls=(("resolve_csr", None),)))
    out.append(MetadataCall("resolver", PlanMetadata(csr=csr, dense=replace(dense, max_q_len=3)), page,
                            dropped=DENSE_FIELDS, calls=(("resolve_csr", None),)))
    out.append(MetadataCall("resolver", PlanMetadata(), page, calls=(("resolve_csr", None),)))
    for bad_page in INVALID:
        out.append(MetadataCall("resolver", both, bad_page, calls=(("resolve_csr", None),)))
        # the resolver's order: the page size before a partial form, a missing one and an invalid alignment
        out.append(MetadataCall("resolver", both, bad_page, dropped=("kv_indices",), calls=(("resolve_csr", None),)))
        out.append(MetadataCall("resolver", PlanMetadata(), bad_page, calls=(("resolve_csr", None),)))
        out.append(MetadataCall("resolver", both, bad_page, calls=(("resolve_dense", 0),)))
    rows = PlanMetadata(dense=replace(dense, block_tables=dense.block_tables + ((0,) * dense.width,)))
    out.append(MetadataCall("validate_dense", rows, page, "batch_mismatch"))
    out.append(MetadataCall("validate_dense", PlanMetadata(dense=replace(dense, block_tables=tuple(
        r + (0,) for r in dense.block_tables), width=dense.width + 1)), page, alignment=dense.width + 1))
    for alignment in (2, 3, 4, 5):
        for device in ("cpu", "meta"):
            out.append(MetadataCall("resolver", PlanMetadata(dense=dense), page, device=device, calls=(
                ("resolve_dense", alignment), ("resolve_device_dense", alignment), ("resolve_dense", alignment))))
            out.append(MetadataCall("resolver", both, page, device=device, calls=(
                ("resolve_native_device_dense", None), ("resolve_native_device_dense", None),
                ("resolve_device_dense", alignment))))
    actual = max(b - a for a, b in zip(dense.cum_seq_lens_q, dense.cum_seq_lens_q[1:]))
    for given in (actual, 2, 5, 0, True, 2.0):  # the batch's own longest query first: the boundary is accepted
        out.append(MetadataCall("validate_dense", PlanMetadata(dense=replace(dense, max_q_len=given)), page, "max_q_len",
                                alignment=2))
    out.append(MetadataCall("validate_dense", PlanMetadata(dense=dense), page, alignment=3))
    empty = replace(base, kv_lens=(0, 0), q_lens=(1, 2))  # no live page at all: the native table is 1 wide
    for alignment in (None, 2):
        out.append(MetadataCall("dense_from_csr", PlanMetadata(empty.csr(), empty.dense()), page, alignment=alignment))
    out.append(MetadataCall("resolver", PlanMetadata(csr=empty.csr()), page, calls=(("resolve_native_dense", None),)))
    return out + boundary_calls(base)


def boundary_calls(base: Any) -> list[MetadataCall]:
    """The boundaries random batches seldom hit: invalid page sizes through each validator, a page size of 1, a
    table exactly as wide as its live pages (a length a multiple of the page, one short of it) or one page short
    (a length one past a multiple), a table of width 0 with an alignment, derivations at alignments that round,
    and dual forms that differ in one field alone (or agree, with spare indices past the live end)."""
    from kvsim.properties.mla_backends.cases import MetadataCase

    page, csr, dense = base.page_size, base.csr(), base.dense()
    out = [MetadataCall(f"validate_{form}", PlanMetadata(**{form: value}), bad, "page_size")
           for bad in INVALID for form, value in (("csr", csr), ("dense", dense))]
    unit = MetadataCase((1, 2), (2, 3), page_size=1)
    out += [MetadataCall("validate_csr", PlanMetadata(csr=unit.csr()), 1),
            MetadataCall("validate_dense", PlanMetadata(dense=unit.dense()), 1)]
    exact = MetadataCase((1, 2), (64, 63), page_size=64)
    narrow = MetadataCase((1,), (65,), page_size=64).dense()  # one page past a multiple, a table one page short
    narrow = replace(narrow, block_tables=tuple(r[:1] for r in narrow.block_tables), width=1)
    out += [MetadataCall("validate_dense", PlanMetadata(dense=exact.dense()), 64),
            MetadataCall("validate_dense", PlanMetadata(dense=narrow), 64, "table_width")]
    none = replace(base, kv_lens=(0, 0), q_lens=(1, 2), extra_width=0).dense()  # width 0
    out += [MetadataCall("validate_dense", PlanMetadata(dense=none), page, alignment=2),
            MetadataCall("resolver", PlanMetadata(dense=none), page, calls=(("resolve_dense", 2),))]
    out += [MetadataCall("dense_from_csr", PlanMetadata(csr, dense), page, alignment=a) for a in (None, 2, 4, 5)]
    duals = (PlanMetadata(csr, replace(dense, cum_seq_lens_q=dense.cum_seq_lens_q[:-1] + (dense.cum_seq_lens_q[-1] + 1,))),
             PlanMetadata(replace(csr, kv_len_arr=csr.kv_len_arr[:-1] + (csr.kv_len_arr[-1] - 1,)), dense),
             PlanMetadata(replace(csr, kv_indptr=csr.kv_indptr + csr.kv_indptr[-1:]), dense),
             PlanMetadata(replace(base, spare_indices=2).csr(), replace(base, spare_indices=2).dense()))
    out += [MetadataCall("resolver", dual, page, how, strict=False, calls=(("resolve_csr", None),))
            for dual, how in zip(duals, ("mismatch",) * 3 + ("valid",))]
    return out


# -- upstream's side ----------------------------------------------------------------------------------------

def _tensors(metadata: PlanMetadata, dropped: tuple[str, ...] = ()) -> dict[str, Any]:
    """`MLAPlanMetadata`'s eight fields: tensors, `max_q_len` as given, None where absent or dropped."""
    c, d = metadata.csr, metadata.dense
    out: dict[str, Any] = {name: None for name in FIELDS + ("max_q_len",)}
    if c is not None:
        out.update({n: int32(getattr(c, n)) for n in CSR_FIELDS})
    if d is not None:
        out.update(cum_seq_lens_q=int32(d.cum_seq_lens_q), block_tables=table(d.block_tables, d.width),
                   seq_lens=int32(d.seq_lens), max_q_len=d.max_q_len)
    return {k: None if k in dropped else v for k, v in out.items()}


def _values(t: Any) -> list[Any]:
    return t.tolist()


def csr_answer(csr: Any) -> dict[str, Any]:
    """A CSR form (upstream's tensors or the model's tuples) as lists, upstream's field names."""
    return {n: list(getattr(csr, n)) if isinstance(getattr(csr, n), tuple) else _values(getattr(csr, n))
            for n in CSR_FIELDS}


def dense_answer(dense: Any, device: str | None = None) -> dict[str, Any]:
    """A dense form as lists (the model's `DenseMetadata` or upstream's `_DensePlanMetadata`); on the meta device
    its tensors' shapes and device instead (a meta tensor has no values)."""
    if isinstance(dense, DenseMetadata):
        rows = [list(r) for r in dense.block_tables]
        if device == "meta":
            return {"device": "meta", "cum_seq_lens_q": [len(dense.cum_seq_lens_q)],
                    "block_tables": [len(rows), dense.width], "seq_lens": [len(dense.seq_lens)],
                    "max_q_len": dense.max_q_len}
        return {"cum_seq_lens_q": list(dense.cum_seq_lens_q), "block_tables": rows, "width": dense.width,
                "seq_lens": list(dense.seq_lens), "max_q_len": dense.max_q_len}
    tensors = (dense.cum_seq_lens_q, dense.block_tables, dense.seq_lens)
    if any(t.device.type == "meta" for t in tensors):
        return {"device": ",".join(sorted({t.device.type for t in tensors})),
                "cum_seq_lens_q": list(dense.cum_seq_lens_q.shape), "block_tables": list(dense.block_tables.shape),
                "seq_lens": list(dense.seq_lens.shape), "max_q_len": dense.max_q_len}
    return {"cum_seq_lens_q": _values(dense.cum_seq_lens_q), "block_tables": _values(dense.block_tables),
            "width": int(dense.block_tables.shape[1]), "seq_lens": _values(dense.seq_lens),
            "max_q_len": dense.max_q_len}


def upstream_answer(ctx: Context, call: MetadataCall) -> Any:
    import torch

    up, cpu = ctx.up, torch.device("cpu")
    raw = _tensors(call.metadata)
    if call.operation == "validate_csr":
        return csr_answer(up._validate_csr_metadata(**{n: raw[n] for n in CSR_FIELDS}, page_size=call.page_size,
                                                    device=cpu, strict=call.strict))
    if call.operation == "validate_dense":
        return dense_answer(up._validate_dense_metadata(**{n: raw[n] for n in DENSE_FIELDS + ("max_q_len",)},
                                                        page_size=call.page_size, device=cpu,
                                                        table_width_alignment=call.alignment))
    if call.operation == "csr_from_dense":
        d = call.metadata.dense
        dense = up._DensePlanMetadata(raw["cum_seq_lens_q"], raw["block_tables"], raw["seq_lens"],
                                      d.max_q_len or 0)  # type: ignore[union-attr]
        return csr_answer(up._derive_csr_from_dense(dense, page_size=call.page_size))
    if call.operation == "dense_from_csr":
        csr = up._CSRPlanMetadata(*(raw[n] for n in CSR_FIELDS))
        return dense_answer(up._derive_dense_from_csr(csr, table_width_alignment=call.alignment))
    fields = _tensors(call.metadata, call.dropped)
    resolver = getattr(up, RESOLVER)(metadata=ctx.state["metadata_cls"](**fields), page_size=call.page_size,
                                     device=torch.device(call.device), strict_csr=call.strict)
    answers = []
    for method, alignment in call.calls:
        fn = getattr(resolver, method)
        got = fn(table_width_alignment=alignment) if method in ALIGNED else fn()
        answers.append(csr_answer(got) if method == "resolve_csr" else dense_answer(got))
    return answers


# -- the model's side ---------------------------------------------------------------------------------------

MISSING = re.compile(r"missing (\[[^]]*\])")  # the model's partial form: the fields missing, as a list
UPSTREAM_MISSING = "missing required fields: "


def _named(exc: MetadataError) -> str:
    if exc.rule == "partial_form" and (found := MISSING.search(str(exc))):
        return f"{exc.rule}: {', '.join(ast.literal_eval(found.group(1)))}"
    return f"{exc.rule}:{exc.field}" if exc.rule in INDPTR_RULES else exc.rule


def name_of(message: str) -> str:
    """Upstream's message named as the model names its refusal (an indptr rule with its field, a partial form
    with the fields it misses)."""
    rule = rule_by_words(message, RULE_WORDS)
    if rule == "partial_form" and UPSTREAM_MISSING in message:
        return f"{rule}: {message.partition(UPSTREAM_MISSING)[2].rstrip('.')}"
    return f"{rule}:{message.split()[0]}" if rule in INDPTR_RULES else rule


def model_answer(ctx: Context, call: MetadataCall) -> Any:
    try:
        return _model(call)
    except MetadataError as exc:
        refuse(_named(exc))


def _model(call: MetadataCall) -> Any:
    m, page = call.metadata, call.page_size
    if call.operation == "validate_csr":
        return csr_answer(validate_csr(m.csr, page, call.strict))  # type: ignore[arg-type]
    if call.operation == "validate_dense":
        return dense_answer(validate_dense(m.dense, page, call.alignment))  # type: ignore[arg-type]
    if call.operation == "csr_from_dense":
        return csr_answer(csr_from_dense(m.dense, page))  # type: ignore[arg-type]
    if call.operation == "dense_from_csr":
        return dense_answer(dense_from_csr(m.csr, call.alignment))  # type: ignore[arg-type]
    check_fields(call.present, call.has_max_q_len, call.page_size)
    answers = []
    for method, alignment in call.calls:
        if method == "resolve_csr":
            answers.append(csr_answer(resolve_csr(m, page, call.strict)))
            continue
        if method in ALIGNED:
            check_alignment(alignment)  # upstream's resolve_dense takes no None: the native width is another method
        dense = resolve_dense(m, page, alignment, call.strict)
        answers.append(dense_answer(dense, call.device if "device" in method else None))
    return answers


def describe(ctx: Context, call: MetadataCall) -> dict[str, Any]:
    m = call.metadata
    shown: dict[str, Any] = {"operation": call.operation, "made": call.how, "page_size": call.page_size}
    if m.csr is not None:
        shown["csr"] = {n: list(getattr(m.csr, n)) for n in CSR_FIELDS}
    if m.dense is not None:
        shown["dense"] = {"cum_seq_lens_q": list(m.dense.cum_seq_lens_q), "block_tables": [list(r) for r in
                                                                                         m.dense.block_tables],
                          "seq_lens": list(m.dense.seq_lens), "max_q_len": m.dense.max_q_len}
    if call.operation in ("validate_dense", "dense_from_csr"):
        shown["table_width_alignment"] = call.alignment
    if call.operation in ("validate_csr", "resolver"):
        shown["strict"] = call.strict
    if call.operation == "resolver":
        shown.update(device=call.device, dropped=list(call.dropped), calls=[list(c) for c in call.calls])
    return shown


def prepare(ctx: Context) -> None:
    """The release's `MLAPlanMetadata` (the resolver reads its eight fields by name)."""
    found = getattr(ctx.up, "MLAPlanMetadata", None)
    if found is None:
        raise ConfigError(f"{MLA}/_contracts.py:MLAPlanMetadata", "a dataclass", f"absent in {ctx.source.label}")
    ctx.state["metadata_cls"] = found


def loading(upstream: Any, up: Any) -> dict[str, Any]:
    """The planning file raises the capabilities file's typed signal (its import is not followed)."""
    if upstream.file == PLANNING:
        return {"extra_globals": {"_BackendPlanUnsupportedError": up._BackendPlanUnsupportedError}}
    return {}


METADATA = Differential(
    loading=loading, prepare=prepare, inputs=lambda ctx: metadata_calls(), pinned=pinned, model=model_answer,
    upstream=upstream_answer,
    describe=describe, compare=NamedRefusals(refusals=("ValueError", "_BackendPlanUnsupportedError"), name_of=name_of))
