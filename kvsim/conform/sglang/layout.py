"""SGLang's destination-KV selection for a PP prefill stage against `pd-protocol`'s `mori_layout`.

Two upstream functions choose which decode entries a prefill stage's K and V go to when the pools
publish no layer ids (plain MHA): `MoriKVManager._get_mha_mem_desc_slices` (`mori/conn.py`) and
`CommonKVManager.get_mha_kv_ptrs_with_pp` (`common/conn.py`, used by Mooncake and NIXL). Each runs
as upstream wrote it, on a stand-in `self` (`kv_mem_descs` / `kv_args.prefill_start_layer` /
`kv_args.kv_layer_ids`), with descriptors and pointers given as their own list indices, so what
comes back is the selection itself. Mori's layer-id branch (0.5.22+) runs with upstream's own
`resolve_dcp_dst_entry_indices` and `build_transfer_entry_pairs` (`disaggregation/utils.py`); the
common target pairs layer-id cases with upstream's `build_transfer_entry_pairs`, as Mooncake does.

Per target:
(a) a differential, exhaustive over stage sizes n 1..6, start layers 0..12 and destination lists of
0..36 entries (Mori: whether it selects or refuses with ValueError, and the K and V indices), plus
the layer-id cases of the property's strategy (Mori 0.5.22+);
(b) the V-offset property (`properties.pd_protocol.layout.check_chosen`) with upstream's selection in
the model's place: over the model's strategy (shrunk by Hypothesis) and on the research note's case
(32 layers, PP 3, one EAGLE layer), stage by stage.

Statuses: a property that fails on the release where the catalog already holds it as an open-upstream
finding is `finding confirmed` (the finding reproduced on the real code: the target still conforms,
so `kvsim conform sglang` stays at exit 0); the property of a seed bug failing before its fix is
`fails` (the target diverges there, as every seed bug's pre-fix side does in the release table).
Release -> model variant (`mori_variant`): before 0.5.19 `pre_35281` (the half split), 0.5.19-0.5.21
`fixed`, 0.5.22+ and a tree with no version `sglang_0_5_23` (layer-id pairing). The common rule is
the same in every release from 0.5.13 to 0.5.23.
"""

from __future__ import annotations

import inspect
import re
import time
from itertools import product
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Callable

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.pd_protocol.mori_layout import (LayoutCase, Selection, chosen_descriptors, layer_id,
                                                  pair_by_layer_id, select, select_common_mha_ptrs,
                                                  select_dst_descriptors)
from kvsim.models.pd_protocol.variants import VARIANTS, ProtocolVariant
from kvsim.properties.pd_protocol.cases import EAGLE_UNEVEN_CASES
from kvsim.properties.pd_protocol.layout import check_chosen

from ..loader import check_signature, load_definitions, names_in
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive

MORI = "sglang/srt/disaggregation/mori/conn.py"
CONN = "sglang/srt/disaggregation/common/conn.py"
UTILS = "sglang/srt/disaggregation/utils.py"
MORI_RULE_SINCE = (0, 5, 19)  # PR #35281's V-offset rule (0.5.18 still splits in half)
MORI_LAYER_IDS_SINCE = (0, 5, 22)  # Mori pairs by layer id when either peer publishes ids
FINDING = "finding confirmed"  # an open-upstream finding's property failing on the release, as the catalog says
DOMAIN = (range(1, 7), range(0, 13), range(0, 37))  # n, start layer, destination entries
WIDE_FINDING = "sglang-pr35281-mori-wide-draft-layout"
COMMON_FINDING = "sglang-common-mha-pp-v-offset"


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3]) if version else None


def mori_variant(version: str | None) -> ProtocolVariant:
    """The pd-protocol variant whose Mori selection a release follows (no version: a working tree, the newest)."""
    nums = version_tuple(version)
    if nums is None or nums >= MORI_LAYER_IDS_SINCE:
        return VARIANTS["sglang_0_5_23"]
    return VARIANTS.fixed if nums >= MORI_RULE_SINCE else VARIANTS["pre_35281"]


class StructStandIn:
    """`msgspec.Struct` stand-in: class keywords (`frozen=True`) accepted, nothing else."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()


def load_method(source: EngineSource, relpath: str, cls_name: str, method: str,
                extra: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Upstream's `cls_name.method`, unbound (called with a stand-in `self`)."""
    cls = getattr(load_definitions(source.file(relpath), [cls_name], where=relpath, version=source.label,
                                   modules={"msgspec": SimpleNamespace(Struct=StructStandIn)},
                                   extra_globals=extra or {}), cls_name)
    fn = vars(cls).get(method)
    if not callable(fn):
        raise ConfigError(f"{relpath}:{cls_name}.{method}", "a method", f"absent in {source.label}")
    return fn


