"""The plan/run lifecycle of `BatchMLAPagedAttentionWrapper` as a transition system (FlashInfer #4031, 0.7.4).

`plan()` is one call, modelled as stages so a failure can be injected at each: `select` (auto, the
cute-dsl family or an explicit backend: `selection.select_backend` with the injected outcome),
`lower` (`plan_from_wrapper`'s metadata lowering, JIT, persistent allocation) and `publish`. The
live plan has three parts written by those stages: the backend, its lowered plan info and the
input contract. Since #4031 the wrapper builds everything aside and publishes the three together
only on success (`MlaBackendsVariant.transactional_plan`); before, each stage wrote its part into
the live wrapper as it went, so a failure after `select` left the new backend beside the old
contract. In CUDA-graph mode a live backend without `supports_cuda_graph_replan` (every backend but
fa2/fa3) refuses a re-plan (captured pointers must stay stable), and an auto re-plan is pinned to
the backend chosen first. `run()` dispatches straight to the live backend: it checks the planned
input contract (LSE mode here) and never selects, probes or falls back.

Invariants: `no_half_published_plan` (between calls the three parts come from the same, last
successful plan), `run_never_selects` (a run probed nothing and dispatched to the live backend),
`graph_plan_stable` (in CUDA-graph mode a committed non-replannable backend stays).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from kvsim.engine.actions import tagged, type_table
from kvsim.engine.params import param
from kvsim.engine.system import Invariant, Sometimes

from .capabilities import CAPABILITIES, PlanContract
from .contract import InputContract, planned_run, validate_run
from .metadata import CsrMetadata, PlanMetadata, dual_of
from .selection import REQUESTS, PlanRequest, select_backend
from .variants import FIXED, MlaBackendsVariant

DEVICES = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0), "sm103": (10, 3), "sm107": (10, 7),
           "sm120": (12, 0), "sm121": (12, 1)}

_CSR = CsrMetadata(qo_indptr=(0, 1, 3), kv_indptr=(0, 2, 5), kv_indices=(4, 1, 0, 3, 2), kv_len_arr=(3, 6))
# The plan requests a run of the system chooses from (page size 2): what differs is the declared contract.
PLAN_REQUESTS = (
    PlanRequest(PlanMetadata(csr=_CSR), page_size=2),  # packed, no LSE: every backend's contract
    PlanRequest(PlanMetadata(csr=_CSR), page_size=2, contract=PlanContract(lse_mode="base2")),  # LSE for a merge
    PlanRequest(PlanMetadata(csr=_CSR), page_size=2,  # independent split KV: the packed-only backends drop out
                contract=PlanContract(kv_cache_layout="split", kv_kind="independent-split",
                                      kv_layout="independent-split")),
    PlanRequest(dual_of(_CSR), page_size=2, contract=PlanContract(output_scale="per-tensor")),  # cutlass only
)
STAGES = ("select", "lower", "publish")
# faults the select stage may meet: (outcome, position of the candidate it hits)
SELECT_FAULTS = (None, ("unsupported", 0), ("unsupported", 1), ("error:jit", 0))
LOWER_FAULTS = ("error:allocation",)

Plan = tagged("plan", "request")
Select = tagged("select", "fault")
Advance = tagged("advance")
Fail = tagged("fail", "kind")
Run = tagged("run", "lse_mode")
ACTIONS = type_table((Plan, Select, Advance, Fail, Run))

PlanStarted = tagged("plan_started", "request", "generation")
PlanRefused = tagged("plan_refused", "backend")
Probed = tagged("probed", "backend")
Rejected = tagged("rejected", "backend", "reason")
Selected = tagged("selected", "backend")
PlanFailed = tagged("plan_failed", "stage", "error")
Published = tagged("published", "backend", "generation")
RunDispatched = tagged("run_dispatched", "backend")
RunMismatch = tagged("run_mismatch", "rule", "got")
EFFECTS = type_table((PlanStarted, PlanRefused, Probed, Rejected, Selected, PlanFailed, Published, RunDispatched,
                      RunMismatch))


@dataclass(frozen=True)
class WrapperConfig:
    """The wrapper a run of `kvsim explore mla-backends` drives (its fields are the `--param`s)."""

    mla_backend: str = param("auto", "backend= of the wrapper (not a kernel --backend)", choices=REQUESTS)
    device: str = param("sm90", "compute capability of the device", choices=tuple(DEVICES))
    use_cuda_graph: bool = param(False, "use_cuda_graph=True (0 or 1)")
    plans: int = param(3, "plan() calls", minimum=1, maximum=32)
    runs: int = param(2, "run() calls", minimum=0, maximum=64)
    requests: tuple[int, ...] = param((0, 1, 2), "indices of PLAN_REQUESTS plan() may declare", minimum=0,
                                      maximum=len(PLAN_REQUESTS) - 1)


class Part(NamedTuple):
    value: object  # the backend name, the lowered plan's request, or the planned contract's request
    generation: int


class Pending(NamedTuple):
    request: int
    generation: int
    stage: str
    backend: str | None = None


class WrapperState(NamedTuple):
    backend: Part | None = None
    plan_info: Part | None = None
    contract: Part | None = None
    committed: int = 0  # generation of the last successful plan (0: none)
    pending: Pending | None = None
    plans: int = 0
    runs: int = 0
    last_run: tuple[str, int, int] | None = None  # (backend dispatched to, candidates probed, live generation)
    graph_pinned: str | None = None  # a CUDA-graph plan's non-replannable backend


class WrapperSystem:
    liveness = "every_plan_concludes"

    def __init__(self, variant: MlaBackendsVariant = FIXED, config: WrapperConfig = WrapperConfig()) -> None:
        self.name = "mla-backends"
        self.variant = variant
        self.config = config
        self.cc = DEVICES[config.device]
        self.invariants = (
            Invariant("no_half_published_plan", self._whole_plan,
                      "between calls the live backend, plan info and contract come from the last successful plan"),
            Invariant("run_never_selects", self._run_dispatch,
                      "run() probes no backend and dispatches to the live one"),
            Invariant("graph_plan_stable", self._graph_stable,
                      "in CUDA-graph mode a committed backend without graph re-plan support stays live"),
        )
        self.sometimes = (
            Sometimes("a_replan_replaces_a_live_plan", lambda s: s.committed >= 2,
                      "a second plan() succeeds over a live one"),
            Sometimes("a_failed_plan_leaves_a_live_one", lambda s: s.pending is None and 1 <= s.committed < s.plans,
                      "the last plan() failed while an earlier one is live (#4031's window)"),
            Sometimes("a_run_follows_a_failed_plan",
                      lambda s, a, t: type(a) is Run and s.pending is None and 1 <= s.committed < s.plans,
                      "run() is called after a failed re-plan, over the plan left live", step=True),
        )

    def initial_states(self) -> tuple[WrapperState, ...]:
        return (WrapperState(),)

    def done(self, state: WrapperState) -> bool:
        return state.pending is None and state.plans >= self.config.plans

    def enabled(self, state: WrapperState) -> list[tuple]:
        p = state.pending
        if p is not None:
            if p.stage == "select":
                return [Select(f) for f in SELECT_FAULTS]
            if p.stage == "lower":
                return [Advance()] + [Fail(k) for k in LOWER_FAULTS]
            return [Advance()]
        actions: list[tuple] = []
        if state.plans < self.config.plans:
            actions.extend(Plan(r) for r in self.config.requests)
        if state.backend is not None and state.runs < self.config.runs:
            actions.extend(Run(m) for m in ("none", "base2"))
        return actions

    def step(self, state: WrapperState, action: tuple) -> WrapperState:
        return self.transition(state, action)[0]

    def transition(self, state: WrapperState, action: tuple) -> tuple[WrapperState, tuple[tuple, ...]]:
        kind = action[0]
        if kind == "plan":
            return self._plan(state, action[1])
        if kind == "select":
            return self._select(state, action[1])
        if kind == "advance":
            return self._advance(state)
        if kind == "fail":
            return self._abort(state, action[1])
        if kind == "run":
            return self._run(state, action[1])
        raise ValueError(f"unknown action {action!r}")

    # -- plan() -----------------------------------------------------------------------------------
    def _plan(self, state: WrapperState, request: int) -> tuple[WrapperState, tuple[tuple, ...]]:
        generation = state.plans + 1
        state = state._replace(plans=generation)
        live = state.backend.value if state.backend is not None else None
        if self.config.use_cuda_graph and live is not None \
                and not CAPABILITIES[str(live)].supports_cuda_graph_replan:
            return state, (PlanRefused(live),)  # RuntimeError: captured metadata pointers must stay stable
        return state._replace(pending=Pending(request, generation, "select")), (PlanStarted(request, generation),)

    def _select(self, state: WrapperState, fault: tuple | None) -> tuple[WrapperState, tuple[tuple, ...]]:
        p = state.pending
        assert p is not None
        request = PLAN_REQUESTS[p.request]
        previous = str(state.backend.value) if state.backend is not None else None
        outcomes: dict[str, str] = {}
        if fault is not None:
            probe = select_backend(request, self.config.mla_backend, self.cc, {}, previous=previous,
                                   variant=self.variant)
            if fault[1] < len(probe.probed):
                outcomes[probe.probed[fault[1]]] = fault[0]
        trace = select_backend(request, self.config.mla_backend, self.cc, outcomes, previous=previous,
                               variant=self.variant)
        effects = tuple(Probed(b) for b in trace.probed) + tuple(Rejected(b, r) for b, r in trace.rejections)
        if not trace.ok:
            return self._abort(state, trace.error or "unsupported", effects)
        assert trace.resolved is not None
        state = state._replace(pending=p._replace(stage="lower", backend=trace.resolved))
        if not self.variant.transactional_plan:  # the old wrapper set its backend before lowering
            state = state._replace(backend=Part(trace.resolved, p.generation))
        return state, effects + (Selected(trace.resolved),)

    def _advance(self, state: WrapperState) -> tuple[WrapperState, tuple[tuple, ...]]:
        p = state.pending
        assert p is not None and p.backend is not None
        if p.stage == "lower":
            state = state._replace(pending=p._replace(stage="publish"))
            if not self.variant.transactional_plan:  # ... and its plan info as soon as it was lowered
                state = state._replace(plan_info=Part(p.request, p.generation))
            return state, ()
        # publish: all parts at once (a transactional wrapper); the contract last (the old one)
        pinned = state.graph_pinned
        if self.config.use_cuda_graph and not CAPABILITIES[p.backend].supports_cuda_graph_replan:
            pinned = p.backend
        return state._replace(backend=Part(p.backend, p.generation), plan_info=Part(p.request, p.generation),
                              contract=Part(p.request, p.generation), committed=p.generation, pending=None,
                              graph_pinned=pinned), (Published(p.backend, p.generation),)

    def _abort(self, state: WrapperState, error: str,
               effects: tuple[tuple, ...] = ()) -> tuple[WrapperState, tuple[tuple, ...]]:
        p = state.pending
        assert p is not None
        return state._replace(pending=None), effects + (PlanFailed(p.stage, error),)

    # -- run() ------------------------------------------------------------------------------------
    def _run(self, state: WrapperState, lse_mode: str) -> tuple[WrapperState, tuple[tuple, ...]]:
        assert state.backend is not None and state.contract is not None
        backend = str(state.backend.value)
        declared = PLAN_REQUESTS[int(str(state.contract.value))].contract
        planned = InputContract(lse_mode=declared.lse_mode, output_scale=declared.output_scale,
                                scale_mode=declared.scale_mode, skip_softmax=declared.skip_softmax,
                                use_sinks=declared.use_sinks)
        arguments = replace(planned_run(planned), return_lse=lse_mode != "none", return_lse_base_on_e=False)
        state = state._replace(runs=state.runs + 1, last_run=(backend, 0, state.backend.generation))
        broken = validate_run(planned, arguments)
        if broken is not None:  # ValueError: planned run argument mismatch, re-plan
            return state, (RunMismatch(broken, lse_mode),)
        return state, (RunDispatched(backend),)

    # -- invariants -------------------------------------------------------------------------------
    def _whole_plan(self, state: WrapperState) -> str | None:
        if state.pending is not None:
            return None  # inside plan(): nothing is observable yet
        parts = {"backend": state.backend, "plan_info": state.plan_info, "contract": state.contract}
        generations = {name: (part.generation if part is not None else 0) for name, part in parts.items()}
        if set(generations.values()) != {state.committed}:
            return (f"live plan parts after a failed re-plan: expected all from plan {state.committed}, got "
                    + ", ".join(f"{n} from plan {g}" for n, g in generations.items()))
        return None

    def _run_dispatch(self, state: WrapperState) -> str | None:
        if state.last_run is None:
            return None
        backend, probes, generation = state.last_run
        live = str(state.backend.value) if state.backend is not None else None
        current = state.backend is not None and state.backend.generation == generation
        if probes or (current and backend != live):
            return f"run dispatched to {backend} after probing {probes} candidates: expected the live {live}, no probes"
        return None

    def _graph_stable(self, state: WrapperState) -> str | None:
        if state.graph_pinned is None or state.pending is not None:
            return None
        live = str(state.backend.value) if state.backend is not None else None
        if live != state.graph_pinned:
            return f"CUDA-graph backend: expected {state.graph_pinned} to stay live, got {live}"
        return None
