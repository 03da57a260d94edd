"""SGLang's destination-KV selection for a PP prefill stage against `pd-protocol`'s `mori_layout`: two differentials.

Two upstream functions choose which decode entries a prefill stage's K and V go to when the pools publish no
layer ids (plain MHA): `MoriKVManager._get_mha_mem_desc_slices` (`mori/conn.py`) and
`CommonKVManager.get_mha_kv_ptrs_with_pp` (`common/conn.py`, used by Mooncake and NIXL). Each runs as upstream
wrote it, on a stand-in `self` (`kv_mem_descs` / `kv_args.prefill_start_layer` / `kv_args.kv_layer_ids`), with
descriptors and pointers given as their own list indices, so what comes back is the selection itself: all five
returned values (source K and V, destination K and V, the stage's layer count) compared by name.

* `MORI_SELECTION` (`_get_mha_mem_desc_slices`): pinned first, the exhaustive domain of stage sizes n 1..6, start
  layers 0..12 and destination lists of 0..36 entries, after a prefill with no descriptors (n 0: upstream's
  RuntimeError, its ValueError where the model refuses the stage, are the model's refusals); then
  the property's cases (`LAYOUT_CASES`, `LAYOUT_CASES_ANY_DRAFT`, MHA only), with layer ids where the pools
  publish them (0.5.22+: the layer-id branch, with upstream's own `resolve_dcp_dst_entry_indices`).
* `COMMON_SELECTION` (`get_mha_kv_ptrs_with_pp`): the same exhaustive domain, then `COMMON_LAYOUT_CASES`; a case whose
  pools publish layer ids is paired by upstream's `build_transfer_entry_pairs`, as Mooncake does, against the
  model's `pair_by_layer_id` (on the pairings of whole, two-sided id lists the model states: the helper's
  refusals and positional fallback are not modelled, so it is driven, not counted as checked; a release without
  it, 0.5.13-0.5.16, pairs positionally: its id cases are compared as such).

The pairing helpers of `disaggregation/utils.py` are loaded in `prepare` where the release has them (not declared:
0.5.13 lacks them, and the targets check the two selection functions).

The V-offset property (`properties.pd_protocol.layout.check_chosen`) runs with upstream's selection in the
model's place on every property case (checks `layout_selects_main_kv` on the cases of `LAYOUT_CASES`' space,
`layout_selects_main_kv_any_draft` and `common_rule_selects_main_kv` on all), shrunk by Hypothesis; the note
adds the research note's case (32 layers, PP 3, one EAGLE layer), stage by stage. Statuses: a check failing
where the catalog already holds an open-upstream finding is `finding confirmed` (the target still conforms);
the property of a seed bug failing before its fix is `fails` (the target diverges there, as every seed bug's
pre-fix side does in the release table). The wide-draft finding is about PR #35281's V-offset rule: before it
(`pre_35281`) its check is not run (the main property fails there: the seed bug).

Survivors (documented in the declarations, equivalent on every input a PP stage makes): the source list's length
halved with ceiling division (it is even), the layer-id clauses with one peer's ids only (outside the model: ids
on both sides or neither), Mori's length guard (implied by `end_layer > dst_total_layers`), and the draft-layout
test's clauses (either alone decides alike).

Release -> model variant (the Mori declaration's table): before 0.5.19 `pre_35281` (the half split),
0.5.19-0.5.21 `fixed`, 0.5.22+ and a tree with no version `sglang_0_5_23` (layer-id pairing). The common rule is
the same in every release from 0.5.13 to 0.5.23. Whether Mori takes the destination's layer ids is read from the
method's signature (`prepare`).
"""

from __future__ import annotations

import inspect
from itertools import product
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.answers import FAILED, capture
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.pd_protocol.mori_layout import (LayoutCase, Selection, chosen_descriptors, layer_id,
                                                  pair_by_layer_id, select, select_common_mha_ptrs,
                                                  select_dst_descriptors)
from kvsim.properties.pd_protocol.cases import EAGLE_UNEVEN_CASES
from kvsim.properties.pd_protocol.layout import check_chosen

