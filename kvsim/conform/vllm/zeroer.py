"""vLLM `KVBlockZeroer` segment planning (`vllm/v1/worker/utils.py`) against the `kv-zeroing` model.

`ZEROER` (a Differential): upstream's real `KVBlockZeroer.__init__` plans the segment table for CPU tensors
that are views of one torch byte buffer laid out as the model's `Arena`; its `_meta` (addresses, block
strides, pages, and the launch: BLOCK_SIZE, chunks, segments) is compared with the model's `plan_segments`
+ `launch_config`, and every kv-zeroing property is run on upstream's plan (the properties' planner answered
by upstream's table).

Every parameter of `__init__` is drawn: `attn_groups_iter` (one stand-in group per KV-cache group and block
dim, Mamba groups among them), `kernel_block_sizes` (sometimes shorter than the groups: the groups past its
end are skipped), `static_forward_context` (sometimes a layer whose `kv_cache` is no tensor, or, on releases
that skip them, lives on another device), `num_blocks` (0.30.0+: the allocator's count), `cache_dtype`
(0.27.1-0.28.0, handed to the backend's block-dim lookup) and `runner_only_attn_layers` (omitted, empty or
some layers). The model plans the views upstream zeroes: the geometry less the layers upstream skips.

Adapter conventions:
* addresses: upstream's `data_ptr()` minus the buffer's base = the model's arena offsets;
* stand-ins: one `AttentionGroup` per (KV-cache group, block dim) in view order (vLLM has one per backend),
  a non-attention spec for Mamba views; the backend's `get_kv_cache_block_dim` (0.27.1-0.28.0) returns the
  view's block dim and checks what it is asked with (the group's kernel block size, the spec's heads and head
  size, the cache dtype given);
* 0.29.0 and later take standardized views (block dim first): the adapter moves the block dim to the front;
  0.30.0 and later derive the ratio from the view (`shape[0] // num_blocks`): inputs are the views its
  allocator builds (every view num_blocks x block_size/kernel_block_size kernel blocks), or views it refuses
  (a kernel-block count not a multiple of num_blocks, a spec block not a multiple of the kernel block), which
  the model refuses too;
* 0.33.0 binds packed caches to kernel blocks (`AttentionGroup.kernel_block_stride`): a bound group's
  `map_kv_cache_to_manager_blocks` stand-in hands back the layer's manager-block view (the model's) after
  checking it was given that layer's cache and the allocator's num_blocks;
* before d6af803 (0.27.1) `_meta` has no stride column: the page doubles as it;
* views are drawn with their dimensions in any order too (`permuted_cases`: the properties do not run on these;
  0.27.1-0.28.0 count only the dimensions before the block dim as outer, 0.29.0+ every one);
* segments are compared as rows sorted by (addr, block_stride, page): upstream orders them by group, the
  model by view, and the order does not change what is written;
* the properties run on the inputs whose every layer upstream zeroes (no layer skipped), each on its own
  family of inputs (the strategy and pinned examples it is declared with).

Settled: the model's fixed planner asserted a page-within-stride check that no release has. Upstream's
outer-dimension test (stride > block stride) sees K/V as inner when a view has a single kernel block
(K/V stride == block stride), so its page spans K and V of that block; the model refused those dense
layouts. The check is gone from the model (and property 2.4.4 allows it for one kernel block).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.errors import ConfigError
from kvsim.models.kv_zeroing.geometry import Arena, KVCacheGeometry, view_start
from kvsim.models.kv_zeroing.zeroer import Segment, SegmentTable, launch_config, plan_segments

RELPATH = "vllm/v1/worker/utils.py"
DTYPES = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
BASE_PARAMS = ("self", "device", "attn_groups_iter", "kernel_block_sizes")
CACHE_DTYPE = "auto"
SPEC_HEADS, SPEC_HEAD_SIZE = 3, 5  # what the stand-in spec says: the block-dim lookup must be asked with them
NOT_BUILT = ("views whose kernel-block count is a multiple of num_blocks but not num_blocks x block_size/"
             "kernel_block_size (0.30.0+ derive the ratio from the view, its allocator builds no such view)")


class AttentionSpec:
    """Stand-in for vLLM's AttentionSpec / FullAttentionSpec (the zeroer's isinstance test)."""

    def __init__(self, block_size: int) -> None:
        self.block_size, self.num_kv_heads, self.head_size = block_size, SPEC_HEADS, SPEC_HEAD_SIZE


class MambaSpec:
    """A non-attention spec: the zeroer skips its layers."""

    block_size = 1


def loading(upstream: Any, up: SimpleNamespace) -> dict[str, Any]:
    return {"extra_globals": {"AttentionSpec": AttentionSpec, "FullAttentionSpec": AttentionSpec}}


# -- the release's constructor shape (read from its code, not its version) --------------------------------------

@dataclass(frozen=True)
class Shape:
    takes_cache_dtype: bool  # 0.27.1-0.28.0: (..., kernel_block_sizes, cache_dtype, static_forward_context, ...)
    takes_num_blocks: bool   # 0.30.0+: (..., static_forward_context, num_blocks, ...): the ratio from the view
    standardized: bool       # 0.29.0+: views block dim first (no backend block-dim lookup)
    device_check: bool       # 0.30.0+: a layer on another device type is skipped
    binds: bool              # 0.33.0+: groups bound to kernel blocks are mapped back to manager blocks


def release_shape(cls: type) -> Shape:
    """The constructor shape of the loaded `KVBlockZeroer`; ConfigError when it is none the adapter drives."""
    params = list(inspect.signature(cls.__init__).parameters)
    where = f"{RELPATH}:KVBlockZeroer.__init__"
    rest = params[len(BASE_PARAMS):]
    known = (["cache_dtype", "static_forward_context", "runner_only_attn_layers"],
             ["static_forward_context", "runner_only_attn_layers"],
             ["static_forward_context", "num_blocks", "runner_only_attn_layers"])
    if params[:len(BASE_PARAMS)] != list(BASE_PARAMS) or rest not in known:
        raise ConfigError(where, "parameters (device, attn_groups_iter, kernel_block_sizes[, cache_dtype], "
                          "static_forward_context[, num_blocks], runner_only_attn_layers)",
                          f"({', '.join(params[1:])})", hint="the upstream signature changed")
    text = inspect.getsource(cls.__init__)
    return Shape("cache_dtype" in params, "num_blocks" in params, "get_kv_cache_block_dim" not in text,
                 ".device.type" in text, "kernel_block_stride" in text)


def prepare(ctx: Context) -> None:
    ctx.state["shape"] = release_shape(ctx.up.KVBlockZeroer)


# -- the input: one constructor call -------------------------------------------------------------------------

@dataclass(frozen=True)
class ZeroerCase:
    """One `KVBlockZeroer(...)` call: a kv-zeroing case (geometry, block IDs) and the other parameters.

    `family`: the strategy it was drawn from (the properties run on their own); `groups_given`: how many
    kernel block sizes `kernel_block_sizes` holds (None: one per group); `runner_only`: None (the argument
    omitted) or the layers the runner handles itself; `not_tensor` / `elsewhere`: layers whose `kv_cache` is
    no tensor / on another device; `bound`: {group: kernel_block_stride} of groups bound to kernel blocks."""

    case: Any
    family: str
    groups_given: int | None = None
    runner_only: tuple[str, ...] | None = None
    not_tensor: tuple[str, ...] = ()
    elsewhere: tuple[str, ...] = ()
    bound: tuple[tuple[int, int], ...] = ()

    @property
    def geometry(self) -> KVCacheGeometry:
        return self.case.geometry

    def skipped(self) -> set[str]:
        """The attention layers upstream leaves out of the table."""
        g = self.geometry
        given = len(g.groups) if self.groups_given is None else self.groups_given
        return ({v.layer for _, v in g.attention_views() if v.group >= given}
                | set(self.runner_only or ()) | set(self.not_tensor) | set(self.elsewhere))

    def zeroed(self) -> KVCacheGeometry | None:
        """The geometry of the views upstream zeroes (None: no attention view left)."""
        skipped = self.skipped()
        if not skipped:
            return self.geometry
        views = tuple(v for v in self.geometry.views if v.kind != "attention" or v.layer not in skipped)
        if not any(v.kind == "attention" for v in views):
            return None
        return KVCacheGeometry(self.geometry.allocations, self.geometry.groups, views)


def single_block_dense_cases() -> Any:
    """Dense K/V-outer layouts with one kernel block: the layouts the model's page check refused."""
    from kvsim.models.kv_zeroing.layouts import dense_layout
    from kvsim.properties.kv_zeroing.cases import ZeroingCase
    from kvsim.properties.kv_zeroing.strategies import width_unit

    return st.builds(lambda el, kbs, heads, hs, pad: ZeroingCase(dense_layout(
        num_blocks=1, kernel_block_size=kbs, heads=heads, head_size=hs * width_unit(kbs, heads, el),
        element_size=el, kv="outer", block_padding=pad), (0,)),
        st.sampled_from((4, 2, 1)), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.sampled_from((0, 0, 4)))


