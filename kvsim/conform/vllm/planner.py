"""vLLM MLA chunked-context planner (`mla_attention.py`) against the `mla-chunks` model.

Three targets, one per upstream definition:

* `plan_mla_context_chunks`: the pure planner, both sides called with the same arguments
  (derived by the model from a `PLAN_CASES` case); plans compared field by field, and the
  model's planner properties checked on upstream's plans.
  Convention: upstream returns lists, the model tuples; `request_slice` = [request_start, request_end).
* `mla_chunk_arguments`: the arguments `build_mla_chunked_context_metadata` hands the planner
  (alignment, row budget, max_context_chunk, padded_rows), captured from upstream's builder
  and compared with the model's builder, both on upstream's aligned workspace, with
  `align_chunk_to_block` drawn freely (also under DCP). Convention: upstream takes
  `dcp_local_block_size` = the model's interleave, `dcp_virtual_block_size` = world * interleave.
* `align_mla_chunked_context_workspace_size`: the workspace lower bound. Convention: upstream
  reads block, DCP world and interleave from a `VllmConfig` (the adapter passes a stand-in with
  those three fields, and `max_num_seqs`, which only a pre-#51733 source reads); the model takes
  `max_num_seqs` as an argument (read only by a variant with `workspace_seq_term`).

Settled: vllm#51733 (in 0.28.0 and later) dropped the `max_num_seqs * alignment` term of b38e111d's
workspace lower bound; the model's `fixed` follows it (`MlaVariant.workspace_seq_term`, False on `fixed`,
regression test `test_workspace_drops_the_max_num_seqs_term_as_vllm_51733`). A source that still has the
term (b38e111d before #51733, never released) is reported as that, not as an unknown divergence.

Settled: under DCP with `align_chunk_to_block=False` upstream aligns splits to
lcm(1, world * interleave) where the model used lcm(block, world * interleave): a model bug, fixed
(`kvsim.models.mla_chunks.metadata.chunk_plan_arguments`, regression test
`test_dcp_without_block_alignment_aligns_splits_to_the_interleave_only`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Callable

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_chunks.metadata import chunk_plan_arguments
from kvsim.models.mla_chunks.planner import (FIXED, chunked_context_workspace_size, plan_mla_context_chunks,
                                             round_down)

from ..loader import check_signature, load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
PLANNER_PARAMS = ("context_lens", "row_budget", "max_context_chunk", "split_alignment", "padded_rows")
WORKSPACE_PARAMS = ("vllm_config", "workspace_size")
PRE_51733 = ("upstream keeps b38e111d's max_num_seqs * alignment term (before vllm#51733): the model's "
             "MlaVariant.workspace_seq_term=True, not `fixed`")


def load(source: EngineSource, names: list[str]) -> SimpleNamespace:
    return load_definitions(source.file(RELPATH), names, where=RELPATH, version=source.label)


def plan_key(plans: Any) -> Any:
    """Plans (upstream's or the model's) as comparable tuples; a refusal as ("refuses",)."""
    if isinstance(plans, BaseException):
        return ("refuses",)
    return [(p.request_start, p.request_end, tuple(p.starts), tuple(p.seq_lens), bool(p.is_continuation))
            for p in plans]


def call(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except (AssertionError, ConfigError, ZeroDivisionError) as exc:
        return exc


def model_arguments(case: Any, workspace: int) -> tuple[int, int, int, Callable[[int], int] | None]:
    """(alignment, row budget, max_context_chunk, padded_rows) as the model's builder derives them."""
    return chunk_plan_arguments(workspace, case.block_size, case.dcp, case.align_chunk_to_block)


def upstream_workspace(ns: SimpleNamespace, case: Any) -> int:
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=case.block_size),
                             scheduler_config=SimpleNamespace(max_num_seqs=case.max_num_seqs),  # read before #51733
                             parallel_config=SimpleNamespace(decode_context_parallel_size=case.dcp_world_size,
                                                             cp_kv_cache_interleave_size=case.dcp_interleave))
    return ns.align_mla_chunked_context_workspace_size(config, case.workspace_size)


class PlanView:
    """An upstream plan with the attributes the model's plan checks read."""

    def __init__(self, plan: Any) -> None:
        self.request_slice = slice(plan.request_start, plan.request_end)
        self.starts, self.seq_lens, self.is_continuation = tuple(plan.starts), tuple(plan.seq_lens), plan.is_continuation


