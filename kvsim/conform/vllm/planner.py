"""vLLM's MLA chunked-context planner (`mla_attention.py`) against the `mla-chunks` model: three adapters.

* `PLANNER` (`plan_mla_context_chunks`): the pure planner on two kinds of input: the arguments the model's
  builder derives for a `PLAN_CASES` batch (the pinned upstream batches first) on upstream's own aligned
  workspace, and free arguments (`PlanArguments`: any budget, chunk cap (a multiple of the alignment) and
  alignment, the identity or a DCP `padded_rows`, invalid ones too: a cap or alignment of 0 or below, a budget
  too small for one split). The plans are compared field by field and the model's planner properties checked
  on upstream's plans (the alignment-slack bound only on the builder's arguments, whose workspace it reads).
  Conventions: upstream returns lists, the model tuples; `request_slice` = [request_start, request_end);
  upstream's assertion equals the model's refusal.
* `BUILDER` (`mla_chunk_arguments`): the whole metadata `build_mla_chunked_context_metadata` returns (every
  field of every `ContextChunk`, the DCP ones included, and the context lengths and empty token slices)
  against the model's builder, on batches with empty queries and context-free prefills (and none at all), any
  requested workspace (one below the alignment too: upstream's assertion), block alignment on or off, DCP or
  not (and an interleave without DCP, as prefill context parallelism leaves it), `align_indptr` where the
  release has it (checked: every chunk's indptr views start a multiple of 16 bytes into their buffer), and the
  workspace and `dcp_manager` objects (only stored: compared by identity). Conventions: upstream takes
  `dcp_local_block_size` = the model's interleave, `dcp_virtual_block_size` = world * interleave; its
  `starts` are the local starts under DCP (the model's `local_starts`) and its `num_local_context_tokens`
  the context rows without DCP (the model's `num_context_tokens`); a workspace size that is no multiple of the
  DCP world is drawn too (the metadata builder's constructor asserts it is one; the function floors); tensors
  are CPU int32 (`PIN_MEMORY` off, `async_tensor_h2d` a plain copy); a release whose `ContextChunk` has no
  `all_rows_active` (before 0.30.0) is compared without it.
* `WORKSPACE` (`align_mla_chunked_context_workspace_size`): the workspace lower bound on any requested size,
  block, DCP world (1 to 8) and interleave (also without DCP, where upstream must ignore it). Convention:
  upstream reads block, DCP world and interleave from a `VllmConfig` (a stand-in with those three fields, and
  `max_num_seqs`, which only a pre-#51733 source reads); the model takes `max_num_seqs` as an argument.

Settled: vllm#51733 (0.28.0 and later) dropped the `max_num_seqs * alignment` term of b38e111d's workspace
lower bound; the model's `fixed` follows it (`MlaVariant.workspace_seq_term`). A source that still has the term
(b38e111d before #51733, never released) is said so in the divergence's note.
Settled: under DCP with `align_chunk_to_block=False` upstream aligns splits to lcm(1, world * interleave): a
model bug, fixed (`chunk_plan_arguments`, `test_dcp_without_block_alignment_aligns_splits_to_the_interleave_only`).
Settled: the model refused planner arguments upstream plans (a chunk cap that is no multiple of the alignment
or below it, a budget below 1) and a workspace that is no multiple of the DCP world: its preconditions are now
upstream's asserts (`test_planner_takes_the_arguments_upstream_plans`).

Survivors (declared in `models/mla_chunks/conform.py`, each an equivalent mutant). In the planner: the
arguments of `min(max_context_chunk, round_down(...))` swapped; `max_split // split_alignment` rounded up (the
same in the builder's contract, a cap that is a multiple of the alignment, which the free arguments keep to:
see `plan_arguments`); `remaining - 1` made `remaining - 0` (a split is only looked for when the whole remainder
does not fit, so its full length never fits either); the binary search's midpoint rounded up or moved by one
(any midpoint in (low, high] finds the same largest fit); `rows +=` made `rows =` right before the `break`
(dead). In the builder: the value of the indptr padding (never read); the `and` of `all_rows_active` without
its `seq_lens` clause, and `> 0` made `>= 0` there (the planner makes no empty span); `assert max_context_chunk
> 0` made `>= 0` (the planner it calls asserts the same); the arguments of `lcm` swapped; `start` and `length`
swapped in the DCP local length (read only through their sum); `starts` sliced one element longer (chunks read
only their own slice of it). In the workspace bound: the arguments of `lcm` and `max` swapped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Callable

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.metadata import build_mla_chunked_context_metadata, chunk_plan_arguments
from kvsim.models.mla_chunks.planner import FIXED, chunked_context_workspace_size, plan_mla_context_chunks
from kvsim.properties.mla_chunks import plan as props
from kvsim.properties.mla_chunks.cases import PLAN_EXAMPLES
from kvsim.properties.mla_chunks.cases import case as batch
from kvsim.properties.mla_chunks.strategies import PLAN_CASES

from ..loader import check_signature

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
PLANNER_PARAMS = ("context_lens", "row_budget", "max_context_chunk", "split_alignment", "padded_rows")
WORKSPACE_PARAMS = ("vllm_config", "workspace_size")
BUILDER_PARAMS = ("context_lens_cpu", "prefill_query_start_loc_cpu", "chunked_prefill_workspace",
                  "chunked_prefill_workspace_size", "block_size", "align_chunk_to_block", "device", "dcp_world_size",
                  "dcp_local_block_size", "dcp_virtual_block_size", "dcp_manager")
ALIGN_INDPTR = "align_indptr"  # 0.33.0 on: 16-byte aligned indptr slices for CuTe DSL
REFUSALS = Exact(refusals=("AssertionError",))
B38E111D = replace(FIXED, name="b38e111d", workspace_seq_term=True)
PRE_51733 = ("upstream keeps b38e111d's max_num_seqs * alignment term (before vllm#51733): the model's "
             "MlaVariant.workspace_seq_term=True, not `fixed`")
DCP_LAYOUTS = ((1, 1), (2, 1), (2, 2), (4, 1), (2, 4), (4, 2), (8, 1), (1, 2), (1, 4))  # (world, interleave)


def dcp_of(world: int, interleave: int) -> DcpConfig | None:
    """The model's DCP layout: none for a world of 1, whatever the interleave (upstream reads it only under DCP)."""
    return None if world == 1 else DcpConfig(world, interleave)


