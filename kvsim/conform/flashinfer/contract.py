"""FlashInfer 0.7.4 `MLAInputContract.validate_run_options` (`_contracts.py`) against `mla-backends`' run contract.

On random planned contracts and run() arguments (every argument drawn, and the planned arguments with one
changed) upstream's check accepts or refuses as the model's `validate_run` does, naming the same rule.
Conventions: the model reduces tensors to presence and dtype names (`bfloat16`, `float8_e4m3fn`, `float16`);
the adapter builds one-element CPU tensors and numbers for them; a bmm scale of kind `bool` is `True` (a number
Python accepts and upstream refuses); upstream's exception is named by its wording (`RULE_WORDS`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kvsim.models.mla_backends.contract import BMM, InputContract, RunArguments, planned_run, validate_run

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .common import MLA, load

CONTRACTS = f"{MLA}/_contracts.py"
RULE_WORDS = (("LSE mode mismatch", "lse_mode"), ("output dtype mismatch", "output_dtype"),
              ("o_scale mismatch", "output_scale"), ("sinks mismatch", "sinks"),
              ("skip_softmax mismatch", "skip_softmax"), ("mutually exclusive", "scale_families"),
              ("must be provided together", "bmm_pair"), ("same scale type", "bmm_types"),
              ("numeric scalar values", "bmm_numeric"), ("scale mode mismatch", "scale_mode"),
              ("Exactly one of ckv_scale", "kv_scales"), ("kpe_scale is required", "kpe_scale"),
              ("only valid when", "kv_scales_not_fp8"))


def rule_of(exc: BaseException) -> str:
    return next((rule for words, rule in RULE_WORDS if words in str(exc)), f"unrecognised: {exc}")


def upstream_call(cls: Any, contract: InputContract, run: RunArguments) -> str | None:
    import torch

    dtype = lambda name: getattr(torch, name)  # noqa: E731
    planned = cls(lse_mode=contract.lse_mode, output_dtype=dtype(contract.output_dtype),
                  output_scale=contract.output_scale, scale_mode=contract.scale_mode,
                  skip_softmax=contract.skip_softmax, use_sinks=contract.use_sinks)
    tensor = torch.ones(1)
    bmm = {None: None, "scalar": 1.0, "tensor": tensor, "bool": True}
    try:
        planned.validate_run_options(
            out=torch.empty(1, dtype=dtype(run.out_dtype)) if run.out_dtype else None,
            lse=tensor if run.lse_buffer else None, return_lse=run.return_lse,
            return_lse_base_on_e=run.return_lse_base_on_e, o_scale=1.0 if run.o_scale else None,
            ckv_scale=1.0 if run.ckv_scale else None, ckv_scale_arr=tensor if run.ckv_scale_arr else None,
            kpe_scale=1.0 if run.kpe_scale else None, sinks=tensor if run.sinks else None,
            skip_softmax_threshold_scale_factor=1.0 if run.skip_softmax_factor else None,
            bmm1_scale=bmm[run.bmm1_scale], bmm2_scale=bmm[run.bmm2_scale])
    except (ValueError, TypeError) as exc:
        return rule_of(exc)
    return None


def cases() -> Any:
    from hypothesis import strategies as st

    from kvsim.properties.mla_backends.strategies import RUN_CONTRACT_CASES

    dtypes = st.sampled_from((None, "bfloat16", "float8_e4m3fn", "float16"))
    scales = st.sampled_from(BMM)
    free = st.builds(RunArguments, out_dtype=dtypes, lse_buffer=st.booleans(), return_lse=st.booleans(),
                     return_lse_base_on_e=st.booleans(), o_scale=st.booleans(), ckv_scale=st.booleans(),
                     ckv_scale_arr=st.booleans(), kpe_scale=st.booleans(), sinks=st.booleans(),
                     skip_softmax_factor=st.booleans(), bmm1_scale=scales, bmm2_scale=scales)

    def near(pair: tuple[InputContract, str]) -> tuple[InputContract, RunArguments]:
        from kvsim.properties.mla_backends.selection import flip

        contract, field = pair
        return contract, flip(planned_run(contract), field)

    contracts = RUN_CONTRACT_CASES.map(lambda pair: pair[0])
    return st.one_of(RUN_CONTRACT_CASES.map(near), st.tuples(contracts, free),
                     contracts.map(lambda c: (c, planned_run(c))))


def run_contract(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    result = TargetResult("run-contract", source.version)
    cls = load(source, CONTRACTS, ["MLAInputContract"]).MLAInputContract

    def check(pair: tuple[InputContract, RunArguments]) -> None:
        contract, run = pair
        want, got = validate_run(contract, run), upstream_call(cls, contract, run)
        result.compared += 1
        if want != got:
            result.diverge({"contract": dataclasses.asdict(contract), "run": dataclasses.asdict(run)}, want, got)

    drive(cases(), check, options)
    result.note = f"{options.max_examples} (contract, run arguments) pairs: planned, one argument changed, or free"
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "run-contract", CONTRACTS, ("MLAInputContract",), "mla-backends",
           "run() arguments against the planned input contract: accepted, or refused naming the rule",
           run_contract),
)
