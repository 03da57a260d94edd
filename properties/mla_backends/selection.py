"""Selection properties: complete auto orders, the capability check, typed fallback only, explicit
backends never substituted, the all-rejected error naming every candidate, run inputs converted without
copies, and run() held to the contract its plan promised."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.mla_backends.capabilities import (BACKENDS, CAPABILITIES, PlanContract, capability_rejection,
                                                   structural_rejection)
from kvsim.models.mla_backends.contract import RunArguments, lse_mode_of, planned_run, validate_run
from kvsim.models.mla_backends.inputs import KINDS, RunInput, classify, resolve
from kvsim.models.mla_backends.metadata import MetadataError, resolve_csr
from kvsim.models.mla_backends.selection import COMPUTE_CAPABILITIES, auto_order, select_backend
from kvsim.models.mla_backends.variants import MlaBackendsVariant

from .cases import JIT_FAILURE_ON_SM90, SELECTION_SOMETIMES, SPLIT_ON_SM100, SelectionCase

MODEL = "mla-backends"


def run_selection(case: SelectionCase, variant: MlaBackendsVariant):
    return select_backend(case.request, case.backend, case.cc, case.outcome_map, previous=case.previous,
                          allow_experimental=case.allow_experimental, variant=variant)


def _metadata_ok(case: SelectionCase) -> bool:
    try:
        resolve_csr(case.request.metadata, case.request.page_size)
    except MetadataError:
        return False
    return True


@kv_property(model=MODEL, strategy="SELECTION_CASES", examples=[SPLIT_ON_SM100], sometimes=SELECTION_SOMETIMES)
def auto_order_is_complete(case: SelectionCase, variant: MlaBackendsVariant) -> None:
    """On every compute capability the auto order lists each of the nine backends exactly once."""
    if not _metadata_ok(case):
        return
    for cc in COMPUTE_CAPABILITIES:
        order = auto_order(case.request, cc)
        if sorted(order) != sorted(BACKENDS):
            raise PropertyViolation(f"auto order on SM{cc[0]}{cc[1]}: expected a permutation of {list(BACKENDS)}, "
                                    f"got {list(order)}")


@kv_property(model=MODEL, strategy="SELECTION_CASES", examples=[SPLIT_ON_SM100, JIT_FAILURE_ON_SM90],
             sometimes=SELECTION_SOMETIMES)
def selected_backend_supports_the_contract(case: SelectionCase, variant: MlaBackendsVariant) -> None:
    """Whatever plans, supports the declared contract: no capability rejection, and the structural pre-filter
    keeps packed-only backends away from independent splits."""
    trace = run_selection(case, variant)
    if trace.resolved is None:
        return
    reason = capability_rejection(case.request.contract, CAPABILITIES[trace.resolved])
    if reason is not None:
        raise PropertyViolation(f"planned backend {trace.resolved}: expected it to support the contract, got "
                                f"{reason.kind}: {reason.message}")


@kv_property(model=MODEL, strategy="SELECTION_CASES", examples=[JIT_FAILURE_ON_SM90], sometimes=SELECTION_SOMETIMES)
def explicit_backend_never_falls_back(case: SelectionCase, variant: MlaBackendsVariant) -> None:
    """An explicit backend plans as itself or fails: it probes nothing else and resolves to nothing else."""
    if case.backend in ("auto", "cute-dsl"):
        return
    trace = run_selection(case, variant)
    if trace.probed != [case.backend] or trace.resolved not in (None, case.backend):
        raise PropertyViolation(f"backend={case.backend}: expected to probe only it, got probed {trace.probed}, "
                                f"resolved {trace.resolved}")


@kv_property(model=MODEL, strategy="AUTO_FAULT_CASES", examples=[JIT_FAILURE_ON_SM90])
def auto_falls_back_only_on_unsupported(case: SelectionCase, variant: MlaBackendsVariant) -> None:
    """Auto moves past a candidate only on the typed unsupported signal: a JIT, allocation, runtime or
    invalid-input failure of a probed candidate ends the plan with that failure."""
    if case.backend != "auto":
        return
    trace = run_selection(case, variant)
    outcomes = case.outcome_map
    for candidate in trace.probed:
        outcome = outcomes.get(candidate, "ok")
        if not outcome.startswith("error:"):
            continue
        if capability_rejection(case.request.contract, CAPABILITIES[candidate]) is not None:
            continue  # refused by its capabilities before it could fail
        want = f"failure:{outcome[len('error:'):]}"
        if trace.error != want or trace.probed[-1] != candidate:
            raise PropertyViolation(f"auto with {candidate} failing ({outcome}): expected plan() to raise {want}, got "
                                    f"{trace.error or 'success'} (resolved {trace.resolved}, probed {trace.probed})")
        return


@kv_property(model=MODEL, strategy="SELECTION_CASES", examples=[SPLIT_ON_SM100], sometimes=SELECTION_SOMETIMES)
def all_rejected_names_every_candidate(case: SelectionCase, variant: MlaBackendsVariant) -> None:
    """When every auto candidate is refused, the error lists each candidate with its reason, in order; a failure
    is never reported as a refusal, and a metadata error is never a candidate's refusal."""
    if case.backend != "auto":
        return
    trace = run_selection(case, variant)
    if trace.error is not None and trace.error.startswith("metadata:") and (trace.probed or trace.rejections):
        raise PropertyViolation(f"malformed metadata: expected no candidate probed, got {trace.probed}")
    if trace.error != "unsupported" or len(trace.candidates) == 1:
        return
    named = [c for c, _ in trace.rejections]
    if named != list(trace.candidates):
        raise PropertyViolation(f"all-rejected error: expected every candidate {list(trace.candidates)} named in "
                                f"order, got {named}")
    for candidate, reason in trace.rejections:
        if f"{candidate}: {reason}" not in trace.message:
            raise PropertyViolation(f"all-rejected message: expected '{candidate}: {reason}', got {trace.message!r}")