def workspace(case: Any) -> int:
    return chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size, case.dcp, FIXED)


# -- the planner ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanArguments:
    """The planner's arguments drawn freely; `padded_rows` is the identity for (1, 1), else the DCP cost
    `cdiv(rows, world * interleave) * interleave`."""

    context_lens: tuple[int, ...]
    row_budget: int
    max_context_chunk: int
    split_alignment: int
    dcp_world_size: int = 1
    dcp_interleave: int = 1

    @property
    def padded_rows(self) -> Callable[[int], int] | None:
        if (self.dcp_world_size, self.dcp_interleave) == (1, 1):
            return None
        return DcpConfig(self.dcp_world_size, self.dcp_interleave).padded_rows


@st.composite
def plan_arguments(draw: st.DrawFn) -> PlanArguments:
    """Free arguments in the builder's contract (a positive budget, a cap that is a positive multiple of the
    alignment), budgets down to 1 (no split fits: upstream asserts), and one in six with a cap or alignment of 0
    or -1 (upstream's asserts). A cap off the alignment and a budget below 1 are left out: upstream plans them,
    as the model does, but an engine's own planner may refuse them (`examples/engine_ci`'s does)."""
    context = st.integers(-60, 300).map(lambda c: max(c, 0))
    ctx = draw(st.lists(context, min_size=0, max_size=5))
    world, interleave = draw(st.sampled_from(DCP_LAYOUTS))
    alignment = draw(st.sampled_from((1, 2, 4, 8, 16, 3, 6)))
    mcc = alignment * draw(st.integers(1, 16))
    if draw(st.integers(0, 5)) == 0:
        if draw(st.booleans()):  # with a positive cap, so the alignment's own assertion is the one reached
            alignment, mcc = draw(st.integers(-1, 0)), draw(st.integers(1, 16))
        else:
            mcc = draw(st.integers(-1, 0))
    budget = draw(st.one_of(st.integers(1, 160), st.integers(1, 4)))
    return PlanArguments(tuple(ctx), budget, mcc, alignment, world, interleave)