from ..loader import check_signature, load_definitions, names_in

MORI = "sglang/srt/disaggregation/mori/conn.py"
CONN = "sglang/srt/disaggregation/common/conn.py"
UTILS = "sglang/srt/disaggregation/utils.py"
PAIRING = ("build_transfer_entry_pairs", "resolve_dcp_dst_entry_indices")
DOMAIN = (range(1, 7), range(0, 13), range(0, 37))  # n, start layer, destination entries
WIDE_FINDING = "sglang-pr35281-mori-wide-draft-layout"
COMMON_FINDING = "sglang-common-mha-pp-v-offset"
# Mori: "Destination KV descriptors do not match prefill pp configuration", "KV memory descriptors are empty"
REFUSED = Exact(refusals=("ValueError", "RuntimeError"))


class StructStandIn:
    """`msgspec.Struct` stand-in: class keywords (`frozen=True`) accepted, nothing else."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()


def msgspec_stand_in() -> dict[str, Any]:
    """The loader's `modules` for a connection file (its message classes derive from `msgspec.Struct`)."""
    return {"msgspec": SimpleNamespace(Struct=StructStandIn)}


def method(ctx: Context, cls_name: str, name: str, relpath: str) -> Any:
    """Upstream's `cls_name.name`, unbound (called with a stand-in `self`)."""
    fn = vars(getattr(ctx.up, cls_name)).get(name)
    if not callable(fn):
        raise ConfigError(f"{relpath}:{cls_name}.{name}", "a method", f"absent in {ctx.source.label}")
    return fn


# -- the inputs ---------------------------------------------------------------------------------------------------

def raw_domain(ctx: Context) -> list[dict[str, int]]:
    """The exhaustive domain, smallest first: (n, start layer, destination entries)."""
    return [{"n": n, "start_layer": s, "dst_len": d} for n, s, d in product(*DOMAIN)]


def mori_domain(ctx: Context) -> list[dict[str, int]]:
    """Mori's domain: a prefill with no KV descriptors first (upstream's RuntimeError), then the common one."""
    return [{"n": 0, "start_layer": 0, "dst_len": d} for d in DOMAIN[2]] + raw_domain(ctx)


def mha(strategy: Any) -> Any:
    return strategy.filter(lambda c: c.attention == "mha")  # Mori's MLA slicing is another function


def shape(case: Any) -> tuple[int, int, int]:
    """(n, start layer, destination entries) of a domain case or a LayoutCase."""
    if isinstance(case, LayoutCase):
        return case.local_layers, case.start_layer, len(case.destination())
    return case["n"], case["start_layer"], case["dst_len"]


def case_ids(case: Any) -> tuple[list[int], list[int]] | None:
    if not isinstance(case, LayoutCase) or not case.layer_ids:
        return None
    return ([layer_id(d, case.num_layers) for d in case.source()],
            [layer_id(d, case.num_layers) for d in case.destination()])


def describe(ctx: Context, case: Any) -> Any:
    return case.__canon__() if isinstance(case, LayoutCase) else case


def answer(n: int, k: Any, v: Any, src: tuple[Any, Any] | None = None, layers: Any = None) -> dict[str, Any]:
    src_k, src_v = src if src is not None else (range(n), range(n, 2 * n))  # the prefill's list, split in half
    return {"src_k": list(src_k), "src_v": list(src_v), "dst_k": list(k), "dst_v": list(v),
            "layers": n if layers is None else layers}


def refuse(sel: Selection) -> None:
    if sel.refused:
        raise ConfigError("destination", "KV descriptors matching the prefill PP configuration", sel.refused)


def pairing_helpers(ctx: Context) -> dict[str, Any]:
    """Upstream's layer-id pairing helpers (`disaggregation/utils.py`), where the release has them (0.5.17+; Mori
    calls them from 0.5.22, Mooncake pairs by id with the first)."""
    if not ctx.source.has(UTILS):
        return {}
    names = [n for n in PAIRING if n in names_in(ctx.source.file(UTILS))]
    if not names:
        return {}
    return vars(load_definitions(ctx.source.file(UTILS), names, where=UTILS, version=ctx.source.label))


