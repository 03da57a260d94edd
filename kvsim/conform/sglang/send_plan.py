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
batch `maybe_send_cached_prefix_chunk` runs, as `run_batch` does; a send's token range is
`[D + tokens sent before, + num_kv_tokens)`. Release -> variant: no `compute_grid_segments` in
`common/staging_buffer.py` is `pre_05c7ebf`, otherwise the ring target's `release_variant`
(`sglang_0_5_23` for 0.5.19+; the plan reads none of the flags it differs from `fixed` in).

Inputs: the model's `ANY_PREFIX_PLAN_CASES` (decode prefix D any token count) plus the research
note's scenarios A, B and D. The plan properties (`properties.pd_staging.plan`) then run with
upstream's plan in the model's place. Refused (listed, not compared): on releases with 05c7ebf, a
D that is not a whole number of pages (decode fails the room at registration, S13, so no plan
of it is ever scattered).

Settled divergence (pre-05c7ebf, D not page-aligned): upstream counts a send's pages as
`len(req_to_token[start:end][::ps]) = ceil((end - start) / ps)`; the model's `plan.send_pages` counted
`ceil((end - D) / ps) - (start - D) // ps`, one page more on every send after the first when D is not
page-aligned, so its `is_last` never fired or fired early. A model bug, fixed (regression test
`test_pre_fix_send_counts_pages_from_its_start_as_sglang_did`). Upstream's own count still overshoots N
in some unaligned cases before 05c7ebf (its S3 fails: `exactly_one_last_send[D not page-aligned]`, a
finding 05c7ebf removed by failing such rooms at registration).
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, replace
from typing import Any

from kvsim.engine.errors import KvsimError
from kvsim.models.pd_staging import plan
from kvsim.models.pd_staging.variants import VARIANTS, StagingVariant

from ..loader import Partial, load_definitions, names_in
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .ring import release_variant

PREFILL = "sglang/srt/disaggregation/prefill.py"
CONN = "sglang/srt/disaggregation/common/conn.py"
HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
BUFFER = "sglang/srt/disaggregation/common/staging_buffer.py"
COMMON = "sglang/srt/mem_cache/common.py"
MIXIN = "SchedulerDisaggregationPrefillMixin"
PLAN_PROPERTIES = ("non_last_sends_end_on_grid", "each_send_fits_one_slot", "sends_partition_suffix",
                   "exactly_one_last_send", "send_cursor_monotone", "early_send_within_snapshot")
MISALIGNED_S3 = "exactly_one_last_send[D not page-aligned]"  # upstream finding before 05c7ebf

class _Struct:
    """`msgspec.Struct` stand-in: class keywords (`frozen=True`) accepted, nothing else."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()


@dataclass
class Upstream:
    mixin: type
    sender: type
    strategy: type
    grid_segments: bool  # 05c7ebf's compute_grid_segments is in the release


def load(source: EngineSource, knobs: dict[str, Any]) -> Upstream:
    """Load the planner, the sender's index bookkeeping and the chunk identification; `knobs` feeds the stand-ins."""
    envs = Partial("envs", {"SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": types.SimpleNamespace(
        get=lambda: knobs["early_send"])})
    schedule = lambda: types.SimpleNamespace(chunked_prefill_size=knobs["cps"])  # noqa: E731
    modules = {"sglang.srt.environ": Partial("sglang.srt.environ", {"envs": envs}),
               "sglang.srt.runtime_context": Partial("sglang.srt.runtime_context", {"get_schedule": schedule}),
               "msgspec": types.SimpleNamespace(Struct=_Struct)}
    grid_names = [n for n in ("staging_grid_tokens", "compute_grid_segments") if n in names_in(source.file(BUFFER))]
    if grid_names:  # upstream's own helpers, also for the function-level imports the loader does not follow
        helpers = vars(load_definitions(source.file(BUFFER), grid_names, where=BUFFER, version=source.label))
        modules["sglang.srt.disaggregation.common.staging_buffer"] = Partial(
            "sglang.srt.disaggregation.common.staging_buffer", helpers)
    pages = vars(load_definitions(source.file(COMMON), ["kv_to_page_indices", "kv_to_page_num"], where=COMMON,
                                  version=source.label))
    mixin = getattr(load_definitions(source.file(PREFILL), [MIXIN], modules=modules,
                                     extra_globals={"_is_npu": False, **pages}, where=PREFILL,
                                     version=source.label), MIXIN)
    sender = load_definitions(source.file(CONN), ["CommonKVSender"], modules=modules, where=CONN,
                              version=source.label).CommonKVSender
    strategy = load_definitions(source.file(HANDLER), ["PrefillStagingStrategy"], modules=modules, where=HANDLER,
                                version=source.label).PrefillStagingStrategy
    for cls, name in ((mixin, "send_kv_chunk"),  # maybe_send_cached_prefix_chunk: since 0.5.15 (no early send before)
                      (sender, "_prepare_send_indices"), (sender, "should_send_kv_chunk"),
                      (strategy, "check_ready")):
        if not callable(getattr(cls, name, None)):
            raise KvsimError(f"{source.label}: {cls.__name__}.{name} is absent (the upstream planner changed shape)")
    return Upstream(mixin, sender, strategy, "compute_grid_segments" in grid_names)