def arguments(case: Any, aligned: int | None = None) -> tuple[list[int], int, int, int, Callable[[int], int] | None]:
    """(context_lens, row budget, max_context_chunk, alignment, padded_rows) as the model's builder derives them
    on the `aligned` workspace (default: the model's)."""
    alignment, budget, mcc, pad = chunk_plan_arguments(workspace(case) if aligned is None else aligned,
                                                       case.block_size, case.dcp, case.align_chunk_to_block)
    return list(case.context_lens), budget, mcc, alignment, pad


def planned(ctx: Context, case: Any) -> tuple[list[int], int, int, int, Callable[[int], int] | None]:
    """The planner's arguments: free ones as drawn, a batch's on upstream's own aligned workspace (computed once
    per case)."""
    if isinstance(case, PlanArguments):
        return list(case.context_lens), case.row_budget, case.max_context_chunk, case.split_alignment, \
            case.padded_rows
    if ctx.state.get("case") is not case:
        ctx.state["case"], ctx.state["args"] = case, arguments(case, workspace_upstream(ctx, case))
    return ctx.state["args"]


def plans(answer: Any) -> list[dict[str, Any]]:
    return [{"request_start": p.request_start, "request_end": p.request_end, "starts": list(p.starts),
             "seq_lens": list(p.seq_lens), "is_continuation": bool(p.is_continuation)} for p in answer]


def planner_model(ctx: Context, case: Any) -> Any:
    lens, budget, mcc, alignment, pad = planned(ctx, case)
    try:
        return plans(plan_mla_context_chunks(lens, budget, mcc, alignment, pad))
    except AssertionError as exc:  # the model states upstream's assertions as assertions
        raise ConfigError("plan", "a plannable batch", str(exc)) from exc


def planner_upstream(ctx: Context, case: Any) -> Any:
    lens, budget, mcc, alignment, pad = planned(ctx, case)
    return plans(ctx.up.plan_mla_context_chunks(lens, budget, mcc, alignment, pad or (lambda rows: rows)))


def describe_plan(ctx: Context, case: Any) -> dict[str, Any]:
    lens, budget, mcc, alignment, _ = planned(ctx, case)
    return {"context_lens": lens, "row_budget": budget, "max_context_chunk": mcc, "split_alignment": alignment,
            "dcp": [case.dcp_world_size, case.dcp_interleave]}