def permuted(view: Any, order: list[int]) -> Any:
    """The view with its dimensions listed in `order` (a permuted tensor: the same elements)."""
    return replace(view, shape=tuple(view.shape[d] for d in order), strides=tuple(view.strides[d] for d in order),
                   block_dim=order.index(view.block_dim))


@st.composite
def permuted_cases(draw: st.DrawFn) -> Any:
    """kv-zeroing cases whose attention views list their dimensions in any order (a permuted tensor: the same
    elements), so outer dimensions (K/V, head groups) may follow the block dimension, as in the standardized
    block-first views of 0.29.0+."""
    from kvsim.properties.kv_zeroing.cases import ZeroingCase
    from kvsim.properties.kv_zeroing.strategies import ZEROING_CASES

    case = draw(ZEROING_CASES)
    views = []
    for view in case.geometry.views:
        if view.kind == "attention":  # reversed: the outer dims (first) go last
            dims = list(range(len(view.shape)))
            view = permuted(view, draw(st.one_of(st.just(dims[::-1]), st.permutations(dims))))
        views.append(view)
    g = case.geometry
    return ZeroingCase(KVCacheGeometry(g.allocations, g.groups, tuple(views)), case.block_ids)


def kv_last_case() -> ZeroerCase:
    """A dense K/V-outer layout listing its K/V dimension last, after the block and every inner dimension: an
    outer dimension in the last place (0.29.0+ look for outer dimensions among all but the block's)."""
    from kvsim.models.kv_zeroing.layouts import dense_layout
    from kvsim.properties.kv_zeroing.cases import ZeroingCase

    g = dense_layout(num_blocks=2, kernel_block_size=2, heads=1, head_size=2, element_size=2, kv="outer")
    views = tuple(permuted(v, [1, 2, 3, 4, 0]) for v in g.views)  # (2, blocks, kbs, heads, hs) -> K/V last
    return ZeroerCase(ZeroingCase(KVCacheGeometry(g.allocations, g.groups, views), (1,)), "permuted")


