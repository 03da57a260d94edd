"""SGLang's prefill send plan (`disaggregation/prefill.py`) against `pd-staging`'s `plan_room_sends`.

What runs is upstream's own planner: `SchedulerDisaggregationPrefillMixin.send_kv_chunk` (0.5.23:
and `_send_kv_chunk`) and `maybe_send_cached_prefix_chunk`, with upstream's `staging_grid_tokens`,
`compute_grid_segments` and `kv_to_page_indices` (followed from their files), the sender's own
`CommonKVSender._prepare_send_indices` / `should_send_kv_chunk` (`common/conn.py`: `index_slice`,
`curr_idx`, `is_last_chunk`) and the prefill worker's `PrefillStagingStrategy.check_ready`
(`common/staging_handler.py`: `chunk_idx = index_slice.start // full_chunk_pages`). Stand-ins are
only the objects around them: a scheduler with `page_size`, an identity `req_to_token` row, no
state types, staging on; `envs.SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX` from the case; a
sender that records each `send` instead of queueing RDMA.

Conventions: the room is set up as upstream's `finalize_bootstrap` does (`start_send_idx = D`,
`sender.init(kv_to_page_num(L - D, ps))`, 0.5.19+: `disagg_decode_prefix_len = D`); the batch ends
are the model's `prefill_batch_ends` (the scheduler's chunking is not under test), and before each
batch `maybe_send_cached_prefix_chunk` runs, as `run_batch` does (the answer: every send, and `start_send_idx`
after each batch); a send's token range is
`[D + tokens sent before, + num_kv_tokens)`; the request has no state types, so the final send (of the last
batch) carries an empty state list and every other send none (`state` of a send: whether it carries the state;
where `is_last` fires early, before 05c7ebf with D not page-aligned, the state still rides on the final send).
Release -> variant (the declaration's table): before 0.5.18 `pre_05c7ebf`, 0.5.18 `fixed`, 0.5.19+
`sglang_0_5_23` (the plan reads none of the flags it differs from `fixed` in); a source whose
`common/staging_buffer.py` has no `compute_grid_segments` (a tree before 05c7ebf) follows `pre_05c7ebf`
whatever it says (`prepare`). The grid helpers `staging_grid_tokens` and `compute_grid_segments` are the
release's own, loaded in `prepare` where the release has them (not declared: 0.5.13-0.5.17 lack them).

`PLAN` (`send_plan`): a differential on the model's `ANY_PREFIX_PLAN_CASES` (decode prefix D any token
count), the research note's scenarios A, B and D pinned; every send compared field by field. The plan
properties (`properties.pd_staging.plan`) then run as checks with upstream's plan in the model's place.
Refused (counted in the note, not compared): on releases with 05c7ebf, a D that is not a whole number of
pages (decode fails the room at registration, S13, so no plan of it is ever scattered).

Coverage and survivors: the checked methods also hold what the model has no counterpart of, so no input runs it
and its mutants survive (not documented: reachable upstream, outside pd-staging): the KV checksum of the last
chunk (`send_kv_chunk` with a checksum computer), the state payloads of hybrid models (`_send_kv_chunk`'s
MAMBA/SWA/DSA/... closures), host-tensor page indices, DCP/CP shard filtering (`_prepare_send_indices`), the
overlap event of the early send, and a send not allowed (`allow_send=False`, pending bootstrap). Documented
(`SEND_PLAN_SURVIVORS`, each with its reason): min's and max's arguments swapped, and the mutants whose only change
is outside pd-staging's plan (staging off, a snapshot re-taken under overlap scheduling, an empty non-last send
that only enters the room in `disagg_prefill_pending_chunk_rids`, a metadata-only last send).

Settled divergence (pre-05c7ebf, D not page-aligned): upstream counts a send's pages as
`len(req_to_token[start:end][::ps]) = ceil((end - start) / ps)`; the model's `plan.send_pages` counted
`ceil((end - D) / ps) - (start - D) // ps`, one page more on every send after the first when D is not
page-aligned, so its `is_last` never fired or fired early. A model bug, fixed (regression test
`test_pre_fix_send_counts_pages_from_its_start_as_sglang_did`). Upstream's own count still overshoots N
in some unaligned cases before 05c7ebf (its S3 fails: `exactly_one_last_send[D not page-aligned]`, a
finding 05c7ebf removed by failing such rooms at registration).
"""

from __future__ import annotations

import types
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging import plan
from kvsim.models.pd_staging.variants import VARIANTS, StagingVariant

from ..loader import Inert, Partial, load_definitions, names_in
from .layout import msgspec_stand_in