def upstream_plan(up: Upstream, knobs: dict[str, Any], case: Any) -> tuple[tuple[plan.SendCall, ...], tuple[int, ...]]:
    """Upstream's sends of one room as model `SendCall`s, and `start_send_idx` after each call."""
    import torch

    cfg = case.cfg
    ps, d, length = cfg.page_size, cfg.decode_prefix_len, cfg.prompt_len
    knobs.update(cps=cfg.chunked_prefill_size, early_send=case.early_send)
    sends: list[plan.SendCall] = []
    state = {"tokens": d, "early": False}
    kv_mgr = types.SimpleNamespace(enable_all_cp_ranks_for_transfer=False, is_dummy_cp_rank=False, kv_shard_size=1,
                                   _dcp_pack_max_tokens=None, transfer_infos={},
                                   kv_buffer_tensors={"page_size": ps},
                                   server_args=types.SimpleNamespace(chunked_prefill_size=cfg.chunked_prefill_size))
    strategy = up.strategy(kv_mgr, None)
    no_staging = types.SimpleNamespace(staging=None, mooncake_session_id=None)

    class Sender(up.sender):  # type: ignore[misc, valid-type]
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

    class Scheduler(up.mixin):  # type: ignore[misc, valid-type]
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
    sender.init(plan.cdiv(length - d, ps), 0)  # finalize_bootstrap: kv_to_page_num(L - D, ps)
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
    return tuple(sends), tuple(cursors)


def model_sends(case: Any, variant: StagingVariant) -> tuple[plan.SendCall, ...]:
    return case.plan(variant).sends


def compare_key(sends: tuple[plan.SendCall, ...]) -> list[list[Any]]:
    return [[s.token_start, s.token_end, s.page_start, s.num_pages, s.chunk_idx, s.is_last, s.early] for s in sends]


class UpstreamCase:
    """A `PlanCase` whose `plan(variant)` is upstream's (for running the model's plan properties on the real code)."""

    def __init__(self, case: Any, sends: tuple[plan.SendCall, ...], cursors: tuple[int, ...]) -> None:
        self._case, self._sends, self._cursors = case, sends, cursors

    def __getattr__(self, name: str) -> Any:
        return getattr(self._case, name)

    def plan(self, variant: StagingVariant = VARIANTS.fixed) -> plan.RoomPlan:
        cfg, curr = self._case.cfg, 0
        cursors = []
        for c in self._cursors:  # curr_idx after each call: the pages sent before start_send_idx
            curr = sum(s.num_pages for s in self._sends if s.token_end <= c)
            cursors.append(plan.SendCursor(c, curr))
        return plan.RoomPlan(self._sends, tuple(cursors), plan.prefill_batch_ends(cfg, self._case.prefill_hit),
                             plan.prefetch_plan(cfg.suffix_pages, cfg.full_chunk_pages))