# -- Mori -------------------------------------------------------------------------------------------------------

def mori_prepare(ctx: Context) -> None:
    fn = ctx.state["mori"] = method(ctx, "MoriKVManager", "_get_mha_mem_desc_slices", MORI)
    fn.__globals__.update(pairing_helpers(ctx))
    ctx.state["ids"] = "dst_kv_layer_ids" in inspect.signature(fn).parameters  # 0.5.22+
    check_signature(fn, ("self", "dst_mem_descs") + (("dst_kv_layer_ids",) if ctx.state["ids"] else ()),
                    f"{MORI}:MoriKVManager._get_mha_mem_desc_slices")


def mori_model(ctx: Context, case: Any) -> dict[str, Any]:
    n, start, dst_len = shape(case)
    if n == 0:
        raise ConfigError("kv_mem_descs", "a prefill stage with KV descriptors", "none")
    if isinstance(case, LayoutCase):
        sel = select(case, ctx.variant)
    else:
        sel = select_dst_descriptors(n, dst_len, start, attention="mha", variant=ctx.variant)
    refuse(sel)
    return answer(n, sel.k, sel.v)


def mori_upstream(ctx: Context, case: Any) -> dict[str, Any]:
    n, start, dst_len = shape(case)
    ids = case_ids(case) if ctx.state["ids"] else None
    me = SimpleNamespace(kv_mem_descs=list(range(2 * n)),
                         kv_args=SimpleNamespace(prefill_start_layer=start, kv_layer_ids=ids[0] if ids else None))
    args: tuple[Any, ...] = (me, list(range(dst_len)))
    if ctx.state["ids"]:
        args += (ids[1] if ids else None,)
    src_k, src_v, k, v, layers = ctx.state["mori"](*args)
    return answer(n, k, v, (src_k, src_v), layers)


# -- common/conn.py -----------------------------------------------------------------------------------------------

def common_prepare(ctx: Context) -> None:
    fn = ctx.state["common"] = method(ctx, "CommonKVManager", "get_mha_kv_ptrs_with_pp", CONN)
    ctx.state["pairs"] = pairing_helpers(ctx).get("build_transfer_entry_pairs")
    check_signature(fn, ("self", "src_kv_ptrs", "dst_kv_ptrs"), f"{CONN}:CommonKVManager.get_mha_kv_ptrs_with_pp")


def common_ids(ctx: Context, case: Any) -> tuple[list[int], list[int]] | None:
    """The case's layer ids where the release pairs by them (none before `build_transfer_entry_pairs`)."""
    return case_ids(case) if ctx.state["pairs"] is not None else None


def common_model(ctx: Context, case: Any) -> dict[str, Any]:
    n, start, dst_len = shape(case)
    ids = common_ids(ctx, case)
    if ids is not None:  # Mooncake and NIXL pair by id (build_transfer_entry_pairs) and skip the rule
        pairs = pair_by_layer_id(*ids)
        return {"dst_k": list(pairs[:n]), "dst_v": list(pairs[n:])}
    sel = select_common_mha_ptrs(n, dst_len, start)
    return answer(n, sel.k, sel.v)


def common_upstream(ctx: Context, case: Any) -> dict[str, Any]:
    n, start, dst_len = shape(case)
    ids = common_ids(ctx, case)
    if ids is not None:
        pairs = [j for _, j in ctx.state["pairs"](ids[0], ids[1], 2 * n, dst_len)]
        return {"dst_k": pairs[:n], "dst_v": pairs[n:]}
    me = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=start))
    src_k, src_v, k, v, layers = ctx.state["common"](me, list(range(2 * n)), list(range(dst_len)))
    return answer(n, k, v, (src_k, src_v), layers)


# -- the V-offset property on upstream's selection --------------------------------------------------------------------