def plan_property_checks() -> list[tuple[str, Callable]]:
    from kvsim.properties.mla_chunks import plan as props  # the model's own checks
    return [
        ("chunks_tile_every_context_row_once", lambda c, ch, a, b, pad, w: props.check_exact_tiling(c.context_lens, ch)),
        ("chunks_have_no_empty_spans", lambda c, ch, a, b, pad, w: props.check_no_empty_spans(ch)),
        ("chunks_follow_request_order", lambda c, ch, a, b, pad, w: props.check_request_order(c.context_lens, ch)),
        ("continuation_only_at_first_request", lambda c, ch, a, b, pad, w: props.check_continuation(ch)),
        ("chunk_starts_are_aligned", lambda c, ch, a, b, pad, w: props.check_alignment(ch, a)),
        ("chunks_fit_the_row_budget", lambda c, ch, a, b, pad, w: check_padded_budget(ch, b, pad)),
        ("chunk_count_within_alignment_slack", check_chunk_count),  # the b38e111d seed bug's property
    ]


def check_chunk_count(case: Any, chunks: list[PlanView], alignment: int, budget: int, pad: Any,
                      workspace: int) -> None:
    """The chunk-blowup bound of `chunk_count_within_alignment_slack`, on upstream's plan."""
    from kvsim.properties.mla_chunks.plan import chunk_count_upper_bound

    bound = chunk_count_upper_bound(case.context_lens, workspace, alignment, case.dcp)
    if bound is not None and len(chunks) > bound:
        raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {workspace}, alignment {alignment}: "
                                f"expected <= {bound}, got {len(chunks)}")


def check_padded_budget(chunks: list[PlanView], budget: int, pad: Callable[[int], int] | None) -> None:
    """The padded-row half of chunks_fit_the_row_budget (the rest reads metadata the planner does not make)."""
    pad = pad or (lambda rows: rows)
    for i, chunk in enumerate(chunks):
        rows = sum(pad(s + n) - pad(s) for s, n in zip(chunk.starts, chunk.seq_lens))
        if rows > budget:
            raise PropertyViolation(f"padded rows of chunk {i}: expected <= row budget {budget}, got {rows}")