def families() -> dict[str, Any]:
    from kvsim.properties.kv_zeroing import strategies as zs

    return {"zeroing": zs.ZEROING_CASES, "dense": zs.DENSE_CASES, "overlaid": zs.OVERLAID_CASES,
            "loose": zs.LOOSE_CASES, "single_block_dense": single_block_dense_cases(), "permuted": permuted_cases()}


@st.composite
def zeroer_cases(draw: st.DrawFn, shape: Shape) -> ZeroerCase:
    """A case of one family; one in three with the runner's other parameters varied."""
    family, case = draw(st.one_of(*(s.map(lambda c, f=f: (f, c)) for f, s in families().items())))
    whole = all(g.block_size % g.kernel_block_size == 0 for g in case.geometry.groups)
    if draw(st.integers(0, 2)) or not whole:  # a group whose every layer is skipped is still asserted on upstream
        runner_only = draw(st.sampled_from((None, ())))
        return ZeroerCase(case, family, runner_only=runner_only)
    layers = [v.layer for _, v in case.geometry.attention_views()]
    some = st.lists(st.sampled_from(layers), unique=True, max_size=2).map(tuple)
    groups = len(case.geometry.groups)
    bound: tuple[tuple[int, int], ...] = ()
    if shape.binds:
        bound = tuple(sorted(draw(st.dictionaries(st.integers(0, groups - 1), st.integers(1, 3),
                                                  max_size=groups)).items()))
    return ZeroerCase(case, family, groups_given=draw(st.one_of(st.none(), st.integers(0, groups - 1))),
                      runner_only=draw(st.one_of(st.none(), some)), not_tensor=draw(some),
                      elsewhere=draw(some) if shape.device_check else (), bound=bound)