PREFILL = "sglang/srt/disaggregation/prefill.py"
CONN = "sglang/srt/disaggregation/common/conn.py"
HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
BUFFER = "sglang/srt/disaggregation/common/staging_buffer.py"
COMMON = "sglang/srt/mem_cache/common.py"
MIXIN = "SchedulerDisaggregationPrefillMixin"
GRID = ("staging_grid_tokens", "compute_grid_segments")
PLAN_PROPERTIES = ("non_last_sends_end_on_grid", "each_send_fits_one_slot", "sends_partition_suffix",
                   "exactly_one_last_send", "send_cursor_monotone", "early_send_within_snapshot")
MISALIGNED_S3 = "exactly_one_last_send[D not page-aligned]"  # upstream finding before 05c7ebf


# The run's grid helpers and knobs, set by `prepare`: the stand-in modules are fixed when a file loads, before the
# helpers are (they are not in every release), and the knobs change with each case.
_RUN: ContextVar[dict[str, Any]] = ContextVar("kvsim_send_plan_run", default={})


class _RunModule:
    """An engine module as the loaded files import it (at the top or inside a function): each name is the run's
    value of it, looked up when it is used (`_Late`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return _Late(self.name, attr)


class _Late:
    """A name of a `_RunModule`: calls and attribute reads go to the run's value."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def value(self) -> Any:
        """The run's value; before `prepare` (a file's own top level using it), an inert stub, as the loader's."""
        found = _RUN.get().get(self.module, {})
        return found[self.name] if self.name in found else Inert(f"{self.module}.{self.name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.value()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.value(), attr)


BUFFER_MODULE, ENVIRON, RUNTIME = ("sglang.srt.disaggregation.common.staging_buffer", "sglang.srt.environ",
                                   "sglang.srt.runtime_context")


def loading(upstream: Any, up: types.SimpleNamespace) -> dict[str, Any]:
    """The connection classes' `msgspec` stand-in, and the run's grid helpers, `envs` and `get_schedule`; the
    planner with upstream's own page helpers (loaded first)."""
    if upstream.file == COMMON:
        _RUN.set({})  # a new run: no names of the one before, until `prepare`
        return {}
    modules = {**msgspec_stand_in(), **{name: _RunModule(name) for name in (BUFFER_MODULE, ENVIRON, RUNTIME)}}
    extra = {"_is_npu": False, "kv_to_page_indices": up.kv_to_page_indices, "kv_to_page_num": up.kv_to_page_num} \
        if upstream.file == PREFILL else {}
    return {"modules": modules, "extra_globals": extra}


def prepare(ctx: Context) -> None:
    """The release's grid helpers and the knobs the planner reads (`envs`, `get_schedule`), from the case being
    run; the model variant of a source without `compute_grid_segments`; the methods driven."""
    grid = [n for n in GRID if n in names_in(ctx.source.file(BUFFER))] if ctx.source.has(BUFFER) else []
    helpers = vars(load_definitions(ctx.source.file(BUFFER), grid, where=BUFFER, version=ctx.source.label)) \
        if grid else {}
    knobs = ctx.state["knobs"] = {"cps": None, "early_send": True}
    flag = types.SimpleNamespace(get=lambda: knobs["early_send"])
    _RUN.set({BUFFER_MODULE: helpers,
              ENVIRON: {"envs": Partial("envs", {"SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": flag})},
              RUNTIME: {"get_schedule": lambda: types.SimpleNamespace(chunked_prefill_size=knobs["cps"])}})
    ctx.state["variant"] = ctx.variant if "compute_grid_segments" in grid else VARIANTS["pre_05c7ebf"]
    for cls, name in ((ctx.up.SchedulerDisaggregationPrefillMixin, "send_kv_chunk"),
                      (ctx.up.CommonKVSender, "_prepare_send_indices"), (ctx.up.CommonKVSender, "should_send_kv_chunk"),
                      (ctx.up.PrefillStagingStrategy, "check_ready")):
        # maybe_send_cached_prefix_chunk: since 0.5.15 (no early send before)
        if not callable(getattr(cls, name, None)):
            raise ConfigError(f"{cls.__name__}.{name}", "a method (the upstream planner's shape)",
                              f"absent in {ctx.source.label}")


def upstream_plan(ctx: Context, case: Any) -> tuple[list[plan.SendCall], list[bool], list[int]]:
    """Upstream's sends of one room as model `SendCall`s, whether each carries the state, and `start_send_idx`
    before the first call and after each batch."""
    import torch

    up, cfg = ctx.up, case.cfg
    ps, d, length = cfg.page_size, cfg.decode_prefix_len, cfg.prompt_len
    ctx.state["knobs"].update(cps=cfg.chunked_prefill_size, early_send=case.early_send)
    sends: list[plan.SendCall] = []
    carries: list[bool] = []
    state = {"tokens": d, "early": False}
    kv_mgr = types.SimpleNamespace(enable_all_cp_ranks_for_transfer=False, is_dummy_cp_rank=False, kv_shard_size=1,
                                   _dcp_pack_max_tokens=None, transfer_infos={},
                                   kv_buffer_tensors={"page_size": ps},
                                   server_args=types.SimpleNamespace(chunked_prefill_size=cfg.chunked_prefill_size))
    strategy = up.PrefillStagingStrategy(kv_mgr, None)
    no_staging = types.SimpleNamespace(staging=None, mooncake_session_id=None)

    class Sender(up.CommonKVSender):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:  # upstream's __init__ connects to the bootstrap server
            self.kv_mgr, self.curr_idx, self.bootstrap_room = kv_mgr, 0, 0

        def send(self, kv_indices: Any, state_indices: Any = None, num_kv_tokens: Any = None, **_: Any) -> None:
            _, index_slice, is_last, skip = self._prepare_send_indices(kv_indices, state_indices)
            chunk_idx = strategy.check_ready(no_staging, index_slice.start, len(kv_indices))[1]
            start = state["tokens"]
            end = None if num_kv_tokens is None else start + num_kv_tokens  # before 0.5.15: filled in by `after`
            state["tokens"] = end
            sends.append(plan.SendCall(start, end, index_slice.start, len(kv_indices), chunk_idx,
                                       bool(is_last), early=state["early"]))
            carries.append(state_indices is not None)

    class Scheduler(up.SchedulerDisaggregationPrefillMixin):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.token_to_kv_pool_allocator = types.SimpleNamespace(
                page_size=ps, translate_kv_indices_for_transfer=lambda kv: kv)
            self.req_to_token_pool = types.SimpleNamespace(req_to_token=torch.arange(length).reshape(1, length))
            self.enable_staging, self.enable_overlap, self.kv_checksum_computer = True, False, None
            self.disagg_metadata_buffers = types.SimpleNamespace(set_buf=lambda req: None)
            self.disagg_prefill_bootstrap_queue = types.SimpleNamespace(kv_manager=types.SimpleNamespace(
                kv_args=types.SimpleNamespace(state_types=[])))
            self.disagg_prefill_pending_chunk_rids = set()

    sender = Sender()
    sender.init(up.kv_to_page_num(length - d, ps), 0)  # finalize_bootstrap
    req = types.SimpleNamespace(
        rid="room", origin_input_ids=[0] * length, start_send_idx=d, disagg_decode_prefix_len=d,
        early_send_prefix_end=None, prefix_indices=[0] * case.prefill_hit, prefix_len=case.prefill_hit,
        host_hit_length=case.host_hit_length, pending_bootstrap=False, req_pool_idx=0,
        kv=types.SimpleNamespace(req_pool_idx=0), disagg_kv_sender=sender,
        extend_range=types.SimpleNamespace(end=0), extend_end=0, fill_len=0)
    sched = Scheduler()
    cursors = [req.start_send_idx]

    def after() -> None:
        """Releases whose `send` has no `num_kv_tokens` send once per call: it ends at the new `start_send_idx`."""
        if state["tokens"] is None:
            sends[-1] = replace(sends[-1], token_end=req.start_send_idx)
            state["tokens"] = req.start_send_idx

    for end in plan.prefill_batch_ends(cfg, case.prefill_hit):
        state["early"] = True
        if hasattr(sched, "maybe_send_cached_prefix_chunk"):
            sched.maybe_send_cached_prefix_chunk(req)
            after()
        state["early"] = False
        req.extend_range.end = req.extend_end = req.fill_len = end  # the batch end, per release
        sched.send_kv_chunk(req, last_chunk=end == length)
        after()
        cursors.append(req.start_send_idx)
    return sends, carries, cursors


def rows(sends: Any, carries: Any) -> list[dict[str, Any]]:
    return [{"token_start": s.token_start, "token_end": s.token_end, "page_start": s.page_start,
             "num_pages": s.num_pages, "chunk_idx": s.chunk_idx, "is_last": s.is_last, "early": s.early,
             "state": bool(c)} for s, c in zip(sends, carries)]


def upstream(ctx: Context, case: Any) -> dict[str, Any]:
    sends, carries, cursors = upstream_plan(ctx, case)
    return {"sends": rows(sends, carries), "start_send_idx": cursors[1:]}


def model(ctx: Context, case: Any) -> dict[str, Any]:
    room = case.plan(ctx.state["variant"])
    batches = len(room.batch_ends)
    final = len(room.sends) - 1  # the state rides on the last batch's final send (is_last only where they agree)
    return {"sends": rows(room.sends, [i == final for i in range(len(room.sends))]),
            "start_send_idx": [c.start_send_idx for c in room.cursors[len(room.cursors) - batches:]]}


class UpstreamCase:
    """A `PlanCase` whose `plan(variant)` is upstream's (for running the model's plan properties on the real code)."""

    def __init__(self, case: Any, answer: dict[str, Any]) -> None:
        self._case = case
        self._sends = tuple(plan.SendCall(r["token_start"], r["token_end"], r["page_start"], r["num_pages"],
                                          r["chunk_idx"], r["is_last"], r["early"]) for r in answer["sends"])
        self._cursors = (case.decode_prefix_len,) + tuple(answer["start_send_idx"])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._case, name)

    def plan(self, variant: StagingVariant = VARIANTS.fixed) -> plan.RoomPlan:
        cfg = self._case.cfg
        cursors = []
        for c in self._cursors:  # curr_idx after each call: the pages sent before start_send_idx
            cursors.append(plan.SendCursor(c, sum(s.num_pages for s in self._sends if s.token_end <= c)))
        return plan.RoomPlan(self._sends, tuple(cursors), plan.prefill_batch_ends(cfg, self._case.prefill_hit),
                             plan.prefetch_plan(cfg.suffix_pages, cfg.full_chunk_pages))


