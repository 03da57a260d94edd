"""FlashInfer 0.7.4 auto and cute-dsl selection loops (`_auto_policy.py`, `_wrapper.py`) against `mla-backends`.

`SELECTION_LOOPS` (a Differential): `_BatchMLAPagedAttentionAutoBackend.plan_from_wrapper` and
`_BatchMLAPagedAttentionCuteDslBackend.plan_from_wrapper` are upstream's own loops; they run over stand-in
backend types. A stand-in backend carries the release's `_plan_capabilities` (read from its file) and plans as
a real backend's preflight does: upstream's `plan_capability_rejection_reason`, raised as the release's
`_BackendPlanUnsupportedError`, then the case's injected outcome (`unsupported`: the typed signal;
`error:<kind>`: a `RuntimeError`, as a JIT, allocation or runtime failure). On random `SELECTION_CASES` and
`AUTO_FAULT_CASES` (any contract, every compute capability the order functions tell apart, faults,
experimental opt-in, a previous backend: any of the nine, kept only by a CUDA-graph re-plan) and pinned ones
(`pinned`) the answer is the backend that plans and the backends probed in order; a raise of the loop equals the model's refusal (`select_backend`'s
trace) when it is of the same shape (every candidate rejected, a single candidate's rejection re-raised, a
failure propagated) after the same probes, each with the same outcome (`planned`, `declined`: the stand-in's
typed signal, `failure:<kind>`, `capability:<kind>`: the preflight's rule) (`NamedRefusals`, the probes read
from the stand-ins' log `PROBES`: the runner keeps a raise's message only to 300 characters, shorter than the
list of nine rejections). An experimental candidate refused by the loop is one that is not probed.

Conventions: the compute-capability probes (`get_compute_capability`, `is_sm90a_supported`,
`is_sm120a_supported`, `is_sm121a_supported`) and `experimental_auto_backends_allowed` are stand-ins answering
for the case; the wrapper's backend table (`from ._wrapper import _BACKEND_TYPES`, imported inside the loop) is
the stand-in table; `plan_args.csr()` returns the CSR tensors (validation is the metadata target's).

Survivors (declared in `models/mla_backends/conform.py`): the auto loop's SM80 test `== (8, 0)` with a digit
changed (`ordered_sm80_backends` is the default order: fa2 comes first in both). Not run (no mutant there): in the
cute-dsl loop, the sink filter keeps the family as it is in 0.7.4 (no member supports sinks), so
`candidate_types = sink_candidate_types` runs for no input.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential
from kvsim.models.mla_backends.capabilities import CAPABILITIES, CUTE_DSL_FAMILY, capability_rejection
from kvsim.models.mla_backends.selection import select_backend

from .common import MLA, NamedRefusals, as_dict, refuse, upstream_capabilities
from .selection import KIND_WORDS, upstream_args

WRAPPER = f"{MLA}/_wrapper.py"
AUTO, FAMILY = "_BatchMLAPagedAttentionAutoBackend", "_BatchMLAPagedAttentionCuteDslBackend"
EXPERIMENTAL = "experimental backend requires"
DECLINED = "is not supported here"  # the stand-in's typed signal
ALL_REJECTED = "No supported planned MLA backend: "


class Planned:
    def __init__(self, name: str) -> None:
        self._backend = name


class Probes:
    """What the stand-in backends did in the current call, in order: (backend, outcome), outcome one of
    `planned`, `declined` (the typed signal), `failure:<kind>`, `capability:<kind>` (the preflight's rejection).
    A raise of the loop is named by this log (`name`), not by its message (which the runner keeps cut short)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def name(self, message: str) -> str:
        return f"{raise_shape(message)}: {shown(self.log)}"


PROBES = Probes()


def raise_shape(message: str) -> str:
    """What kind of raise the loop made: a stand-in's failure, every candidate rejected, or one re-raised."""
    if message.startswith("error:"):
        return "failure"
    if message.startswith(ALL_REJECTED) or message.partition(": ")[0] in CAPABILITIES:
        return "all rejected"
    return "alone"


def shown(log: list[tuple[str, str]]) -> str:
    return ", ".join(f"{backend} {outcome}" for backend, outcome in log) or "none probed"


def capability_kind(reason: str) -> str:
    return "capability:" + next((k for words, k in KIND_WORDS if words in reason), f"unrecognised: {reason}")


def stand_in_types(ctx: Context) -> dict[str, type]:
    """One stand-in backend type per release backend: its capabilities, the capability preflight, then the
    case's outcome (`ctx.state["outcomes"]`); each plan is logged in `PROBES`."""
    unsupported, reason_fn = ctx.up._BackendPlanUnsupportedError, ctx.up.plan_capability_rejection_reason

    def make(name: str, caps: Any) -> type:
        def plan_from_wrapper(cls: type, args: Any) -> Planned:
            reason = reason_fn(args, cls._plan_capabilities)
            if reason:
                PROBES.log.append((name, capability_kind(reason)))
                raise unsupported(reason)
            outcome = ctx.state["outcomes"].get(name, "ok")
            PROBES.log.append((name, {"ok": "planned", "unsupported": "declined"}.get(
                outcome, outcome.replace("error:", "failure:"))))
            if outcome == "unsupported":
                raise unsupported(f"{name} {DECLINED}")
            if outcome.startswith("error:"):
                raise RuntimeError(f"{outcome} ({name})")
            return Planned(name)
        return type(f"StandIn_{name}", (), {"_plan_capabilities": caps,
                                             "plan_from_wrapper": classmethod(plan_from_wrapper)})
    return {name: make(name, caps) for name, caps in upstream_capabilities(ctx.source, ctx.up.MLAPlanCapabilities).items()}


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


def loading(upstream: Any, up: Any) -> dict[str, Any]:
    """The loops raise and check with the capabilities file's own definitions (their imports are not followed)."""
    if upstream.file == WRAPPER:
        return {"extra_globals": {"_BackendPlanUnsupportedError": up._BackendPlanUnsupportedError,
                                  "plan_capability_rejection_reason": up.plan_capability_rejection_reason}}
    if upstream.file.endswith("_auto_policy.py"):
        return {"extra_globals": {"_BackendPlanUnsupportedError": up._BackendPlanUnsupportedError}}
    return {}


def prepare(ctx: Context) -> None:
    """The stand-in table, the probes answering for the current case, the family's candidates."""
    table = stand_in_types(ctx)
    ctx.state.update(table=table, outcomes={}, cc=(9, 0), experimental=False)
    auto_fn = getattr(ctx.up, AUTO).plan_from_wrapper.__func__
    cc = lambda device: ctx.state["cc"]  # noqa: E731
    auto_fn.__globals__.update({
        "_get_compute_capability": cc, "is_sm90a_supported": lambda device: cc(device) == (9, 0),
        "is_sm120a_supported": lambda device: cc(device) == (12, 0),
        "is_sm121a_supported": lambda device: cc(device) == (12, 1),
        "experimental_auto_backends_allowed": lambda: ctx.state["experimental"]})
    answer_wrapper_import(auto_fn, table)
    getattr(ctx.up, FAMILY)._candidate_types = tuple(table[n] for n in CUTE_DSL_FAMILY)


# -- the cases ----------------------------------------------------------------------------------------------

def selection_cases() -> Any:
    from kvsim.properties.mla_backends.strategies import AUTO_FAULT_CASES, SELECTION_CASES

    previous = st.one_of(st.none(), st.sampled_from(tuple(CAPABILITIES)))
    family = st.sampled_from(("auto", "cute-dsl"))

    def build(case: Any, backend: str, prev: str | None) -> Any:
        backend = backend if case.backend not in ("auto", "cute-dsl") else case.backend
        return dataclasses.replace(case, backend=backend, previous=prev)  # kept only by a CUDA-graph re-plan
    return st.builds(build, st.one_of(AUTO_FAULT_CASES, SELECTION_CASES), family, previous)


def pinned(ctx: Context) -> list[Any]:
    """A failure that must propagate; an all-split plan; FA2 declining on SM120 and SM121 (the next candidate is
    the SM12x order's, not the default's); a graph re-plan's previous backend declining (re-raised alone)."""
    from kvsim.properties.mla_backends.cases import DECODE_BATCH, JIT_FAILURE_ON_SM90, SPLIT_ON_SM100, SelectionCase
    from kvsim.properties.mla_backends.cases import request_of as case_request

    declined = (("fa2", "unsupported"),)
    sm12x = [SelectionCase(case_request(DECODE_BATCH), cc=cc, outcomes=declined) for cc in ((12, 0), (12, 1))]
    replan = SelectionCase(case_request(DECODE_BATCH, use_cuda_graph=True), previous="fa2", outcomes=declined)
    return [JIT_FAILURE_ON_SM90, SPLIT_ON_SM100, *sm12x, replan]


# -- the two sides ------------------------------------------------------------------------------------------

def model_outcome(case: Any, backend: str) -> str:
    """What the model says a probed backend did: its capability rejection, or the case's outcome."""
    found = capability_rejection(case.request.contract, CAPABILITIES[backend])
    if found is not None:
        return f"capability:{found.kind}"
    outcome = case.outcome_map.get(backend, "ok")
    return {"ok": "planned", "unsupported": "declined"}.get(outcome, outcome.replace("error:", "failure:"))


def model_answer(ctx: Context, case: Any) -> dict[str, Any]:
    trace = select_backend(case.request, case.backend, case.cc, case.outcome_map, previous=case.previous,
                           allow_experimental=case.allow_experimental)
    if trace.resolved is not None:
        return {"planned": trace.resolved, "probed": list(trace.probed)}
    log = [(b, model_outcome(case, b)) for b in trace.probed]
    if trace.error and trace.error.startswith("failure:"):
        refuse(f"failure: {shown(log)}")
    refuse(f"{'alone' if len(trace.candidates) == 1 else 'all rejected'}: {shown(log)}")
    raise AssertionError("unreachable")


def upstream_answer(ctx: Context, case: Any) -> dict[str, Any]:
    args = upstream_args(case.request)
    c = case.request.contract
    for name in ("query_kind", "kv_kind", "kv_layout"):
        setattr(args, name, getattr(c, name))
    args._previous_backend_name = case.previous
    args._float_workspace_buffer = SimpleNamespace(device="stand-in")
    ctx.state.update(outcomes=case.outcome_map, cc=case.cc, experimental=case.allow_experimental)
    PROBES.log = []
    planner = getattr(ctx.up, AUTO if case.backend == "auto" else FAMILY)
    planned = planner.plan_from_wrapper(args)
    return {"planned": planned._backend, "probed": [b for b, _ in PROBES.log]}


def describe(ctx: Context, case: Any) -> dict[str, Any]:
    r = case.request
    return {"backend": case.backend, "sm": list(case.cc), "outcomes": [list(o) for o in case.outcomes],
            "previous": case.previous, "experimental": case.allow_experimental, "cuda_graph": r.use_cuda_graph,
            "contract": as_dict(r.contract), "heads": r.num_heads, "page_size": r.page_size, "fp8": r.fp8}


SELECTION_LOOPS = Differential(
    loading=loading, prepare=prepare, inputs=lambda ctx: selection_cases(), pinned=pinned, model=model_answer,
    upstream=upstream_answer, describe=describe,
    compare=NamedRefusals(refusals=("_BackendPlanUnsupportedError", "RuntimeError"), name_of=PROBES.name))