def pairing_helpers(source: EngineSource) -> dict[str, Any]:
    """Upstream's layer-id pairing helpers, where the release has them (0.5.18+; Mori calls them from 0.5.22)."""
    names = [n for n in ("build_transfer_entry_pairs", "resolve_dcp_dst_entry_indices")
             if source.has(UTILS) and n in names_in(source.file(UTILS))]
    return vars(load_definitions(source.file(UTILS), names, where=UTILS, version=source.label)) if names else {}


def case_ids(case: LayoutCase) -> tuple[list[int], list[int]]:
    return ([layer_id(d, case.num_layers) for d in case.source()],
            [layer_id(d, case.num_layers) for d in case.destination()])


class Upstream:
    """The release's two selection functions on stand-in managers, returning model `Selection`s."""

    def __init__(self, source: EngineSource) -> None:
        helpers = pairing_helpers(source)
        self.mori = load_method(source, MORI, "MoriKVManager", "_get_mha_mem_desc_slices", helpers)
        self.mori_ids = "dst_kv_layer_ids" in inspect.signature(self.mori).parameters  # 0.5.22+
        check_signature(self.mori, ("self", "dst_mem_descs") + (("dst_kv_layer_ids",) if self.mori_ids else ()),
                        f"{MORI}:MoriKVManager._get_mha_mem_desc_slices")
        self.common = load_method(source, CONN, "CommonKVManager", "get_mha_kv_ptrs_with_pp")
        check_signature(self.common, ("self", "src_kv_ptrs", "dst_kv_ptrs"),
                        f"{CONN}:CommonKVManager.get_mha_kv_ptrs_with_pp")
        self.pairs = helpers.get("build_transfer_entry_pairs")

    def mori_select(self, n: int, dst_len: int, start: int, ids: tuple[list[int], list[int]] | None = None) -> Selection:
        me = SimpleNamespace(kv_mem_descs=list(range(2 * n)),
                             kv_args=SimpleNamespace(prefill_start_layer=start, kv_layer_ids=ids[0] if ids else None))
        args: tuple[Any, ...] = (me, list(range(dst_len)))
        if self.mori_ids:
            args += (ids[1] if ids else None,)
        try:
            _, _, k, v, _ = self.mori(*args)
        except (ValueError, RuntimeError) as exc:
            return Selection((), (), str(exc))
        return Selection(tuple(k), tuple(v))

    def common_select(self, n: int, dst_len: int, start: int) -> Selection:
        me = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=start))
        _, _, k, v, _ = self.common(me, list(range(2 * n)), list(range(dst_len)))
        return Selection(tuple(k), tuple(v))

    def select(self, case: LayoutCase, variant: ProtocolVariant) -> Selection:
        """What the release selects for a case: by layer id where it pairs by id, else its positional rule."""
        n, dst_len = case.local_layers, len(case.destination())
        ids = case_ids(case) if case.layer_ids else None
        if case.rule == "common":
            if ids is not None and self.pairs is not None:  # Mooncake: build_transfer_entry_pairs, not the rule
                pairs = tuple(j for _, j in self.pairs(ids[0], ids[1], 2 * n, dst_len))
                return Selection(pairs[:n], pairs[n:])
            return self.common_select(n, dst_len, case.start_layer)
        return self.mori_select(n, dst_len, case.start_layer, ids if self.mori_ids else None)


class Violated(AssertionError):
    """The property failed on upstream's selection (raised from one place, so Hypothesis sees one failure)."""


def _as_row(sel: Selection) -> list[Any]:
    return [list(sel.k), None if sel.v is None else list(sel.v), bool(sel.refused)]


def run_property(result: TargetResult, name: str, strategy: Any, up: Upstream, variant: ProtocolVariant,
                 options: RunOptions, finding: str | None, pinned: tuple[LayoutCase, ...] = ()) -> None:
    """The V-offset property with upstream's selection in the model's place; the shrunk case and the pinned cases."""
    state: dict[str, Any] = {"last": None, "first_s": None}
    started = time.perf_counter()

    def check(case: LayoutCase) -> None:
        sel = up.select(case, variant)
        try:
            check_chosen(case, chosen_descriptors(case, variant, selection=sel), sel.refused)
        except PropertyViolation as exc:
            state["last"] = (case, str(exc))
            if state["first_s"] is None:
                state["first_s"] = round(time.perf_counter() - started, 3)
            failure = Violated(str(exc))
        else:
            return
        raise failure  # one raise site: Hypothesis shrinks every violation as one failure

    try:
        drive(strategy, check, options, shrink=True)
    except Violated:
        pass
    shrunk, first_s = state["last"], state["first_s"]
    wrong = []
    for case in pinned:
        try:
            check(case)
        except Violated:
            wrong.append(case.stage)
    if shrunk is None and not wrong:
        result.prop(name, "holds")
        return
    text = [f"open upstream finding {finding}" if finding else ""]
    if shrunk is not None:
        text.append(f"shrunk case {shrunk[0].__canon__()} ({shrunk[1]}), first counterexample after {first_s} s")
    if pinned:
        text.append(f"32 layers, prefill PP 3, 1 draft layer: stages {wrong} of 0-2 wrong")
    result.prop(name, FINDING if finding else "fails", "; ".join(t for t in text if t))


