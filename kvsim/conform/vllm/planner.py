"""vLLM's MLA chunked-context planner (`mla_attention.py`) against the `mla-chunks` model: three adapters.

* `PLANNER` (`plan_mla_context_chunks`): the pure planner, both sides called with the arguments the model's
  builder derives for a `PLAN_CASES` case on the model's aligned workspace; the plans compared field by field;
  the model's planner properties checked on upstream's plans. Conventions: upstream returns lists, the model
  tuples; `request_slice` = [request_start, request_end); upstream's assertion equals the model's refusal.
* `ARGUMENTS` (`mla_chunk_arguments`): the arguments `build_mla_chunked_context_metadata` hands the planner
  (alignment, row budget, max_context_chunk, padded_rows), captured from upstream's builder and compared with
  the model's builder, with `align_chunk_to_block` drawn freely (also under DCP). Convention: upstream takes
  `dcp_local_block_size` = the model's interleave, `dcp_virtual_block_size` = world * interleave.
* `WORKSPACE` (`align_mla_chunked_context_workspace_size`): the workspace lower bound. Convention: upstream
  reads block, DCP world and interleave from a `VllmConfig` (a stand-in with those three fields, and
  `max_num_seqs`, which only a pre-#51733 source reads); the model takes `max_num_seqs` as an argument.

Settled: vllm#51733 (0.28.0 and later) dropped the `max_num_seqs * alignment` term of b38e111d's workspace
lower bound; the model's `fixed` follows it (`MlaVariant.workspace_seq_term`). A source that still has the term
(b38e111d before #51733, never released) is said so in the divergence's note.
Settled: under DCP with `align_chunk_to_block=False` upstream aligns splits to lcm(1, world * interleave): a
model bug, fixed (`chunk_plan_arguments`, `test_dcp_without_block_alignment_aligns_splits_to_the_interleave_only`).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Callable

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_chunks.metadata import build_mla_chunked_context_metadata, chunk_plan_arguments
from kvsim.models.mla_chunks.planner import FIXED, chunked_context_workspace_size, plan_mla_context_chunks
from kvsim.properties.mla_chunks import plan as props
from kvsim.properties.mla_chunks.strategies import DCP_CASES, PLAN_CASES, WORKSPACE_CASES

from ..loader import check_signature

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
PLANNER_PARAMS = ("context_lens", "row_budget", "max_context_chunk", "split_alignment", "padded_rows")
WORKSPACE_PARAMS = ("vllm_config", "workspace_size")
REFUSALS = Exact(refusals=("AssertionError", "ZeroDivisionError"))
B38E111D = replace(FIXED, name="b38e111d", workspace_seq_term=True)
PRE_51733 = ("upstream keeps b38e111d's max_num_seqs * alignment term (before vllm#51733): the model's "
             "MlaVariant.workspace_seq_term=True, not `fixed`")


def workspace(case: Any) -> int:
    return chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size, case.dcp, FIXED)


def arguments(case: Any, aligned: int | None = None) -> tuple[list[int], int, int, int, Callable[[int], int] | None]:
    """(context_lens, row budget, max_context_chunk, alignment, padded_rows) as the model's builder derives them
    on the `aligned` workspace (default: the model's)."""
    alignment, budget, mcc, pad = chunk_plan_arguments(workspace(case) if aligned is None else aligned,
                                                       case.block_size, case.dcp, case.align_chunk_to_block)
    return list(case.context_lens), budget, mcc, alignment, pad


def planned(ctx: Context, case: Any) -> tuple[list[int], int, int, int, Callable[[int], int] | None]:
    """The planner's arguments on upstream's own aligned workspace (computed once per case)."""
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
    `aligned` workspace (default: the model's)."""
    w = workspace(case) if aligned is None else aligned
    bound = props.chunk_count_upper_bound(case.context_lens, w, alignment, case.dcp)
    if bound is not None and len(chunks) > bound:
        raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {w}, alignment "
                                f"{alignment}: expected <= {bound}, got {len(chunks)}")


PLAN_CHECKS = (
    _plan_check("chunks_tile_every_context_row_once", lambda c, ch, a, b, pad: props.check_exact_tiling(c.context_lens, ch)),
    _plan_check("chunks_have_no_empty_spans", lambda c, ch, a, b, pad: props.check_no_empty_spans(ch)),
    _plan_check("chunks_follow_request_order", lambda c, ch, a, b, pad: props.check_request_order(c.context_lens, ch)),
    _plan_check("continuation_only_at_first_request", lambda c, ch, a, b, pad: props.check_continuation(ch)),
    _plan_check("chunk_starts_are_aligned", lambda c, ch, a, b, pad: props.check_alignment(ch, a)),
    _plan_check("chunks_fit_the_row_budget", lambda c, ch, a, b, pad: check_padded_budget(ch, b, pad)),
    _plan_check("chunk_count_within_alignment_slack", check_chunk_count),
)


def _plannable(case: Any) -> bool:
    return arguments(case)[2] > 0


PLANNER = Differential(
    prepare=lambda ctx: check_signature(ctx.up.plan_mla_context_chunks, PLANNER_PARAMS,
                                        f"{RELPATH}:plan_mla_context_chunks"),
    inputs=lambda ctx: PLAN_CASES.filter(_plannable),
    model=planner_model, upstream=planner_upstream, compare=REFUSALS, describe=describe_plan, checks=PLAN_CHECKS)


# -- the arguments the builder hands the planner --------------------------------------------------------------

class Captured(Exception):
    """Raised by the stand-in planner once it has the builder's arguments."""


def padded_samples(case: Any, pad: Callable[[int], int] | None) -> list[int]:
    limit = 4 * max(case.context_lens) + 64
    return [(pad or (lambda r: r))(r) for r in range(0, limit, 1 + limit // 64)]


def arguments_model(ctx: Context, pair: Any) -> Any:
    case = pair
    build_mla_chunked_context_metadata(case.context_lens, case.query_start_loc, workspace(case), case.block_size,
                                       dcp=case.dcp, align_chunk_to_block=case.align_chunk_to_block)  # may refuse
    alignment, budget, mcc, pad = chunk_plan_arguments(workspace(case), case.block_size, case.dcp,
                                                       case.align_chunk_to_block)
    return {"row_budget": budget, "max_context_chunk": mcc, "split_alignment": alignment,
            "padded_rows": padded_samples(case, pad)}


def arguments_upstream(ctx: Context, case: Any) -> Any:
    import torch

    captured: list[tuple] = []

    def capture(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows):
        captured.append((row_budget, max_context_chunk, split_alignment, padded_rows))
        raise Captured

    builder = ctx.up.build_mla_chunked_context_metadata
    builder.__globals__["plan_mla_context_chunks"] = capture
    try:
        builder(context_lens_cpu=torch.tensor(case.context_lens),
                prefill_query_start_loc_cpu=torch.tensor(case.query_start_loc), chunked_prefill_workspace=None,
                chunked_prefill_workspace_size=workspace(case), block_size=case.block_size,
                align_chunk_to_block=case.align_chunk_to_block, device=torch.device("cpu"),
                dcp_world_size=case.dcp_world_size, dcp_local_block_size=case.dcp_interleave,
                dcp_virtual_block_size=case.dcp_world_size * case.dcp_interleave)
    except Captured:
        pass
    if not captured:
        return {"planner": "not called"}
    budget, mcc, alignment, pad = captured[0]
    return {"row_budget": budget, "max_context_chunk": mcc, "split_alignment": alignment,
            "padded_rows": padded_samples(case, pad)}


def describe_arguments(ctx: Context, case: Any) -> dict[str, Any]:
    return {"context_lens": list(case.context_lens), "workspace": workspace(case), "block": case.block_size,
            "dcp": [case.dcp_world_size, case.dcp_interleave], "align_chunk_to_block": case.align_chunk_to_block}


def _free_alignment(pair: tuple[Any, bool]) -> Any:
    case, align = pair
    return replace(case, align_chunk_to_block=align)


ARGUMENTS = Differential(
    inputs=lambda ctx: st.tuples(PLAN_CASES, st.booleans()).map(_free_alignment)
    .filter(lambda c: max(c.context_lens) > 0),
    model=arguments_model, upstream=arguments_upstream, compare=Exact(refusals=("AssertionError",)),
    describe=describe_arguments)


# -- the workspace lower bound ----------------------------------------------------------------------------------

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
    inputs=lambda ctx: st.one_of(WORKSPACE_CASES, PLAN_CASES, DCP_CASES),
    model=lambda ctx, case: chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size,
                                                           case.dcp, FIXED),
    upstream=workspace_upstream, describe=describe_workspace, explain=explain_workspace)

