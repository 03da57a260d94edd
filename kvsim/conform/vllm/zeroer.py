"""vLLM `KVBlockZeroer` segment planning (`vllm/v1/worker/utils.py`) against the `kv-zeroing` model.

Upstream's real `KVBlockZeroer.__init__` plans the segment table for CPU tensors that are views of
one torch byte buffer laid out as the model's `Arena`; its `_meta` (addresses, block strides, pages,
chunks, BLOCK_SIZE, segments) is compared with the model's `plan_segments` + `launch_config`, and
every kv-zeroing property is run with upstream's plan in the model planner's place.

Adapter conventions:
* addresses: upstream's `data_ptr()` minus the buffer's base = the model's arena offsets;
* stand-ins: one `AttentionGroup` per (KV-cache group, block dim) in view order (vLLM has one per
  backend), a non-attention spec for Mamba views, `get_kv_cache_block_dim` returns the view's;
* 0.33.0 takes standardized views (block dim first) and derives the ratio as `shape[0] // num_blocks`:
  the adapter permutes the block dim to the front and passes the geometry's logical block count;
* before d6af803 (0.27.1) a segment has no stride: the page doubles as it;
* segments are compared as sorted rows (their order does not change what is written).

Release -> model variant: 0.27.1 `pre_d6af803`; 0.28.x-0.32.x `fixed` without the overlaid-segment
merge (variant `first_view_overlaid`: it skips a view whose data_ptr was seen, so overlaid groups keep the
first view's page);
0.33.0 and later (and a `--from` tree of unknown version) `fixed`.

Settled: the model's fixed planner asserted a page-within-stride check that no release has. Upstream's
outer-dimension test (stride > block stride) sees K/V as inner when a view has a single kernel block
(K/V stride == block stride), so its page spans K and V of that block; the model refused those dense
layouts. The check is gone from the model (and property 2.4.4 allows it for one kernel block).
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from kvsim.engine.errors import ConfigError, PropertyViolation
import numpy as np

from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry, view_start
from kvsim.models.kv_zeroing.zeroer import VARIANTS, Segment, SegmentTable, ZeroingVariant, launch_config, plan_segments

from ..loader import load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive

RELPATH = "vllm/v1/worker/utils.py"
PRE_MERGE = VARIANTS["first_view_overlaid"]  # 0.28.0 .. 0.32.x
DTYPES = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


RATIO_SHAPE = ("views whose kernel-block count is not num_blocks x block_size/kernel_block_size (0.33.0 derives "
               "the ratio from the view, shape[0] // num_blocks, and its allocator builds no such view; the model "
               "refuses them)")


def whole_logical_blocks(geometry: KVCacheGeometry) -> bool:
    """Every attention view holds exactly num_blocks x ratio kernel blocks (what 0.33.0's allocator builds)."""
    n = geometry.num_blocks
    return all(v.shape[v.block_dim] == n * geometry.groups[v.group].ratio for _, v in geometry.attention_views())


def release_variant(version: str | None) -> ZeroingVariant:
    """The model variant a release follows (unknown or newer: `fixed`)."""
    if not version:
        return VARIANTS.fixed
    nums = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    if nums < (0, 28, 0):
        return VARIANTS["pre_d6af803"]
    if nums < (0, 33, 0):
        return PRE_MERGE
    return VARIANTS.fixed


class AttentionSpec:
    """Stand-in for vLLM's AttentionSpec / FullAttentionSpec (the zeroer's isinstance test)."""

    def __init__(self, block_size: int) -> None:
        self.block_size, self.num_kv_heads, self.head_size = block_size, 1, 1


class MambaSpec:
    """A non-attention spec: the zeroer skips its layers."""

    block_size = 1


@dataclass
class Upstream:
    """The loaded `KVBlockZeroer` class and which constructor shape the release has."""

    cls: type
    takes_num_blocks: bool  # 0.33.0: (device, groups, kernel_block_sizes, static_forward_context, num_blocks, ...)
    has_strides: bool       # d6af803: `_meta` carries seg_block_strides


def load(source: EngineSource) -> Upstream:
    import inspect
    ns = load_definitions(source.file(RELPATH), ["KVBlockZeroer"], where=RELPATH, version=source.label,
                          extra_globals={"AttentionSpec": AttentionSpec, "FullAttentionSpec": AttentionSpec})
    params = list(inspect.signature(ns.KVBlockZeroer.__init__).parameters)
    need = {"device", "attn_groups_iter", "kernel_block_sizes", "static_forward_context"}
    if not need <= set(params):
        raise ConfigError(f"{RELPATH}:KVBlockZeroer.__init__", f"parameters including {', '.join(sorted(need))}",
                          f"({', '.join(params[1:])})", hint="the upstream signature changed")
    text = inspect.getsource(ns.KVBlockZeroer.__init__)
    return Upstream(ns.KVBlockZeroer, "num_blocks" in params, "seg_block_strides" in text)


def upstream_table(up: Upstream, geometry: KVCacheGeometry, arena: Arena, variant: ZeroingVariant
                   ) -> tuple[SegmentTable, tuple[int, int, int]] | AssertionError:
    """Upstream's plan as a model `SegmentTable` plus its (BLOCK_SIZE, max_chunks, n_segs), or its refusal."""
    import torch
    buf = torch.zeros(arena.size, dtype=torch.uint8)
    base = buf.data_ptr()
    groups: dict[tuple, SimpleNamespace] = {}
    context: dict[str, SimpleNamespace] = {}
    for view in geometry.views:
        el = view.element_size
        typed = buf.view(getattr(torch, DTYPES[el]))
        kv = typed.as_strided(view.shape, view.strides, (arena.bases[view.allocation] + view.offset) // el)
        if up.takes_num_blocks:  # standardized [B, ...] views: block dim first
            kv = kv.movedim(view.block_dim, 0)
        context[view.layer] = SimpleNamespace(kv_cache=kv)
        key = (view.kind, view.group, view.block_dim)
        if key not in groups:
            g = geometry.groups[view.group]
            spec = AttentionSpec(g.block_size) if view.kind == "attention" else MambaSpec()
            groups[key] = SimpleNamespace(
                kv_cache_spec=spec, kv_cache_group_id=view.group, layer_names=[], kernel_block_stride=0,
                backend=SimpleNamespace(get_kv_cache_block_dim=lambda *a, _d=view.block_dim, **k: _d))
        groups[key].layer_names.append(view.layer)
    kwargs: dict[str, Any] = {"device": torch.device("cpu"), "attn_groups_iter": list(groups.values()),
                              "kernel_block_sizes": [g.kernel_block_size for g in geometry.groups],
                              "static_forward_context": context}
    if up.takes_num_blocks:
        kwargs["num_blocks"] = geometry.num_blocks
    else:
        kwargs["cache_dtype"] = "auto"
    try:
        zeroer = up.cls(**kwargs)
    except (AssertionError, ZeroDivisionError) as exc:
        return AssertionError(str(exc) or type(exc).__name__)
    if zeroer._meta is None:
        return AssertionError("no segments planned (_meta is None)")
    if up.has_strides:
        addrs, strides, pages, max_chunks, block, n_segs = zeroer._meta
        rows = zip(addrs.tolist(), strides.tolist(), pages.tolist())
    else:
        addrs, pages, max_chunks, block, n_segs = zeroer._meta
        rows = ((a, p, p) for a, p in zip(addrs.tolist(), pages.tolist()))
    segments = tuple(Segment(int(a) - base, int(s), int(p), provenance(geometry, arena, int(a) - base))
                     for a, s, p in rows)
    return SegmentTable(segments, max(geometry.num_blocks, 1), variant), (int(block), int(max_chunks), int(n_segs))


def provenance(geometry: KVCacheGeometry, arena: Arena, addr: int) -> tuple[str, ...]:
    """Attention layers whose first logical block has an element at byte `addr` (for the properties' messages
    and per-layer checks; upstream's table carries no layer names)."""
    found = []
    for _, view in geometry.attention_views():
        rel = addr - view_start(arena, view)
        ratio = geometry.groups[view.group].ratio
        if rel < 0 or rel >= view.extent_bytes:
            continue
        offsets = view.block_byte_offsets()
        if any(int(np.searchsorted(offsets, rel - k * view.block_stride_bytes)) < len(offsets)
               and offsets[int(np.searchsorted(offsets, rel - k * view.block_stride_bytes))]
               == rel - k * view.block_stride_bytes for k in range(ratio)):
            found.append(view.layer)
    return tuple(found)


def model_plan(geometry: KVCacheGeometry, arena: Arena, variant: ZeroingVariant) -> Any:
    try:
        table = plan_segments(geometry, variant, arena=arena)
    except ConfigError as exc:
        return exc
    cfg = launch_config(table)
    return table, (cfg.block_size, cfg.max_chunks, cfg.n_segs)


def plan_key(plan: Any) -> Any:
    if isinstance(plan, BaseException):
        return "refuses"
    table, launch = plan
    return {"segments": sorted((s.addr, s.block_stride, s.page) for s in table.segments),
            "launch": list(launch)}


def single_block_dense_cases():
    """Dense K/V-outer layouts with one kernel block: the layouts the model's page check refuses."""
    from hypothesis import strategies as st

    from kvsim.models.kv_zeroing.layouts import dense_layout
    from kvsim.properties.kv_zeroing.cases import ZeroingCase
    from kvsim.properties.kv_zeroing.strategies import width_unit
    return st.builds(lambda el, kbs, heads, hs, pad: ZeroingCase(dense_layout(
        num_blocks=1, kernel_block_size=kbs, heads=heads, head_size=hs * width_unit(kbs, heads, el),
        element_size=el, kv="outer", block_padding=pad), (0,)),
        st.sampled_from((4, 2, 1)), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.sampled_from((0, 0, 4)))


def case_strategy():
    from hypothesis import strategies as st

    from kvsim.properties.kv_zeroing import strategies as zs
    return st.one_of(zs.ZEROING_CASES, zs.DENSE_CASES, zs.OVERLAID_CASES, zs.LOOSE_CASES, single_block_dense_cases())


def describe(case: Any) -> dict[str, Any]:
    g = case.geometry
    return {"allocations": list(g.allocations),
            "groups": [[x.block_size, x.kernel_block_size] for x in g.groups],
            "views": [[v.layer, v.kind, v.allocation, v.offset, list(v.shape), list(v.strides), v.element_size,
                       v.block_dim, v.group] for v in g.views],
            "block_ids": list(case.block_ids)}


@contextmanager
def upstream_planner(up: Upstream, variant: ZeroingVariant) -> Iterator[None]:
    """Run the kv-zeroing properties with upstream's planner in the model planner's place."""
    from kvsim.properties.kv_zeroing import zeroer as props

    def planner(geometry: KVCacheGeometry, _variant: Any = None, *, arena: Arena | None = None) -> SegmentTable:
        if up.takes_num_blocks and not whole_logical_blocks(geometry):  # the differential's domain (RATIO_SHAPE)
            raise ConfigError("geometry", "a geometry 0.33.0's allocator can build", RATIO_SHAPE)
        arena = arena or Arena.for_geometry(geometry)
        got = upstream_table(up, geometry, arena, variant)
        if isinstance(got, BaseException):
            raise ConfigError("geometry", "a geometry upstream's KVBlockZeroer plans", f"refused: {got}")
        return got[0]

    saved = props.plan_segments
    props.plan_segments = planner
    try:
        yield
    finally:
        props.plan_segments = saved


def property_check(prop: Any, variant: ZeroingVariant, failures: dict[str, str]) -> Callable[[Any], None]:
    """`prop` on one case; the first violation is kept in `failures`; an upstream refusal judges nothing."""
    def check(case: Any) -> None:
        if prop.name in failures:
            return
        try:
            prop.fn(case, variant)
        except PropertyViolation as exc:
            failures[prop.name] = f"{exc} (input {describe(case)})"
        except ConfigError:
            pass
    return check


PROPERTIES = ("zeroed_blocks_are_cleared", "zeroing_preserves_other_bytes", "segments_stay_inside_allocations",
              "segment_geometry_is_valid", "logical_block_zeroes_its_kernel_blocks",
              "zeroing_is_idempotent_and_order_free", "dense_layouts_zero_the_same_bytes",
              "overlaid_groups_get_the_widest_page")


def run_properties(up: Upstream, variant: ZeroingVariant, options: RunOptions, result: TargetResult,
                   extra: Callable[[str], Any] | None = None) -> dict[str, str]:
    """Each named kv-zeroing property on its own strategy and pinned examples, upstream's plan in the model's place."""
    from hypothesis import strategies as st

    from kvsim.properties.kv_zeroing import zeroer as props
    failures: dict[str, str] = {}
    budget = max(10, options.max_examples // 4)
    with upstream_planner(up, variant):
        for name in PROPERTIES:
            prop = getattr(props, name)
            strategy = prop.build_strategy({})
            if name == "segment_geometry_is_valid":
                strategy = st.one_of(strategy, single_block_dense_cases())

            check = property_check(prop, variant, failures)
            for example in prop.examples:
                check(example)
            drive(strategy, check, options, budget)
            result.prop(name, "fails" if name in failures else "holds", failures.get(name, ""))
    return failures


def run_zeroer(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    up = load(source)
    variant = release_variant(source.version)
    result = TargetResult("KVBlockZeroer", source.version)

    refused = 0

    def check(case: Any) -> None:
        nonlocal refused
        if up.takes_num_blocks and not whole_logical_blocks(case.geometry):
            refused += 1
            return
        arena = Arena.for_geometry(case.geometry)
        model, upstream = model_plan(case.geometry, arena, variant), upstream_table(up, case.geometry, arena, variant)
        result.compared += 1
        if plan_key(model) != plan_key(upstream):
            result.diverge(describe(case), plan_key(model) if not isinstance(model, BaseException) else str(model),
                           plan_key(upstream) if not isinstance(upstream, BaseException) else f"refuses: {upstream}",
                           "")

    drive(case_strategy(), check, options)
    run_properties(up, variant, options, result)
    notes = [f"model variant {variant.name}"]
    if refused:
        notes.append(f"{refused} inputs not compared: {RATIO_SHAPE}")
    result.note = "; ".join(notes)
    return result.finish(started)


TARGETS = (
    Target("vllm", "KVBlockZeroer", RELPATH, ("KVBlockZeroer",), "kv-zeroing",
           "segment table and launch (BLOCK_SIZE, chunks, segments) of the real KVBlockZeroer.__init__ on CPU "
           "tensors vs plan_segments/launch_config of the release's variant; every kv-zeroing property on "
           "upstream's plan", run_zeroer),
)