class PlanView:
    """A plan (as `plans` gives it) with the attributes the model's plan checks read."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.request_slice = slice(plan["request_start"], plan["request_end"])
        self.starts, self.seq_lens = tuple(plan["starts"]), tuple(plan["seq_lens"])
        self.is_continuation = plan["is_continuation"]


def _plan_check(name: str, fn: Callable[[Any, list[PlanView], int, int, Any], None]) -> Check:
    def check(ctx: Context, case: Any, answer: list[dict[str, Any]]) -> None:
        _, budget, _, alignment, pad = planned(ctx, case)
        fn(case, [PlanView(p) for p in answer], alignment, budget, pad)
    return Check(name, check)


def check_padded_budget(chunks: list[PlanView], budget: int, pad: Callable[[int], int] | None) -> None:
    """The padded-row half of chunks_fit_the_row_budget (the rest reads metadata the planner does not make)."""
    pad = pad or (lambda rows: rows)
    for i, chunk in enumerate(chunks):
        rows = sum(pad(s + n) - pad(s) for s, n in zip(chunk.starts, chunk.seq_lens))
        if rows > budget:
            raise PropertyViolation(f"padded rows of chunk {i}: expected <= row budget {budget}, got {rows}")


def check_chunk_count(case: Any, chunks: Any, alignment: int, budget: int, pad: Any,
                      aligned: int | None = None) -> None:
    """The chunk-blowup bound of `chunk_count_within_alignment_slack` (the b38e111d seed bug's property), on the
    `aligned` workspace (default: the model's); free planner arguments have no workspace to bound by."""
    if isinstance(case, PlanArguments):
        return
    w = workspace(case) if aligned is None else aligned
    bound = props.chunk_count_upper_bound(case.context_lens, w, alignment, case.dcp)
    if bound is not None and len(chunks) > bound:
        raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {w}, alignment "
                                f"{alignment}: expected <= {bound}, got {len(chunks)}")


PLAN_CHECKS = (
    _plan_check("chunks_tile_every_context_row_once",
                lambda c, ch, a, b, pad: props.check_exact_tiling(c.context_lens, ch)),
    _plan_check("chunks_have_no_empty_spans", lambda c, ch, a, b, pad: props.check_no_empty_spans(ch)),
    _plan_check("chunks_follow_request_order", lambda c, ch, a, b, pad: props.check_request_order(c.context_lens, ch)),
    _plan_check("continuation_only_at_first_request", lambda c, ch, a, b, pad: props.check_continuation(ch)),
    _plan_check("chunk_starts_are_aligned", lambda c, ch, a, b, pad: props.check_alignment(ch, a)),
    _plan_check("chunks_fit_the_row_budget", lambda c, ch, a, b, pad: check_padded_budget(ch, b, pad)),
    _plan_check("chunk_count_within_alignment_slack", check_chunk_count),
)


def _plannable(case: Any) -> bool:
    return arguments(case)[2] > 0


# upstream's assertions, each reached alone: an alignment of 0 and of -1 (under a positive cap), a cap of 0 and of
# -1; drawn by `plan_arguments` too, but whether a derandomized run of a few hundred inputs draws one depends on
# the rest of the strategy's draws, and a dropped assertion must be a divergence every time
REFUSED = (PlanArguments((10,), 16, 4, 0), PlanArguments((10,), 16, 4, -1), PlanArguments((10,), 16, 0, 4),
           PlanArguments((10,), 16, -1, 4))


def pinned_plans(ctx: Context) -> list[Any]:
    """The upstream batches, a request that exactly fills the workspace (block 1: the bound allows one chunk; an
    off-by-one in the fit test splits it in two), and the arguments upstream asserts on (`REFUSED`)."""
    return [c for c in (*PLAN_EXAMPLES, batch([64], block_size=1, workspace_size=64)) if _plannable(c)] + \
        list(REFUSED)


PLANNER = Differential(
    prepare=lambda ctx: check_signature(ctx.up.plan_mla_context_chunks, PLANNER_PARAMS,
                                        f"{RELPATH}:plan_mla_context_chunks"),
    inputs=lambda ctx: st.one_of(PLAN_CASES.filter(_plannable), plan_arguments()),
    pinned=pinned_plans, model=planner_model, upstream=planner_upstream, compare=REFUSALS, describe=describe_plan,
    checks=PLAN_CHECKS)


# -- the metadata builder ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BuilderCase:
    """One call of `build_mla_chunked_context_metadata`: a batch (query lengths may be 0) and the builder's
    configuration; `dcp_manager`: whether a manager object is handed over (it is only stored)."""

    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    workspace_size: int
    block_size: int
    align_chunk_to_block: bool = True
    dcp_world_size: int = 1
    dcp_interleave: int = 1
    align_indptr: bool = False
    dcp_manager: bool = False

    @property
    def dcp(self) -> DcpConfig | None:
        return dcp_of(self.dcp_world_size, self.dcp_interleave)

    @property
    def query_start_loc(self) -> list[int]:
        out = [0]
        for q in self.query_lens:
            out.append(out[-1] + q)
        return out


@st.composite
def builder_cases(draw: st.DrawFn) -> BuilderCase:
    """Up to 6 prefills (rarely none) of up to 700 context rows (about one in four context-free, some of 1-3
    rows), queries of 0-4 tokens, any block, alignment on or off, a DCP layout, and a workspace of at most about
    16 chunks for the batch, one in eight below the split alignment (where upstream asserts), one in eight no
    multiple of the DCP world (the function floors the per-rank budget; its caller never passes one)."""
    n = draw(st.integers(0, 6))
    context = st.one_of(st.integers(-200, 700).map(lambda c: max(c, 0)), st.integers(1, 3))
    ctx = draw(st.lists(context, min_size=n, max_size=n))
    queries = draw(st.lists(st.sampled_from((1, 2, 3, 4, 0)), min_size=n, max_size=n))
    block = draw(st.sampled_from((1, 2, 4, 8, 16, 32, 64, 3)))
    world, interleave = draw(st.sampled_from(DCP_LAYOUTS))
    align = draw(st.booleans())
    split = block if align else 1
    alignment = math.lcm(split, world * interleave) if world > 1 else split
    if alignment > world and draw(st.integers(0, 7)) == 0:
        units = draw(st.integers(1, (alignment - 1) // world))
    else:
        least = max(1, -(-sum(ctx) // (16 * world)))
        units = draw(st.integers(least, least + 2 * sum(ctx) // world + 2))
    extra = draw(st.integers(1, world - 1)) if world > 1 and draw(st.integers(0, 7)) == 0 else 0
    return BuilderCase(tuple(ctx), tuple(queries), units * world + extra, block, align, world, interleave,
                       draw(st.booleans()), draw(st.booleans()))


def _rows(values: Any) -> Any:
    """A chunk field as the answer holds it: int32 arrays for sequences (tensors, tuples, lists)."""
    import numpy as np

    if values is None:
        return None
    if hasattr(values, "numpy"):
        return values.numpy().astype(np.int32)
    return np.asarray(values, dtype=np.int32).reshape(-1)


def _ints(values: Any) -> list[int] | None:
    return None if values is None else [int(x) for x in values]


def _nested(values: Any) -> list[list[int]] | None:
    return None if values is None else [[int(x) for x in row] for row in values]


def chunk_answer(chunk: Any, *, starts: Any, num_local: int, active: bool | None) -> dict[str, Any]:
    """One `ContextChunk` (the model's or upstream's) as plain data, upstream's field names."""
    out = {"index": int(chunk.index), "request_slice": [chunk.request_slice.start, chunk.request_slice.stop],
           "token_slice": [chunk.token_slice.start, chunk.token_slice.stop],
           "continuation_token_end": int(chunk.continuation_token_end), "is_continuation": bool(chunk.is_continuation),
           "num_context_tokens": int(chunk.num_context_tokens), "query_start_loc": _rows(chunk.query_start_loc),
           "max_query_len": int(chunk.max_query_len), "cu_seq_lens": _rows(chunk.cu_seq_lens), "starts": _rows(starts),
           "max_seq_len": int(chunk.max_seq_len), "seq_lens": _rows(chunk.seq_lens),
           "token_to_seq": _rows(chunk.token_to_seq), "num_local_context_tokens": int(num_local),
           "padded_local_seq_lens": _ints(chunk.padded_local_seq_lens),
           "local_context_lens_allranks": _nested(chunk.local_context_lens_allranks),
           "padded_local_cu_seq_lens": _rows(chunk.padded_local_cu_seq_lens),
           "padded_local_token_to_seq": _rows(chunk.padded_local_token_to_seq),
           "local_starts": _ints(chunk.local_starts)}
    if active is not None:
        out["all_rows_active"] = active
    return out


def builder_model(ctx: Context, case: BuilderCase) -> Any:
    md = build_mla_chunked_context_metadata(case.context_lens, case.query_start_loc, case.workspace_size,
                                            case.block_size, dcp=case.dcp,
                                            align_chunk_to_block=case.align_chunk_to_block)
    if md is None:
        return None
    dcp = case.dcp is not None
    active = ctx.state["all_rows_active"]
    return {"context_lens": _rows(md.context_lens), "context_lens_list": list(md.context_lens),
            "empty_token_slices": [[s.start, s.stop] for s in md.empty_token_slices],
            "workspace_is_the_given_one": True, "dcp_manager_is_the_given_one": True,
            "chunks": [chunk_answer(c, starts=c.local_starts if dcp else c.starts,
                                    num_local=c.num_local_context_tokens if dcp else c.num_context_tokens,
                                    active=c.all_rows_active if active else None) for c in md.chunks]}


def builder_upstream(ctx: Context, case: BuilderCase) -> Any:
    import torch

    manager = ctx.state["manager"] if case.dcp_manager else None
    kwargs = {"align_indptr": case.align_indptr} if ctx.state["align_indptr"] else {}
    md = ctx.up.build_mla_chunked_context_metadata(
        context_lens_cpu=torch.tensor(case.context_lens),
        prefill_query_start_loc_cpu=torch.tensor(case.query_start_loc),
        chunked_prefill_workspace=ctx.state["workspace"], chunked_prefill_workspace_size=case.workspace_size,
        block_size=case.block_size, align_chunk_to_block=case.align_chunk_to_block, device=torch.device("cpu"),
        dcp_world_size=case.dcp_world_size, dcp_local_block_size=case.dcp_interleave,
        dcp_virtual_block_size=case.dcp_world_size * case.dcp_interleave, dcp_manager=manager, **kwargs)
    ctx.state["indptr_offsets"] = []
    if md is None:
        return None
    active = ctx.state["all_rows_active"]
    ctx.state["indptr_offsets"] = [(c.index, name, view.storage_offset()) for c in md.chunks
                                   for name, view in (("query_start_loc", c.query_start_loc),
                                                      ("cu_seq_lens", c.cu_seq_lens),
                                                      ("padded_local_cu_seq_lens", c.padded_local_cu_seq_lens))
                                   if view is not None]
    return {"context_lens": _rows(md.context_lens), "context_lens_list": list(md.context_lens_list),
            "empty_token_slices": [[s.start, s.stop] for s in md.empty_token_slices],
            "workspace_is_the_given_one": md.workspace is ctx.state["workspace"],
            "dcp_manager_is_the_given_one": md.dcp_manager is manager,
            "chunks": [chunk_answer(c, starts=c.starts, num_local=c.num_local_context_tokens,
                                    active=bool(c.all_rows_active) if active else None) for c in md.chunks]}


def check_indptr_alignment(ctx: Context, case: BuilderCase, answer: Any) -> None:
    """With `align_indptr`, every chunk's int32 indptr views (query_start_loc, cu_seq_lens, and under DCP
    padded_local_cu_seq_lens) start a multiple of 16 bytes into their buffer (CuTe DSL's requirement)."""
    if not case.align_indptr or not ctx.state["align_indptr"]:
        return
    for index, name, offset in ctx.state.get("indptr_offsets", ()):
        if offset % 4:
            raise PropertyViolation(f"chunk {index} {name}: expected an offset of a multiple of 4 int32 elements "
                                    f"(16 bytes), got {offset}")


def prepare_builder(ctx: Context) -> None:
    """The release's signature (with or without `align_indptr`) and `ContextChunk` fields; the workspace and
    DCP-manager objects handed over."""
    import inspect

    import torch

    fn = ctx.up.build_mla_chunked_context_metadata
    where = f"{RELPATH}:build_mla_chunked_context_metadata"
    params = tuple(inspect.signature(fn).parameters)
    ctx.state["align_indptr"] = params == BUILDER_PARAMS + (ALIGN_INDPTR,)
    if not ctx.state["align_indptr"]:
        check_signature(fn, BUILDER_PARAMS, where)
    chunk_fields = {f.name for f in dataclasses.fields(ctx.up.MLACommonPrefillMetadata.ContextChunk)}
    ctx.state["all_rows_active"] = "all_rows_active" in chunk_fields
    ctx.state["workspace"], ctx.state["manager"] = torch.empty(0), SimpleNamespace(name="dcp manager stand-in")


def builder_loading(upstream: Any, up: SimpleNamespace) -> dict[str, Any]:
    """CPU stand-ins: no pinned memory, a host-to-device copy that is a plain tensor (0.28.0's pinned helper too)."""
    import torch

    def h2d(data: Any, device: Any = None, dtype: Any = None, out: Any = None) -> Any:
        return torch.as_tensor(data, dtype=dtype)

    return {"extra_globals": {"PIN_MEMORY": False, "async_tensor_h2d": h2d, "np_to_pinned_tensor": torch.from_numpy}}


def describe_builder(ctx: Context, case: BuilderCase) -> dict[str, Any]:
    return {"context_lens": list(case.context_lens), "query_lens": list(case.query_lens),
            "workspace": case.workspace_size, "block": case.block_size,
            "align_chunk_to_block": case.align_chunk_to_block,
            "dcp": [case.dcp_world_size, case.dcp_interleave], "align_indptr": case.align_indptr,
            "dcp_manager": case.dcp_manager}


BUILDER = Differential(
    loading=builder_loading, prepare=prepare_builder, inputs=lambda ctx: builder_cases(),
    model=builder_model, upstream=builder_upstream, compare=REFUSALS, describe=describe_builder,
    checks=(Check("indptr_slices_are_16_byte_aligned", check_indptr_alignment),))


# -- the workspace lower bound ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkspaceCase:
    """A requested workspace and the configuration the bound reads (an interleave without DCP included)."""

    workspace_size: int
    max_num_seqs: int
    block_size: int
    dcp_world_size: int
    dcp_interleave: int

    @property
    def dcp(self) -> DcpConfig | None:
        return dcp_of(self.dcp_world_size, self.dcp_interleave)


WORKSPACE_CASES = st.builds(  # three in four under DCP; blocks the interleave need not divide
    WorkspaceCase, workspace_size=st.one_of(st.integers(1, 300), st.integers(1, 70_000)),
    max_num_seqs=st.integers(1, 1024), block_size=st.sampled_from((1, 2, 4, 8, 16, 32, 64, 128, 3, 12)),
    dcp_world_size=st.sampled_from((1, 2, 4, 8)), dcp_interleave=st.sampled_from((1, 2, 4, 8, 16, 64)))


def workspace_upstream(ctx: Context, case: Any) -> int:
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=case.block_size),
                             scheduler_config=SimpleNamespace(max_num_seqs=case.max_num_seqs),  # read before #51733
                             parallel_config=SimpleNamespace(decode_context_parallel_size=case.dcp_world_size,
                                                             cp_kv_cache_interleave_size=case.dcp_interleave))
    return ctx.up.align_mla_chunked_context_workspace_size(config, case.workspace_size)


def explain_workspace(ctx: Context, case: Any, model: Any, upstream: Any) -> str:
    known = upstream == chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size,
                                                       case.dcp, B38E111D)
    return PRE_51733 if known else ""


def describe_workspace(ctx: Context, case: Any) -> dict[str, Any]:
    return {"workspace_size": case.workspace_size, "max_num_seqs": case.max_num_seqs, "block": case.block_size,
            "dcp": [case.dcp_world_size, case.dcp_interleave]}


WORKSPACE = Differential(
    prepare=lambda ctx: check_signature(ctx.up.align_mla_chunked_context_workspace_size, WORKSPACE_PARAMS,
                                        f"{RELPATH}:align_mla_chunked_context_workspace_size"),
    inputs=lambda ctx: WORKSPACE_CASES,
    model=lambda ctx, case: chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size,
                                                           case.dcp, FIXED),
    upstream=workspace_upstream, describe=describe_workspace, explain=explain_workspace)