def differential(result: TargetResult, model: Callable[[int, int, int], Selection],
                 upstream: Callable[[int, int, int], Selection]) -> None:
    for n, start, dst_len in product(*DOMAIN):
        want, got = model(n, dst_len, start), upstream(n, dst_len, start)
        result.compared += 1
        if _as_row(want) != _as_row(got):
            result.diverge({"n": n, "start_layer": start, "dst_len": dst_len}, _as_row(want), _as_row(got))


def run_mori(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.pd_protocol.strategies import LAYOUT_CASES, LAYOUT_CASES_ANY_DRAFT

    started = time.perf_counter()
    up, variant = Upstream(source), mori_variant(source.version)
    result = TargetResult("_get_mha_mem_desc_slices", source.version)
    differential(result, lambda n, d, s: select_dst_descriptors(n, d, s, attention="mha", variant=variant),
                 up.mori_select)
    id_cases = 0
    if up.mori_ids:  # the layer-id branch, on the property's cases with pools that publish ids
        def compare(case: LayoutCase) -> None:
            nonlocal id_cases
            want, got = select(case, variant), up.select(case, variant)
            result.compared += 1
            id_cases += 1
            if _as_row(want) != _as_row(got):
                result.diverge({"case": case.__canon__()}, _as_row(want), _as_row(got), "layer-id pairing")

        drive(LAYOUT_CASES_ANY_DRAFT.filter(lambda c: c.attention == "mha").map(
            lambda c: replace(c, layer_ids=True)), compare, options, max_examples=min(options.max_examples, 100))
    mha = lambda s: s.filter(lambda c: c.attention == "mha")  # noqa: E731 - Mori's MLA slicing is not this function
    old = variant.name == "pre_35281"
    run_property(result, "layout_selects_main_kv", mha(LAYOUT_CASES), up, variant, options, None)
    run_property(result, "layout_selects_main_kv_any_draft", mha(LAYOUT_CASES_ANY_DRAFT), up, variant, options,
                 None if old else WIDE_FINDING, EAGLE_UNEVEN_CASES[:3])
    result.note = (f"model variant {variant.name}; exhaustive n 1-6, start 0-12, 0-36 entries"
                   + (f"; {id_cases} layer-id cases" if id_cases else "; no layer-id branch in this release"))
    return result.finish(started)


def run_common(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.pd_protocol.strategies import COMMON_LAYOUT_CASES

    started = time.perf_counter()
    up, variant = Upstream(source), mori_variant(source.version)
    result = TargetResult("get_mha_kv_ptrs_with_pp", source.version)
    differential(result, select_common_mha_ptrs, up.common_select)
    if up.pairs is not None:  # the pairing Mooncake uses instead when the pools publish ids
        for case in (LayoutCase(8, 2, s, d, False, "mha", layer_ids=True, rule="common")
                     for s in range(2) for d in range(4)):
            ids = case_ids(case)
            want = pair_by_layer_id(*ids)
            got = tuple(j for _, j in up.pairs(ids[0], ids[1], len(ids[0]), len(ids[1])))
            result.compared += 1
            if want != got:
                result.diverge({"case": case.__canon__()}, list(want), list(got), "build_transfer_entry_pairs")
    run_property(result, "common_rule_selects_main_kv", COMMON_LAYOUT_CASES, up, variant, options, COMMON_FINDING,
                 EAGLE_UNEVEN_CASES[3:])
    result.note = "exhaustive n 1-6, start 0-12, 0-36 entries; the same rule in every release 0.5.13-0.5.23"
    return result.finish(started)


TARGETS = (
    Target("sglang", "_get_mha_mem_desc_slices", MORI, ("MoriKVManager",), "pd-protocol",
           "Mori's K/V destination descriptors for a PP stage (exhaustive differential, layer-id branch), and the "
           "V-offset property on upstream's selection", run_mori),
    Target("sglang", "get_mha_kv_ptrs_with_pp", CONN, ("CommonKVManager",), "pd-protocol",
           "the common K/V destination pointers for plain MHA (Mooncake, NIXL): exhaustive differential, and the "
           "V-offset property on upstream's selection", run_common),
)
