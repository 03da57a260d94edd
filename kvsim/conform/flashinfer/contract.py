"""FlashInfer 0.7.4 `MLAInputContract.validate_run_options` (`_contracts.py`) against `mla-backends`' run contract.

`RUN_CONTRACT` (a Differential): a planned contract (every field of `MLAInputContract`, the layouts and head
dims it stores but does not check included) and one run() call (every argument of `validate_run_options`:
`out`, `lse`, `return_lse`, `return_lse_base_on_e`, `o_scale`, `ckv_scale`, `ckv_scale_arr`, `kpe_scale`,
`sinks`, `skip_softmax_threshold_scale_factor`, `bmm1_scale`, `bmm2_scale`), drawn four ways: the planned
arguments, the planned arguments with one changed, all free, or the planned ones with the scales free (so the
scale rules, checked last, are reached). Upstream accepts (its answer
`{"accepted": True}`) or raises; the model's `validate_run` accepts or refuses naming the first rule broken.
Comparison (`NamedRefusals`): a raise equals the model's refusal when its message names the same rule
(`RULE_WORDS`), and for a planned-run mismatch the same planned and given values (upstream's `repr`s).

Conventions: the model reduces tensors to presence and dtype names (`bfloat16`, `float8_e4m3fn`, `float16`);
the adapter builds one-element CPU tensors and numbers for them; a bmm scale the model calls `scalar` is a float
or an int, one it calls `bool` (not a number) is `True` or the string "1.0"; upstream names dtypes `torch.<name>`.
Pinned: every pair of bmm scale kinds in both forms, against a contract planned with scalar bmm scales; each
KV scale alone on a plan without FP8 KV; a KV scale with one bmm scale (the exclusive families before the pair).

Survivors (declared in `models/mla_backends/conform.py`): `bmm1_scale is not None and bmm2_scale is not None`
with either clause dropped (the pair check before it has raised unless both or neither are given). The
annotation-only line `actual_scale_mode: MLAScaleMode` runs no code: coverage cannot count it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential
from kvsim.models.mla_backends.contract import BMM, InputContract, RunArguments, lse_mode_of, planned_run, validate_run

from ..loader import check_signature
from .common import MLA, NamedRefusals, mismatch_name, refuse, rule_by_words

CONTRACTS = f"{MLA}/_contracts.py"
RUN_PARAMS = ("self", "out", "lse", "return_lse", "return_lse_base_on_e", "o_scale", "ckv_scale", "ckv_scale_arr",
              "kpe_scale", "sinks", "skip_softmax_threshold_scale_factor", "bmm1_scale", "bmm2_scale")
RULE_WORDS = (("LSE mode mismatch", "lse_mode"), ("output dtype mismatch", "output_dtype"),
              ("o_scale mismatch", "output_scale"), ("sinks mismatch", "sinks"),
              ("skip_softmax mismatch", "skip_softmax"), ("mutually exclusive", "scale_families"),
              ("must be provided together", "bmm_pair"), ("same scale type", "bmm_types"),
              ("numeric scalar values", "bmm_numeric"), ("scale mode mismatch", "scale_mode"),
              ("Exactly one of ckv_scale", "kv_scales"), ("kpe_scale is required", "kpe_scale"),
              ("only valid when", "kv_scales_not_fp8"))
MISMATCHES = ("lse_mode", "output_dtype", "output_scale", "sinks", "skip_softmax", "scale_mode")
SCALARS = {"scalar": (1.0, 3), "bool": (True, "1.0")}  # the two forms of each kind of non-tensor bmm scale


@dataclass(frozen=True)
class RunCase:
    """A planned contract, one run() call, and what upstream's contract stores besides (`layouts`, head dims);
    `forms`: which of the two forms each non-tensor bmm scale takes (`SCALARS`)."""

    contract: InputContract
    run: RunArguments
    query_layout: str = "packed"
    kv_cache_layout: str = "packed"
    head_dims: tuple[int, int] | None = None
    forms: tuple[int, int] = (0, 0)


def name_of(message: str) -> str:
    rule = rule_by_words(message, RULE_WORDS)
    return mismatch_name(rule, message) if rule in MISMATCHES else rule


def _actual_scale_mode(case: RunCase) -> str:
    run = case.run
    if run.bmm1_scale is not None:
        return "bmm-tensor" if run.bmm1_scale == "tensor" else "bmm-scalar"
    return "kv-per-tensor" if case.contract.scale_mode == "kv-per-tensor" else "default"


def mismatch(case: RunCase, rule: str) -> str:
    """The model's refusal name: the rule, with the planned and given values as upstream writes them."""
    c, run = case.contract, case.run
    values = {"lse_mode": (c.lse_mode, lse_mode_of(run)),
              "output_dtype": (f"torch.{c.output_dtype}", f"torch.{run.out_dtype or c.output_dtype}"),
              "output_scale": (c.output_scale, "per-tensor" if run.o_scale else "none"),
              "sinks": (c.use_sinks, run.sinks), "skip_softmax": (c.skip_softmax, run.skip_softmax_factor),
              "scale_mode": (c.scale_mode, _actual_scale_mode(case))}
    if rule not in values:
        return rule
    planned, given = values[rule]
    show = (lambda v: v) if rule == "output_dtype" else repr
    return f"{rule}: planned {show(planned)}, got {show(given)}"


def model_answer(ctx: Context, case: RunCase) -> dict[str, bool]:
    rule = validate_run(case.contract, case.run)
    if rule is not None:
        refuse(mismatch(case, rule))
    return {"accepted": True}