def plan_variant(source: EngineSource, up: Upstream) -> StagingVariant:
    return release_variant(source.version) if up.grid_segments else VARIANTS["pre_05c7ebf"]


def run_send_plan(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.pd_staging import cases, strategies
    from kvsim.properties.pd_staging import plan as plan_properties

    started = time.perf_counter()
    knobs: dict[str, Any] = {"cps": None, "early_send": True}
    up = load(source, knobs)
    variant = plan_variant(source, up)
    result = TargetResult("send_plan", source.version)
    props = {name: getattr(plan_properties, name) for name in PLAN_PROPERTIES}
    failures: dict[str, str] = {}
    counts = {"refused": 0, "misaligned": 0}

    def check(case: Any) -> None:
        cfg = case.cfg
        aligned = cfg.decode_prefix_len % cfg.page_size == 0
        if not plan.staging_prefix_accepted(cfg.decode_prefix_len, cfg.page_size, variant):
            counts["refused"] += 1
            return
        try:
            sends, cursors = upstream_plan(up, knobs, case)
        except Exception as exc:  # noqa: BLE001 - the planner or its surroundings changed shape
            raise KvsimError(f"{source.label}: {PREFILL}:{MIXIN}.send_kv_chunk could not be driven on "
                             f"{case_input(case)}: {type(exc).__name__}: {exc}") from exc
        want = model_sends(case, variant)
        result.compared += 1
        counts["misaligned"] += not aligned
        if compare_key(sends) != compare_key(want):
            result.diverge(case_input(case), compare_key(want), compare_key(sends),
                           "" if aligned else "D not page-aligned")
        if not aligned:  # the plan properties draw aligned rooms only; S3 is still checked on upstream (a finding)
            if MISALIGNED_S3 not in failures:
                try:
                    props["exactly_one_last_send"].fn(UpstreamCase(case, sends, cursors), variant)
                except Exception as exc:  # noqa: BLE001 - a violated property, reported with its input
                    failures[MISALIGNED_S3] = f"{case_input(case)}: {exc}"
            return
        real = UpstreamCase(case, sends, cursors)
        for name, prop in props.items():
            if name in failures:
                continue
            try:
                prop.fn(real, variant)
            except Exception as exc:  # noqa: BLE001 - a violated property, reported with its input
                failures[name] = f"{case_input(case)}: {exc}"

    pinned = (cases.SCENARIO_A_EARLY, cases.SCENARIO_B, cases.SCENARIO_D) + tuple(cases.PINNED)
    for case in pinned:
        check(case)
    drive(strategies.ANY_PREFIX_PLAN_CASES, check, options)
    for name in PLAN_PROPERTIES:
        result.prop(name, "fails" if name in failures else "holds", failures.get(name, ""))
    if counts["misaligned"]:
        result.prop(MISALIGNED_S3, "fails" if MISALIGNED_S3 in failures else "holds", failures.get(MISALIGNED_S3, ""))
    result.note = (f"model variant {variant.name}; {counts['misaligned']} inputs with D not page-aligned; "
                   f"{counts['refused']} refused (D not page-aligned: the room fails at registration)")
    return result.finish(started)


def case_input(case: Any) -> dict[str, Any]:
    return {"L": case.prompt_len, "D": case.decode_prefix_len, "ps": case.page_size,
            "cps": case.chunked_prefill_size, "prefill_hit": case.prefill_hit, "host_hit": case.host_hit_length,
            "early_send": case.early_send}


TARGETS = (
    Target("sglang", "send_plan", PREFILL, (MIXIN,), "pd-staging",
           "the prefill send plan (token ranges, pages, chunk_idx, is_last per send) of upstream's "
           "send_kv_chunk, driven room by room against plan_room_sends; the plan properties on it", run_send_plan),
)
