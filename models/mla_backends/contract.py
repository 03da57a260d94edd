"""The run-time input contract a plan promises (FlashInfer 0.7.4, `MLAInputContract.validate_run_options`).

`plan()` records the contract (`InputContract`); `run()` must match it: the LSE mode its LSE arguments imply
(`return_lse`, an `lse` buffer, `return_lse_base_on_e`), the output dtype, the output scale, sinks,
skip-softmax and the scale family (KV scales for FP8 KV, or BMM scales, both scalar or both tensor).
`validate_run` returns None or the name of the first rule broken (`RUN_RULES`), in upstream's order; a
mismatch tells the caller to re-plan, never makes `run()` select another backend.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_RULES = ("lse_mode", "output_dtype", "output_scale", "sinks", "skip_softmax", "scale_families", "bmm_pair",
             "bmm_types", "bmm_numeric", "scale_mode", "kv_scales", "kpe_scale", "kv_scales_not_fp8")
BMM = (None, "scalar", "tensor", "bool")  # what a bmm scale argument is: absent, a number, a tensor, not a number


@dataclass(frozen=True)
class InputContract:
    lse_mode: str = "none"  # none | base2 | basee
    output_dtype: str = "bfloat16"
    output_scale: str = "none"  # none | per-tensor
    scale_mode: str = "default"  # default | kv-per-tensor | bmm-scalar | bmm-tensor
    skip_softmax: bool = False
    use_sinks: bool = False


@dataclass(frozen=True)
class RunArguments:
    """The run() arguments the contract check reads (tensors reduced to presence and dtype)."""

    out_dtype: str | None = None  # the dtype of a caller-supplied `out`
    lse_buffer: bool = False
    return_lse: bool = False
    return_lse_base_on_e: bool = False
    o_scale: bool = False
    ckv_scale: bool = False
    ckv_scale_arr: bool = False
    kpe_scale: bool = False
    sinks: bool = False
    skip_softmax_factor: bool = False
    bmm1_scale: str | None = None  # one of BMM
    bmm2_scale: str | None = None


def lse_mode_of(run: RunArguments) -> str:
    if run.return_lse or run.lse_buffer or run.return_lse_base_on_e:
        return "basee" if run.return_lse_base_on_e else "base2"
    return "none"


def validate_run(contract: InputContract, run: RunArguments) -> str | None:
    """The first rule `run` breaks against the planned `contract`, or None."""
    if lse_mode_of(run) != contract.lse_mode:
        return "lse_mode"
    if (run.out_dtype or contract.output_dtype) != contract.output_dtype:
        return "output_dtype"
    if ("per-tensor" if run.o_scale else "none") != contract.output_scale:
        return "output_scale"
    if run.sinks != contract.use_sinks:
        return "sinks"
    if run.skip_softmax_factor != contract.skip_softmax:
        return "skip_softmax"
    kv_scale = run.ckv_scale or run.ckv_scale_arr or run.kpe_scale
    bmm = run.bmm1_scale is not None or run.bmm2_scale is not None
    if kv_scale and bmm:
        return "scale_families"
    if (run.bmm1_scale is None) != (run.bmm2_scale is None):
        return "bmm_pair"
    if run.bmm1_scale is not None:
        if (run.bmm1_scale == "tensor") != (run.bmm2_scale == "tensor"):
            return "bmm_types"
        if run.bmm1_scale == "tensor":
            mode = "bmm-tensor"
        elif "bool" in (run.bmm1_scale, run.bmm2_scale):
            return "bmm_numeric"
        else:
            mode = "bmm-scalar"
    else:
        mode = "kv-per-tensor" if contract.scale_mode == "kv-per-tensor" else "default"
    if mode != contract.scale_mode:
        return "scale_mode"
    if contract.scale_mode == "kv-per-tensor":
        if run.ckv_scale == run.ckv_scale_arr:
            return "kv_scales"
        if not run.kpe_scale:
            return "kpe_scale"
    elif kv_scale:
        return "kv_scales_not_fp8"
    return None


def planned_run(contract: InputContract) -> RunArguments:
    """The run() arguments that match `contract` exactly (what a caller that follows its plan passes)."""
    bmm = {"bmm-scalar": "scalar", "bmm-tensor": "tensor"}.get(contract.scale_mode)
    fp8 = contract.scale_mode == "kv-per-tensor"
    return RunArguments(return_lse=contract.lse_mode != "none", return_lse_base_on_e=contract.lse_mode == "basee",
                        o_scale=contract.output_scale == "per-tensor", ckv_scale=fp8, kpe_scale=fp8,
                        sinks=contract.use_sinks, skip_softmax_factor=contract.skip_softmax, bmm1_scale=bmm,
                        bmm2_scale=bmm)