def violation(ctx: Context, case: LayoutCase, got: dict[str, Any]) -> str:
    """'' when upstream's selection gives local layer l the main K and V of global layer s + l, else why not."""
    try:
        check_chosen(case, chosen_descriptors(case, ctx.variant, selection=Selection(tuple(got["dst_k"]),
                                                                                    tuple(got["dst_v"]))))
    except PropertyViolation as exc:
        return str(exc)
    return ""


def in_main_space(case: LayoutCase) -> bool:
    """A case of `LAYOUT_CASES`' space: an even split, no layer ids, fewer draft layers than the stage has."""
    return (not case.partition and not case.layer_ids and case.num_layers == case.local_layers * case.pp_size
            and case.draft_layers < case.local_layers)


def selects_main_kv(applies: Any) -> Any:
    def check(ctx: Context, case: Any, got: dict[str, Any]) -> None:
        if isinstance(case, LayoutCase) and applies(ctx, case):
            why = violation(ctx, case, got)
            if why:
                raise PropertyViolation(why)
    return check


def eagle_note(ctx: Context, rule: str) -> str:
    """The research note's case (32 layers, prefill PP 3, one EAGLE layer) on every stage, upstream's selection."""
    cases = [c for c in EAGLE_UNEVEN_CASES if c.rule == rule]
    run = mori_upstream if rule == "mori" else common_upstream
    wrong = []
    for case in cases:
        got = capture(run, ctx, case)
        if isinstance(got, FAILED) or violation(ctx, case, got):
            wrong.append(case.stage)
    return f"32 layers, prefill PP 3, 1 draft layer: stages {wrong} of 0-{len(cases) - 1} wrong"


def mori_note(ctx: Context) -> str:
    branch = "the layer-id branch (dst_kv_layer_ids)" if ctx.state.get("ids") else "no layer-id branch"
    skipped = "; the wide-draft check not run (no V-offset rule before PR #35281)" \
        if ctx.variant.name == "pre_35281" else ""
    return (f"model variant {ctx.variant.name}; exhaustive n 1-6, start 0-12, 0-36 entries pinned, then the "
            f"property's cases; {branch}{skipped}; {eagle_note(ctx, 'mori')}")


def mori_cases(ctx: Context) -> Any:
    from kvsim.properties.pd_protocol.strategies import LAYOUT_CASES, LAYOUT_CASES_ANY_DRAFT

    return st.one_of(mha(LAYOUT_CASES), mha(LAYOUT_CASES_ANY_DRAFT))


def common_cases(ctx: Context) -> Any:
    from kvsim.properties.pd_protocol.strategies import COMMON_LAYOUT_CASES

    return COMMON_LAYOUT_CASES


def with_msgspec(upstream_file: Any, up: SimpleNamespace) -> dict[str, Any]:
    return {"modules": msgspec_stand_in()}


def after_the_rule(ctx: Context, case: LayoutCase) -> bool:
    """The wide-draft finding is about PR #35281's V-offset rule: not run before it (the seed bug fails there)."""
    return ctx.variant.name != "pre_35281"


MORI_SELECTION = Differential(
    loading=with_msgspec, prepare=mori_prepare, pinned=mori_domain, inputs=mori_cases,
    model=mori_model, upstream=mori_upstream, describe=describe, compare=REFUSED,
    checks=(Check("layout_selects_main_kv", selects_main_kv(lambda ctx, case: in_main_space(case))),
            Check("layout_selects_main_kv_any_draft", selects_main_kv(after_the_rule), finding=WIDE_FINDING)),
    note=mori_note)

COMMON_SELECTION = Differential(
    loading=with_msgspec, prepare=common_prepare, pinned=raw_domain, inputs=common_cases,
    model=common_model, upstream=common_upstream, describe=describe,
    checks=(Check("common_rule_selects_main_kv", selects_main_kv(lambda ctx, case: True), finding=COMMON_FINDING),),
    note=lambda ctx: (f"exhaustive n 1-6, start 0-12, 0-36 entries pinned, then the property's cases (layer-id "
                      f"cases paired by build_transfer_entry_pairs); the same rule in every release 0.5.13-0.5.23; "
                      f"{eagle_note(ctx, 'common')}"))
