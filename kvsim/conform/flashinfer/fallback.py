"""FlashInfer 0.7.4 auto and cute-dsl selection loops (`_auto_policy.py`, `_wrapper.py`) against `mla-backends`.

`_BatchMLAPagedAttentionAutoBackend.plan_from_wrapper` and `_BatchMLAPagedAttentionCuteDslBackend.
plan_from_wrapper` are upstream's own loops; they run over stand-in backend types. A stand-in backend
carries the release's `_plan_capabilities` (read from its file) and plans as a real backend's preflight
does: upstream's `plan_capability_rejection_reason`, raised as the release's `_BackendPlanUnsupportedError`,
then the case's injected outcome (`unsupported`: the typed signal; `error:<kind>`: a `RuntimeError`, as a
JIT, allocation or runtime failure). On random `SELECTION_CASES` (any contract, compute capability,
faults, experimental opt-in, a CUDA-graph re-plan's previous backend) the adapter compares what plans,
the backends probed in order, and how plan() fails (typed unsupported naming every candidate, or the
failure) with the model's `select_backend`. Conventions: the compute-capability probes
(`get_compute_capability`, `is_sm90a_supported`, `is_sm120a_supported`, `is_sm121a_supported`) and
`experimental_auto_backends_allowed` are stand-ins answering for the case; the wrapper's backend table
(`from ._wrapper import _BACKEND_TYPES`, imported inside the loop) is the stand-in table.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

from kvsim.models.mla_backends.selection import select_backend

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .common import MLA, load, upstream_capabilities
from .selection import CAPS, POLICY, upstream_args

WRAPPER = f"{MLA}/_wrapper.py"
AUTO, FAMILY = "_BatchMLAPagedAttentionAutoBackend", "_BatchMLAPagedAttentionCuteDslBackend"


class Planned:
    def __init__(self, name: str) -> None:
        self._backend = name


def stand_in_types(caps: dict[str, Any], reason_fn: Any, unsupported: type, case: Any, probed: list[str]) -> dict:
    outcomes = case.outcome_map

    def make(name: str) -> type:
        def plan_from_wrapper(cls: type, args: Any) -> Planned:
            probed.append(name)
            reason = reason_fn(args, cls._plan_capabilities)
            if reason:
                raise unsupported(reason)
            outcome = outcomes.get(name, "ok")
            if outcome == "unsupported":
                raise unsupported(f"{name} is not supported here")
            if outcome.startswith("error:"):
                raise RuntimeError(outcome)
            return Planned(name)
        return type(f"StandIn_{name}", (), {"_plan_capabilities": caps[name],
                                             "plan_from_wrapper": classmethod(plan_from_wrapper)})
    return {name: make(name) for name in caps}


def answer_wrapper_import(fn: Any, table: dict) -> None:
    """Answer the loop's `from ._wrapper import _BACKEND_TYPES` with the stand-in table."""
    builtins_ = fn.__globals__["__builtins__"]
    base = builtins_.get("_kvsim_base_import", builtins_["__import__"])
    builtins_["_kvsim_base_import"] = base

    def importer(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 1 and name == "_wrapper":
            return SimpleNamespace(_BACKEND_TYPES=table)
        return base(name, globals, locals, fromlist, level)
    builtins_["__import__"] = importer


def outcome_of(call: Any, unsupported: type, candidates: tuple[str, ...]) -> tuple:
    try:
        return ("ok", call()._backend)
    except unsupported as exc:
        named = tuple(c for c in candidates if f"{c}: " in str(exc))
        return ("unsupported", named if len(candidates) > 1 else ())
    except RuntimeError as exc:
        return ("failure", str(exc).removeprefix("error:"))


def model_outcome(trace: Any) -> tuple:
    if trace.resolved is not None:
        return ("ok", trace.resolved)
    if trace.error == "unsupported":
        return ("unsupported", tuple(c for c, _ in trace.rejections) if len(trace.candidates) > 1 else ())
    return ("failure", (trace.error or "").removeprefix("failure:"))


def run_fallback(source: EngineSource, options: RunOptions) -> TargetResult:
    from hypothesis import strategies as st

    from kvsim.properties.mla_backends.cases import JIT_FAILURE_ON_SM90, SPLIT_ON_SM100
    from kvsim.properties.mla_backends.strategies import AUTO_FAULT_CASES, SELECTION_CASES

    started = time.perf_counter()
    result = TargetResult("selection-loops", source.version)
    caps = upstream_capabilities(source)
    cap_ns = load(source, CAPS, ["plan_capability_rejection_reason", "_BackendPlanUnsupportedError"])
    unsupported, reason_fn = cap_ns._BackendPlanUnsupportedError, cap_ns.plan_capability_rejection_reason
    auto = getattr(load(source, POLICY, [AUTO], extra_globals={"_BackendPlanUnsupportedError": unsupported}), AUTO)
    family = getattr(load(source, WRAPPER, [FAMILY], extra_globals={
        "_BackendPlanUnsupportedError": unsupported, "plan_capability_rejection_reason": reason_fn}), FAMILY)
    auto_fn = auto.plan_from_wrapper.__func__

    def check(pair: Any) -> None:
        case, previous = pair
        case = dataclasses.replace(case, previous=previous if case.request.use_cuda_graph else None)
        if case.backend not in ("auto", "cute-dsl"):
            return
        probed: list[str] = []
        table = stand_in_types(caps, reason_fn, unsupported, case, probed)
        cc = case.cc
        auto_fn.__globals__.update({
            "_get_compute_capability": lambda device: cc, "is_sm90a_supported": lambda device: cc == (9, 0),
            "is_sm120a_supported": lambda device: cc == (12, 0), "is_sm121a_supported": lambda device: cc == (12, 1),
            "experimental_auto_backends_allowed": lambda: case.allow_experimental})
        answer_wrapper_import(auto_fn, table)
        args = upstream_args(case.request)
        c = case.request.contract
        for name in ("query_kind", "kv_kind", "kv_layout"):
            setattr(args, name, getattr(c, name))
        args._previous_backend_name = case.previous
        args._float_workspace_buffer = SimpleNamespace(device="stand-in")
        if case.backend == "auto":
            planner = auto
        else:
            planner = family
            family._candidate_types = tuple(table[n] for n in ("cute-dsl-monolithic", "cute-dsl-modular",
                                                               "cute-dsl-rubin-mtp"))
        trace = select_backend(case.request, case.backend, cc, case.outcome_map, previous=case.previous,
                               allow_experimental=case.allow_experimental)
        got = outcome_of(lambda: planner.plan_from_wrapper(args), unsupported, trace.candidates)
        want = model_outcome(trace)
        result.compared += 1
        if (got, probed) != (want, trace.probed):
            result.diverge({"backend": case.backend, "sm": cc, "outcomes": case.outcomes, "previous": case.previous,
                            "contract": dataclasses.asdict(c), "experimental": case.allow_experimental},
                           [want, trace.probed], [got, probed])

    for pinned in (JIT_FAILURE_ON_SM90, SPLIT_ON_SM100):  # a failure that must propagate; an all-split plan
        check((pinned, None))
    previous = st.one_of(st.none(), st.sampled_from(tuple(caps)))
    drive(st.tuples(st.one_of(AUTO_FAULT_CASES, SELECTION_CASES), previous), check, options)
    result.note = (f"2 pinned and {options.max_examples} random selection cases (auto and cute-dsl; faults, "
                   "experimental opt-in, CUDA-graph re-plans) through upstream's own loops over stand-in backends")
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "selection-loops", POLICY, (AUTO,), "mla-backends",
           "auto and cute-dsl selection loops: typed fallback only, single-candidate re-raise, all-rejected error",
           run_fallback),
)