def upstream_answer(ctx: Context, case: RunCase) -> dict[str, bool]:
    import torch

    c, run = case.contract, case.run
    planned = ctx.up.MLAInputContract(
        lse_mode=c.lse_mode, output_dtype=getattr(torch, c.output_dtype), output_scale=c.output_scale,
        scale_mode=c.scale_mode, query_layout=case.query_layout, kv_cache_layout=case.kv_cache_layout,
        head_dim_ckv=case.head_dims[0] if case.head_dims else None,
        head_dim_kpe=case.head_dims[1] if case.head_dims else None, skip_softmax=c.skip_softmax,
        use_sinks=c.use_sinks)
    tensor = torch.ones(1)

    def bmm(kind: str | None, form: int) -> Any:
        return None if kind is None else tensor if kind == "tensor" else SCALARS[kind][form]

    planned.validate_run_options(
        out=torch.empty(1, dtype=getattr(torch, run.out_dtype)) if run.out_dtype else None,
        lse=tensor if run.lse_buffer else None, return_lse=run.return_lse,
        return_lse_base_on_e=run.return_lse_base_on_e, o_scale=1.0 if run.o_scale else None,
        ckv_scale=1.0 if run.ckv_scale else None, ckv_scale_arr=tensor if run.ckv_scale_arr else None,
        kpe_scale=1.0 if run.kpe_scale else None, sinks=tensor if run.sinks else None,
        skip_softmax_threshold_scale_factor=1.0 if run.skip_softmax_factor else None,
        bmm1_scale=bmm(run.bmm1_scale, case.forms[0]), bmm2_scale=bmm(run.bmm2_scale, case.forms[1]))
    return {"accepted": True}


def run_cases() -> Any:
    from kvsim.properties.mla_backends.selection import flip
    from kvsim.properties.mla_backends.strategies import RUN_CONTRACT_CASES

    dtypes = st.sampled_from((None, "bfloat16", "float8_e4m3fn", "float16"))
    scales = st.sampled_from(BMM)
    free = st.builds(RunArguments, out_dtype=dtypes, lse_buffer=st.booleans(), return_lse=st.booleans(),
                     return_lse_base_on_e=st.booleans(), o_scale=st.booleans(), ckv_scale=st.booleans(),
                     ckv_scale_arr=st.booleans(), kpe_scale=st.booleans(), sinks=st.booleans(),
                     skip_softmax_factor=st.booleans(), bmm1_scale=scales, bmm2_scale=scales)
    contracts = RUN_CONTRACT_CASES.map(lambda pair: pair[0])
    kv_scales = st.one_of(st.just((False, False, False)), st.tuples(st.booleans(), st.booleans(), st.booleans()))
    scaled = st.builds(lambda c, kv, b1, b2: (c, replace(planned_run(c), ckv_scale=kv[0], ckv_scale_arr=kv[1],
                                                         kpe_scale=kv[2], bmm1_scale=b1, bmm2_scale=b2)),
                       contracts, kv_scales, scales, scales)
    pairs = st.one_of(RUN_CONTRACT_CASES.map(lambda pair: (pair[0], flip(planned_run(pair[0]), pair[1]))),
                      st.tuples(contracts, free), contracts.map(lambda c: (c, planned_run(c))), scaled)
    layouts = st.sampled_from(("packed", "split"))
    return st.builds(lambda pair, q, kv, dims, forms: RunCase(pair[0], pair[1], q, kv, dims, forms), pairs,
                     layouts, layouts, st.sampled_from((None, (512, 64), (128, 32))),
                     st.tuples(st.integers(0, 1), st.integers(0, 1)))


def pinned(ctx: Context) -> list[RunCase]:
    """Every pair of bmm scale kinds, in both forms, against a contract planned with scalar bmm scales (the scale
    rules are checked last: random arguments rarely get there with one scale a number and the other not)."""
    contract = InputContract(scale_mode="bmm-scalar")
    scale_rules = [RunCase(contract, RunArguments(bmm1_scale=a, bmm2_scale=b), forms=(form, form))
                   for a in BMM for b in BMM for form in (0, 1)]
    # the FP8 KV scale rules, checked after the scale mode matches: kpe_scale missing on a kv-per-tensor plan, and
    # each KV scale alone given to a plan without FP8 KV
    kv_alone = [RunCase(InputContract(), RunArguments(**{name: True}))
                for name in ("ckv_scale", "ckv_scale_arr", "kpe_scale")]
    # the two scale families together, one bmm scale alone: exclusive families, checked before the bmm pair
    families = [RunCase(contract, RunArguments(ckv_scale=True, **{name: "scalar"}))
                for name in ("bmm1_scale", "bmm2_scale")]
    return scale_rules + [RunCase(InputContract(scale_mode="kv-per-tensor"), RunArguments(ckv_scale=True))] \
        + kv_alone + families


def describe(ctx: Context, case: RunCase) -> dict[str, Any]:
    return {"contract": {f.name: getattr(case.contract, f.name) for f in fields(case.contract)},
            "run": {f.name: getattr(case.run, f.name) for f in fields(case.run)},
            "query_layout": case.query_layout, "kv_cache_layout": case.kv_cache_layout,
            "head_dims": case.head_dims, "bmm_forms": list(case.forms)}


RUN_CONTRACT = Differential(
    prepare=lambda ctx: check_signature(ctx.up.MLAInputContract.validate_run_options, RUN_PARAMS,
                                        f"{CONTRACTS}:MLAInputContract.validate_run_options"),
    inputs=lambda ctx: run_cases(), pinned=pinned, model=model_answer, upstream=upstream_answer, describe=describe,
    compare=NamedRefusals(refusals=("ValueError", "TypeError"), name_of=name_of))