def aligned(case: Any) -> bool:
    return case.decode_prefix_len % case.page_size == 0


def plan_check(name: str) -> Check:
    """A plan property on upstream's plan (the properties draw page-aligned rooms only)."""
    from kvsim.properties.pd_staging import plan as plan_properties

    prop = getattr(plan_properties, name)

    def check(ctx: Context, case: Any, answer: dict[str, Any]) -> None:
        if aligned(case):
            prop.fn(UpstreamCase(case, answer), ctx.state["variant"])
    return Check(name, check)


def misaligned_s3(ctx: Context, case: Any, answer: dict[str, Any]) -> None:
    """S3 on the rooms with D not page-aligned (only releases before 05c7ebf plan them)."""
    from kvsim.properties.pd_staging import plan as plan_properties

    if not aligned(case):
        plan_properties.exactly_one_last_send.fn(UpstreamCase(case, answer), ctx.state["variant"])


def accepted(ctx: Context, case: Any) -> bool:
    """The room is planned on this release (05c7ebf fails one whose D is not page-aligned at registration)."""
    ok = plan.staging_prefix_accepted(case.decode_prefix_len, case.page_size, ctx.state["variant"])
    ctx.count("misaligned" if ok and not aligned(case) else "planned" if ok else "refused")
    return ok