def ratio_shape(zc: ZeroerCase) -> str:
    """For a release deriving the ratio from the view: "built" (every zeroed view holds num_blocks x ratio kernel
    blocks), "refused" (a view or group upstream asserts on), else "not built" (NOT_BUILT)."""
    g, n = zc.geometry, zc.geometry.num_blocks
    zeroed = zc.zeroed()
    if zeroed is None:
        return "built"
    views = [v for _, v in zeroed.attention_views()]
    groups = {v.group for v in views}
    if any(g.groups[i].block_size % g.groups[i].kernel_block_size for i in groups) or \
            any(v.shape[v.block_dim] % n for v in views):
        return "refused"
    return "built" if all(v.shape[v.block_dim] == n * g.groups[v.group].ratio for v in views) else "not built"


def inputs(ctx: Context) -> Any:
    shape = ctx.state["shape"]
    cases = zeroer_cases(shape)
    return cases.filter(lambda zc: ratio_shape(zc) != "not built") if shape.takes_num_blocks else cases


def pinned(ctx: Context) -> list[ZeroerCase]:
    """The pinned upstream cases (every property's examples) and `kv_last_case`, first in every run."""
    from kvsim.properties.kv_zeroing.cases import PINNED

    cases = [ZeroerCase(c, "pinned") for c in PINNED] + [kv_last_case()]
    return [c for c in cases if not ctx.state["shape"].takes_num_blocks or ratio_shape(c) != "not built"]


def describe(ctx: Context, zc: ZeroerCase) -> dict[str, Any]:
    g = zc.geometry
    shown: dict[str, Any] = {
        "allocations": list(g.allocations), "groups": [[x.block_size, x.kernel_block_size] for x in g.groups],
        "views": [[v.layer, v.kind, v.allocation, v.offset, list(v.shape), list(v.strides), v.element_size,
                   v.block_dim, v.group] for v in g.views],
        "block_ids": list(zc.case.block_ids)}
    if zc.groups_given is not None:
        shown["kernel_block_sizes"] = [x.kernel_block_size for x in g.groups][:zc.groups_given]
    for name in ("runner_only", "not_tensor", "elsewhere", "bound"):
        if getattr(zc, name):
            shown[name] = [list(x) if isinstance(x, tuple) else x for x in getattr(zc, name)]
    return shown


# -- the two sides -------------------------------------------------------------------------------------------

def rows(segments: Any) -> list[dict[str, int]]:
    return [{"addr": a, "block_stride": s, "page": p} for a, s, p in sorted(segments)]


NO_TABLE = {"segments": [], "launch": None}  # nothing to zero: upstream's `_meta` is None


def plan_model(ctx: Context, zc: ZeroerCase) -> dict[str, Any]:
    if ctx.state["shape"].takes_num_blocks and ratio_shape(zc) != "built":
        raise ConfigError("geometry", "views of num_blocks x block_size/kernel_block_size kernel blocks with whole "
                          "kernel blocks per spec block (0.30.0+ derive the ratio from the view)",
                          describe(ctx, zc)["views"])
    geometry = zc.zeroed()
    if geometry is None:
        return NO_TABLE
    table = plan_segments(geometry, ctx.variant, arena=Arena.for_geometry(zc.geometry))
    cfg = launch_config(table)
    return {"segments": rows((s.addr, s.block_stride, s.page) for s in table.segments),
            "launch": {"block_size": cfg.block_size, "max_chunks": cfg.max_chunks, "n_segs": cfg.n_segs}}


def plan_upstream(ctx: Context, zc: ZeroerCase) -> dict[str, Any]:
    zeroer, base = construct(ctx.up.KVBlockZeroer, ctx.state["shape"], zc)
    return meta_answer(zeroer._meta, base)


def meta_answer(meta: Any, base: int) -> dict[str, Any]:
    """Upstream's `_meta` as rows relative to the buffer and the launch (5 fields before d6af803: no stride)."""
    if meta is None:
        return NO_TABLE
    if len(meta) == 6:
        addrs, strides, pages, max_chunks, block, n_segs = meta
        table = zip(addrs.tolist(), strides.tolist(), pages.tolist())
    else:
        addrs, pages, max_chunks, block, n_segs = meta
        table = ((a, p, p) for a, p in zip(addrs.tolist(), pages.tolist()))
    return {"segments": rows((int(a) - base, int(s), int(p)) for a, s, p in table),
            "launch": {"block_size": int(block), "max_chunks": int(max_chunks), "n_segs": int(n_segs)}}