@kv_property(model=MODEL, strategy="CONTRACTS")
def run_inputs_convert_without_copies(contract: PlanContract, variant: MlaBackendsVariant) -> None:
    """A packed-native backend takes packed, dual and adjacent-split inputs zero-copy and refuses an independent
    split (the functional API alone copies it); a split-native backend takes everything zero-copy; and the
    structural pre-filter refuses exactly the packed-only backends for a declared independent split."""
    inputs = [RunInput(packed=576), RunInput(split=(512, 64), adjacent=True), RunInput(split=(512, 64)),
              RunInput(packed=576, split=(512, 64))]
    for value in inputs:
        kind = classify(value)
        for desired in ("packed", "split"):
            got = resolve(value, desired)
            copy = resolve(value, desired, functional=True)
            refused = desired == "packed" and kind == "independent-split"
            if (got.result == "rejected") != refused or got.copies or (copy.copies != refused):
                raise PropertyViolation(f"{kind} input for a {desired}-native backend: expected "
                                        f"{'rejected (copied by the functional API)' if refused else 'zero-copy'}, "
                                        f"got {got.result} / functional {copy.result}")
    assert {classify(v) for v in inputs} == set(KINDS)
    for name, caps in CAPABILITIES.items():
        split_q = contract.query_kind == "independent-split" or contract.query_layout == "split"
        split_kv = contract.kv_kind == "independent-split" or contract.kv_cache_layout == "split"
        want = (caps.requires_packed_query and split_q) or (caps.requires_packed_kv_cache and split_kv)
        if (structural_rejection(contract, caps) is not None) != want:
            raise PropertyViolation(f"structural pre-filter of {name} for query {contract.query_kind}/"
                                    f"{contract.query_layout}, KV {contract.kv_kind}/{contract.kv_cache_layout}: "
                                    f"expected {'refusal' if want else 'eligibility'}")


@kv_property(model=MODEL, strategy="RUN_CONTRACT_CASES")
def run_must_match_its_plan(pair: Any, variant: MlaBackendsVariant) -> None:
    """The run() arguments a plan promises pass its contract check; changing any one of them so that the LSE mode,
    output dtype or scale, sinks, skip-softmax or scale family differs is refused (the caller must re-plan)."""
    contract, field = pair
    planned = planned_run(contract)
    if validate_run(contract, planned) is not None:
        raise PropertyViolation(f"run() with the planned arguments for {contract}: expected accepted, got "
                                f"{validate_run(contract, planned)}")
    changed = flip(planned, field)
    if lse_mode_of(changed) == contract.lse_mode and field in ("lse_buffer", "return_lse", "return_lse_base_on_e"):
        return  # another way to ask for the same LSE (an lse buffer beside return_lse): the same contract
    if validate_run(contract, changed) is None:
        raise PropertyViolation(f"run() with {field} changed from the plan ({contract}): expected a refusal, got "
                                "acceptance")


def flip(run: RunArguments, field: str) -> RunArguments:
    """`run` with one argument changed: a boolean negated, a dtype swapped, a bmm scale dropped or changed."""
    value = getattr(run, field)
    if isinstance(value, bool):
        return replace(run, **{field: not value})
    if field == "out_dtype":
        return replace(run, out_dtype="float16")
    return replace(run, **{field: None if value is not None else "scalar"})