def inputs(ctx: Context) -> Any:
    from kvsim.properties.pd_staging.strategies import ANY_PREFIX_PLAN_CASES

    return ANY_PREFIX_PLAN_CASES.filter(lambda case: accepted(ctx, case))


def pinned(ctx: Context) -> list[Any]:
    from kvsim.properties.pd_staging import cases

    return [c for c in (cases.SCENARIO_A_EARLY, cases.SCENARIO_B, cases.SCENARIO_D) + tuple(cases.PINNED)
            if plan.staging_prefix_accepted(c.decode_prefix_len, c.page_size, ctx.state["variant"])]


def describe(ctx: Context, case: Any) -> dict[str, Any]:
    return {"L": case.prompt_len, "D": case.decode_prefix_len, "ps": case.page_size,
            "cps": case.chunked_prefill_size, "prefill_hit": case.prefill_hit, "host_hit": case.host_hit_length,
            "early_send": case.early_send}


def note(ctx: Context) -> str:
    return (f"model variant {ctx.state['variant'].name}; {ctx.counts.get('misaligned', 0)} inputs drawn with D not "
            f"page-aligned; {ctx.counts.get('refused', 0)} refused (D not page-aligned: the room fails at "
            f"registration)")


PLAN = Differential(
    loading=loading, prepare=prepare, inputs=inputs, pinned=pinned, model=model, upstream=upstream,
    describe=describe, note=note,
    checks=tuple(plan_check(name) for name in PLAN_PROPERTIES) + (Check(MISALIGNED_S3, misaligned_s3),))