def construct(cls: type, shape: Shape, zc: ZeroerCase) -> tuple[Any, int]:
    """Upstream's `KVBlockZeroer` for one case, on views of one CPU byte buffer laid out as the model's arena;
    (the zeroer, the buffer's base address)."""
    import torch

    geometry = zc.geometry
    arena = Arena.for_geometry(geometry)
    buf = torch.zeros(arena.size, dtype=torch.uint8)
    groups: dict[tuple, SimpleNamespace] = {}
    context: dict[str, SimpleNamespace] = {}
    bound = dict(zc.bound)
    for view in geometry.views:
        el = view.element_size
        kv = buf.view(getattr(torch, DTYPES[el])).as_strided(view.shape, view.strides,
                                                             (arena.bases[view.allocation] + view.offset) // el)
        if shape.standardized:  # [B, ...] views: block dim first
            kv = kv.movedim(view.block_dim, 0)
        key = (view.kind, view.group, view.block_dim)
        if key not in groups:
            groups[key] = stand_in_group(geometry, view, shape, bound.get(view.group, 0) if view.kind == "attention"
                                         else 0)
        group = groups[key]
        group.layer_names.append(view.layer)
        if view.layer in zc.elsewhere:
            kv = torch.empty(kv.shape, dtype=kv.dtype, device="meta")
        given = kv
        if group.kernel_block_stride:
            given = kv.as_strided(kv.shape, kv.stride())  # the bound (kernel-block) view: another tensor
            group.manager_views[id(given)] = kv
        context[view.layer] = SimpleNamespace(kv_cache=[] if view.layer in zc.not_tensor else given)
    sizes = [g.kernel_block_size for g in geometry.groups][:zc.groups_given]
    kwargs: dict[str, Any] = {"device": torch.device("cpu"), "attn_groups_iter": list(groups.values()),
                              "kernel_block_sizes": sizes, "static_forward_context": context}
    if shape.takes_cache_dtype:
        kwargs["cache_dtype"] = CACHE_DTYPE
    if shape.takes_num_blocks:
        kwargs["num_blocks"] = geometry.num_blocks
    if zc.runner_only is not None:
        kwargs["runner_only_attn_layers"] = set(zc.runner_only)
    return cls(**kwargs), buf.data_ptr()


def stand_in_group(geometry: KVCacheGeometry, view: Any, shape: Shape, kernel_block_stride: int) -> SimpleNamespace:
    """vLLM's `AttentionGroup` as the zeroer reads it: spec, group id, layers, backend, binding."""
    g = geometry.groups[view.group]
    spec = AttentionSpec(g.block_size) if view.kind == "attention" else MambaSpec()
    num_blocks = geometry.num_blocks
    group = SimpleNamespace(kv_cache_spec=spec, kv_cache_group_id=view.group, layer_names=[],
                            kernel_block_stride=kernel_block_stride, manager_views={})

    def get_kv_cache_block_dim(kernel_bs: int, heads: int, head_size: int, *, cache_dtype_str: str) -> int:
        if (kernel_bs, heads, head_size, cache_dtype_str) != (g.kernel_block_size, SPEC_HEADS, SPEC_HEAD_SIZE,
                                                             CACHE_DTYPE):
            raise ValueError(f"get_kv_cache_block_dim asked with ({kernel_bs}, {heads}, {head_size}, "
                             f"cache_dtype_str={cache_dtype_str!r})")
        return view.block_dim

    def map_kv_cache_to_manager_blocks(kv: Any, blocks: int) -> Any:
        if id(kv) not in group.manager_views or blocks != num_blocks:
            raise ValueError(f"map_kv_cache_to_manager_blocks given another cache or {blocks!r} blocks "
                             f"(the allocator's: {num_blocks})")
        return group.manager_views[id(kv)]

    group.backend = SimpleNamespace(get_kv_cache_block_dim=get_kv_cache_block_dim)
    group.map_kv_cache_to_manager_blocks = map_kv_cache_to_manager_blocks
    return group


# -- the model's properties on upstream's plan -----------------------------------------------------------------

def provenance(geometry: KVCacheGeometry, arena: Arena, addr: int) -> tuple[str, ...]:
    """Attention layers whose first logical block has an element at byte `addr` (for the properties' messages
    and per-layer checks; upstream's table carries no layer names)."""
    found = []
    for _, view in geometry.attention_views():
        rel = addr - view_start(arena, view)
        if rel < 0 or rel >= view.extent_bytes:
            continue
        offsets = view.block_byte_offsets()
        for k in range(geometry.groups[view.group].ratio):
            at = rel - k * view.block_stride_bytes
            i = int(np.searchsorted(offsets, at))
            if i < len(offsets) and offsets[i] == at:
                found.append(view.layer)
                break
    return tuple(found)


def table_of(answer: dict[str, Any], geometry: KVCacheGeometry, variant: Any) -> SegmentTable:
    """Upstream's answer as a model `SegmentTable` (layers named by provenance)."""
    arena = Arena.for_geometry(geometry)
    return SegmentTable(tuple(Segment(r["addr"], r["block_stride"], r["page"], provenance(geometry, arena, r["addr"]))
                              for r in answer["segments"]), max(geometry.num_blocks, 1), variant)


@contextlib.contextmanager
def planned_by(table: SegmentTable) -> Iterator[None]:
    """Inside, the kv-zeroing properties' planner answers with `table` (upstream's plan of the case)."""
    from kvsim.properties.kv_zeroing import zeroer as props

    saved = props.plan_segments
    props.plan_segments = lambda geometry, variant=None, *, arena=None: table  # type: ignore[assignment]
    try:
        yield
    finally:
        props.plan_segments = saved


def property_check(name: str, drawn: tuple[str, ...]) -> Check:
    """The kv-zeroing property `name` on upstream's plan, for inputs of its own families (`drawn`) or among its
    pinned examples, whose every layer upstream zeroes."""
    def check(ctx: Context, zc: ZeroerCase, answer: dict[str, Any]) -> None:
        from kvsim.properties.kv_zeroing import zeroer as props

        prop = getattr(props, name)
        if not answer["segments"] or zc.skipped() or not (zc.family in drawn or zc.case in prop.examples):
            return
        with planned_by(table_of(answer, zc.geometry, ctx.variant)):
            try:
                prop.fn(zc.case, ctx.variant)
            except ConfigError:  # the property's own refusal of the case (say, a block ID past the table)
                pass
    return Check(name, check)


ZEROING = ("zeroing",)
CHECKS = (
    property_check("zeroed_blocks_are_cleared", ZEROING),
    property_check("zeroing_preserves_other_bytes", ZEROING),
    property_check("segments_stay_inside_allocations", ZEROING),
    property_check("segment_geometry_is_valid", ("loose", "single_block_dense")),
    property_check("logical_block_zeroes_its_kernel_blocks", ZEROING),
    property_check("zeroing_is_idempotent_and_order_free", ZEROING),
    property_check("dense_layouts_zero_the_same_bytes", ("dense",)),
    property_check("overlaid_groups_get_the_widest_page", ("overlaid",)),
)


def note(ctx: Context) -> str:
    shape = ctx.state["shape"]
    extra = f"; inputs exclude {NOT_BUILT}" if shape.takes_num_blocks else ""
    return f"model variant {ctx.variant.name}{extra}"


ZEROER = Differential(
    loading=loading, prepare=prepare, inputs=inputs, pinned=pinned, model=plan_model, upstream=plan_upstream,
    compare=Exact(refusals=("AssertionError",)), describe=describe, checks=CHECKS, note=note)


def upstream_plan(cls: type, geometry: KVCacheGeometry) -> tuple[SegmentTable, dict[str, int]] | None:
    """(for the kernel target's frame probe) Upstream's own plan of `geometry` as a model `SegmentTable` and its
    launch; None when upstream refuses the geometry or plans nothing."""
    from kvsim.models.kv_zeroing.zeroer import FIXED
    from kvsim.properties.kv_zeroing.cases import ZeroingCase

    try:
        zeroer, base = construct(cls, release_shape(cls), ZeroerCase(ZeroingCase(geometry, ()), "probe"))
    except AssertionError:
        return None
    answer = meta_answer(zeroer._meta, base)
    return (table_of(answer, geometry, FIXED), answer["launch"]) if answer["segments"] else None