def run_planner(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.mla_chunks.strategies import PLAN_CASES
    started = time.perf_counter()
    ns = load(source, ["plan_mla_context_chunks", "align_mla_chunked_context_workspace_size"])
    check_signature(ns.plan_mla_context_chunks, PLANNER_PARAMS, f"{RELPATH}:plan_mla_context_chunks")
    result = TargetResult("plan_mla_context_chunks", source.version)
    checks = plan_property_checks()
    failures: dict[str, str] = {}

    def check(case: Any) -> None:
        workspace = upstream_workspace(ns, case)
        alignment, budget, mcc, pad = model_arguments(case, workspace)
        if mcc <= 0:
            return
        args = (list(case.context_lens), budget, mcc, alignment, pad or (lambda rows: rows))
        model, upstream = call(plan_mla_context_chunks, *args[:4], pad), call(ns.plan_mla_context_chunks, *args)
        result.compared += 1
        if plan_key(model) != plan_key(upstream):
            result.diverge({"context_lens": case.context_lens, "row_budget": budget, "max_context_chunk": mcc,
                            "split_alignment": alignment, "dcp": [case.dcp_world_size, case.dcp_interleave]},
                           plan_key(model), plan_key(upstream))
        if isinstance(upstream, BaseException):
            return
        views = [PlanView(p) for p in upstream]
        for name, fn in checks:
            if name not in failures:
                try:
                    fn(case, views, alignment, budget, pad, workspace)
                except PropertyViolation as exc:
                    failures[name] = f"{exc} (context_lens {list(case.context_lens)}, W {workspace})"

    drive(PLAN_CASES, check, options)
    for name, _ in checks:
        result.prop(name, "fails" if name in failures else "holds", failures.get(name, ""))
    return result.finish(started)


def run_arguments(source: EngineSource, options: RunOptions) -> TargetResult:
    import torch
    from hypothesis import strategies as st

    from kvsim.models.mla_chunks.metadata import build_mla_chunked_context_metadata as model_build
    from kvsim.properties.mla_chunks.strategies import PLAN_CASES
    started = time.perf_counter()
    ns = load(source, ["build_mla_chunked_context_metadata", "align_mla_chunked_context_workspace_size"])
    result = TargetResult("mla_chunk_arguments", source.version)
    captured: list[tuple] = []

    class Captured(Exception):
        pass

    def capture(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows):
        captured.append((row_budget, max_context_chunk, split_alignment, padded_rows))
        raise Captured

    ns.build_mla_chunked_context_metadata.__globals__["plan_mla_context_chunks"] = capture

    def check(pair: Any) -> None:
        case = replace(pair[0], align_chunk_to_block=pair[1])
        if max(case.context_lens) <= 0:
            return
        workspace = upstream_workspace(ns, case)
        captured.clear()
        try:
            ns.build_mla_chunked_context_metadata(
                context_lens_cpu=torch.tensor(case.context_lens), prefill_query_start_loc_cpu=torch.tensor(
                    case.query_start_loc), chunked_prefill_workspace=None, chunked_prefill_workspace_size=workspace,
                block_size=case.block_size, align_chunk_to_block=case.align_chunk_to_block,
                device=torch.device("cpu"), dcp_world_size=case.dcp_world_size,
                dcp_local_block_size=case.dcp_interleave,
                dcp_virtual_block_size=case.dcp_world_size * case.dcp_interleave)
        except Captured:
            pass
        except AssertionError:
            captured.append("refuses")
        md = _model_md(model_build, case, workspace)
        alignment, budget, mcc, pad = model_arguments(case, workspace)
        up = captured[0] if captured else None
        result.compared += 1
        if up == "refuses" or up is None:
            model_view = "refuses" if isinstance(md, BaseException) else (budget, mcc, alignment)
            if model_view != "refuses":
                result.diverge(case_doc(case, workspace), model_view, "refuses")
            return
        limit = 4 * max(case.context_lens) + 64
        up_pad = [up[3](r) for r in range(0, limit, 1 + limit // 64)]
        model_pad = [(pad or (lambda r: r))(r) for r in range(0, limit, 1 + limit // 64)]
        if (budget, mcc, alignment) != up[:3] or up_pad != model_pad:
            result.diverge(case_doc(case, workspace), {"row_budget": budget, "max_context_chunk": mcc,
                                                       "split_alignment": alignment},
                           {"row_budget": up[0], "max_context_chunk": up[1], "split_alignment": up[2]},
                           "")

    drive(st.tuples(PLAN_CASES, st.booleans()), check, options)
    return result.finish(started)


def _model_md(model_build: Callable, case: Any, workspace: int) -> Any:
    try:
        return model_build(case.context_lens, case.query_start_loc, workspace, case.block_size, dcp=case.dcp,
                           align_chunk_to_block=case.align_chunk_to_block)
    except ConfigError as exc:
        return exc


def case_doc(case: Any, workspace: int) -> dict[str, Any]:
    return {"context_lens": case.context_lens, "workspace": workspace, "block": case.block_size,
            "dcp": [case.dcp_world_size, case.dcp_interleave], "align_chunk_to_block": case.align_chunk_to_block}


def run_workspace(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.mla_chunks.strategies import WORKSPACE_CASES, PLAN_CASES
    from hypothesis import strategies as st
    started = time.perf_counter()
    ns = load(source, ["align_mla_chunked_context_workspace_size"])
    check_signature(ns.align_mla_chunked_context_workspace_size, WORKSPACE_PARAMS,
                    f"{RELPATH}:align_mla_chunked_context_workspace_size")
    result = TargetResult("align_mla_chunked_context_workspace_size", source.version)
    b38e111d = replace(FIXED, name="b38e111d", workspace_seq_term=True)
    seq_term = 0

    def check(case: Any) -> None:
        nonlocal seq_term
        model = chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size, case.dcp, FIXED)
        upstream = upstream_workspace(ns, case)
        result.compared += 1
        if model != upstream:
            known = upstream == chunked_context_workspace_size(case.workspace_size, case.max_num_seqs,
                                                               case.block_size, case.dcp, b38e111d)
            seq_term += known
            result.diverge({"workspace_size": case.workspace_size, "max_num_seqs": case.max_num_seqs,
                            "block": case.block_size, "dcp": [case.dcp_world_size, case.dcp_interleave]},
                           model, upstream, PRE_51733 if known else "")

    drive(st.one_of(WORKSPACE_CASES, PLAN_CASES), check, options)
    if seq_term:
        result.note = f"{seq_term} divergent inputs are b38e111d's max_num_seqs term, which vllm#51733 dropped"
    return result.finish(started)


TARGETS = (
    Target("vllm", "plan_mla_context_chunks", RELPATH, ("plan_mla_context_chunks",), "mla-chunks",
           "planner differential on the model's PLAN_CASES (same arguments both sides) + the model's plan checks "
           "on upstream plans", run_planner),
    Target("vllm", "mla_chunk_arguments", RELPATH, ("build_mla_chunked_context_metadata", "plan_mla_context_chunks"),
           "mla-chunks", "alignment, row budget, max_context_chunk and padded_rows the builder passes the planner",
           run_arguments),
    Target("vllm", "align_mla_chunked_context_workspace_size", RELPATH, ("align_mla_chunked_context_workspace_size",),
           "mla-chunks", "workspace lower bound (model variant fixed) vs upstream", run_workspace),
)
