"""vLLM's Triton `merge_attn_states` (vllm/v1/attention/ops/triton_merge_attn_states.py) against `mla-chunks`.

`MERGE` (target `merge-attn-states-triton`): the launcher and its kernel in a kernel child (the interpreter on
the CPU, or a GPU), on fp32 partial states, against `kvsim.models.mla_chunks.attention.merge_attn_states` in
float64, within `TOLERANCE` (`Close`: NaN equals NaN, infinities only themselves). Every parameter is drawn:
the states of `gpu_oracle`'s `MERGE_CASES` (LSEs finite, -inf or FA2's +inf on either or both sides,
outputs of magnitude 1 or 100, padded head strides), `output_lse` None or a tensor,
`prefill_tokens_with_context` None or any cut (tokens from it on copy the suffix state as it is), `output_scale`
None or a scale (the FP8 output: `out / scale` saturated to +-448 and rounded to float8 e4m3fn), the output's
own head padding, and each LSE (prefix, suffix, output) contiguous [H, T] or a transposed view of [T, H] (where
the release indexes LSEs by their strides, 0.27.1 on; before, contiguous only). The answer: the merged output,
the LSE (None without `output_lse`), and whether the output's padding kept its sentinel. The NaN-LSE inputs
(`nan_lse_cases`) run first, always.
Adapter conventions: upstream assumes the token stride is `num_heads * head_stride`, so the cases' `token_pad`
is dropped (head padding is kept); `current_platform.fp8_dtype()` is `torch.float8_e4m3fn`; the model's scale
is the fp32 scale upstream reads. Under the Triton interpreter the fp32 -> float8e4nv conversion is torch's
(round to nearest even, as the GPU's `cvt.rn.satfinite`): the interpreter's own (`_convert_float`) drops the
carry of a mantissa that rounds up into the next binade (31.7 -> 16, not 32), a bug of the emulation, not of
the kernel (`exact_fp8_conversion`).
Probe `merge_nan_lse_beside_empty`: upstream's `tl.maximum` is maxnum, so a NaN LSE beside an empty side
(-inf/+inf) is dropped and the merge gives (0, -inf); beside a finite LSE both give NaN. The model kept the NaN
until this target found the difference; it now takes `fmax` as the kernels do.
Survivors: five equivalent mutants, documented in `models/mla_chunks/conform.py` (`MERGE_EQUIVALENT`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential, Probe
from kvsim.engine.conformance.answers import FAILED, capture
from kvsim.engine.conformance.compare import Close

from ..kernels import call_kernel, kernel_examples, unpacked
from ..source import EngineSource
from .common import load_in_child

MERGE = "vllm/v1/attention/ops/triton_merge_attn_states.py"
MERGE_SYMBOLS = ("merge_attn_states", "merge_attn_states_kernel")
RUNNER = "kvsim.conform.vllm.merge_states:run_merge"
LAYOUTS = ("head_major", "token_major")  # an LSE as a contiguous [H, T], or the transpose of a contiguous [T, H]
PAD_BYTE = 0x5A  # what the padding of an FP8 output holds before the launch (-7777.25 for fp32)
TOLERANCE = Close(rtol=2e-6, atol=4e-5)


# --- child side ----------------------------------------------------------------------------------------

def exact_fp8_conversion() -> None:
    """Give the Triton interpreter torch's fp32 -> float8e4nv conversion (round to nearest even); every other
    conversion stays the interpreter's. Its own loses the carry into the exponent (triton 3.x)."""
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    if getattr(original, "kvsim_exact_fp8", False):
        return

    def convert(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv and getattr(rounding_mode, "name", "") == "RTNE":
            values = torch.from_numpy(np.ascontiguousarray(input).view(np.float32))
            return values.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(input.shape)
        return original(input, input_dtype, output_dtype, rounding_mode)

    convert.kvsim_exact_fp8 = True  # type: ignore[attr-defined]
    interpreter._convert_float = convert


def _lse(torch: Any, values: np.ndarray, layout: str, device: str) -> Any:
    """An [H, T] LSE tensor in the given layout."""
    if layout == "token_major":
        return torch.from_numpy(np.ascontiguousarray(values.T)).to(device).t()
    return torch.from_numpy(np.ascontiguousarray(values)).to(device)


def run_merge(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    """One launch of the release's `merge_attn_states` on the document `merge_document` makes."""
    import torch

    from kvsim.gpu_oracle.kernels.mla_context.backends import PAD_SENTINEL
    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    ns = load_in_child(source, MERGE, MERGE_SYMBOLS, device)
    t, h, d = case["shape"]
    hs, ohs = case["head_stride"], case["output_head_stride"]
    fp8 = case["output_scale"] is not None
    if fp8 and device == "cpu":
        exact_fp8_conversion()

    def view(flat: np.ndarray, stride: int) -> Any:
        return torch.from_numpy(flat).to(device).as_strided((t, h, d), (h * stride, stride, 1))

    if fp8:
        out_flat = torch.full((t * h * ohs,), PAD_BYTE, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    else:
        out_flat = torch.from_numpy(unpack(case["output"])).to(device)
    output = out_flat.as_strided((t, h, d), (h * ohs, ohs, 1))
    prefix_layout, suffix_layout, output_layout = case["lse_layouts"]
    lse = None
    if case["with_lse"]:
        lse = _lse(torch, np.full((h, t), np.nan, dtype=np.float32), output_layout, device)
    scale = torch.tensor([case["output_scale"]], dtype=torch.float32, device=device) if fp8 else None
    ns.merge_attn_states(output, view(unpack(case["prefix"]), hs), _lse(torch, unpack(case["prefix_lse"]),
                                                                         prefix_layout, device),
                         view(unpack(case["suffix"]), hs), _lse(torch, unpack(case["suffix_lse"]), suffix_layout,
                                                                device),
                         lse, case["prefill_tokens_with_context"], scale)
    if device == "cuda":
        torch.cuda.synchronize()
    covered = torch.zeros(out_flat.shape, dtype=torch.bool)
    covered.as_strided((t, h, d), (h * ohs, ohs, 1)).fill_(True)
    flat = out_flat.cpu()
    if fp8:
        untouched = bool((flat.view(torch.uint8)[~covered] == PAD_BYTE).all())
    else:
        untouched = bool((flat[~covered] == float(PAD_SENTINEL)).all())
    return {"output": pack(output.cpu().float().contiguous().numpy()),
            "lse": None if lse is None else pack(lse.cpu().contiguous().numpy()), "padding_untouched": untouched}


# --- parent side ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MergeCall:
    """One call of `merge_attn_states`: the states (`MergeCase`: outputs, LSEs, input head padding, whether
    `output_lse` is passed) and the launcher's other parameters."""

    states: Any  # kvsim.gpu_oracle.kernels.mla_context.cases.MergeCase
    output_head_pad: int = 0
    prefill_tokens_with_context: int | None = None
    output_scale: float | None = None  # the FP8 output's scale (fp32)
    lse_layouts: tuple[str, str, str] = ("head_major",) * 3  # prefix, suffix, output

    def __canon__(self) -> dict[str, Any]:
        s = self.states
        return {"T_H_D": list(s.prefix_output.shape), "prefix_lse": s.prefix_lse, "suffix_lse": s.suffix_lse,
                "head_pad": s.head_pad, "output_head_pad": self.output_head_pad, "with_lse": s.with_lse,
                "prefill_tokens_with_context": self.prefill_tokens_with_context, "output_scale": self.output_scale,
                "lse_layouts": list(self.lse_layouts)}


@st.composite
def merge_calls(draw: st.DrawFn, lse_strides: bool) -> MergeCall:
    from kvsim.gpu_oracle.kernels.mla_context.strategies import MERGE_CASES

    states = draw(MERGE_CASES)
    t = states.prefix_output.shape[0]
    cut = draw(st.one_of(st.none(), st.integers(-1, t + 1)))
    scale = draw(st.one_of(st.none(), st.sampled_from((0.37, 0.05, 1.0, 3.0))))
    layouts = tuple(draw(st.sampled_from(LAYOUTS)) for _ in range(3)) if lse_strides else ("head_major",) * 3
    return MergeCall(states, draw(st.integers(0, 3)), cut, None if scale is None else float(np.float32(scale)),
                     layouts)  # type: ignore[arg-type]


def merge_document(call: MergeCall) -> dict[str, Any]:
    from kvsim.gpu_oracle.kernels.mla_context.backends import PAD_SENTINEL, prepare_merge
    from kvsim.gpu_oracle.runtime.asan import pack

    s = call.states
    launch = prepare_merge(s.prefix_output, s.prefix_lse, s.suffix_output, s.suffix_lse, head_pad=s.head_pad,
                           token_pad=0, with_lse=s.with_lse)
    t, h, d = launch.shape
    output_stride = d + call.output_head_pad
    return {"shape": list(launch.shape), "head_stride": launch.head_stride, "output_head_stride": output_stride,
            "with_lse": s.with_lse, "prefix": pack(launch.prefix), "suffix": pack(launch.suffix),
            "prefix_lse": pack(launch.prefix_lse), "suffix_lse": pack(launch.suffix_lse),
            "output": pack(np.full(t * h * output_stride, PAD_SENTINEL, dtype=np.float32)),
            "prefill_tokens_with_context": call.prefill_tokens_with_context, "output_scale": call.output_scale,
            "lse_layouts": list(call.lse_layouts)}


def merge_model(ctx: Context, call: MergeCall) -> dict[str, Any]:
    from kvsim.models.mla_chunks.attention import merge_attn_states

    s = call.states
    out, lse = merge_attn_states(*(x.astype(np.float64) for x in (s.prefix_output, s.prefix_lse, s.suffix_output,
                                                                   s.suffix_lse)),
                                 prefill_tokens_with_context=call.prefill_tokens_with_context,
                                 output_scale=call.output_scale)
    return {"output": out, "lse": lse if s.with_lse else None, "padding_untouched": True}


def merge_upstream(ctx: Context, call: MergeCall) -> dict[str, Any]:
    result = call_kernel(ctx, RUNNER, merge_document(call))
    lse = unpacked(result, "lse").astype(np.float64) if result["lse"] is not None else None
    return {"output": unpacked(result, "output").astype(np.float64), "lse": lse,
            "padding_untouched": bool(result["padding_untouched"])}


def nan_lse_cases() -> list[MergeCall]:
    """One token, one head, dim 3: a NaN prefix LSE beside an empty suffix (-inf, +inf), and beside a finite one."""
    from kvsim.gpu_oracle.kernels.mla_context.cases import MergeCase

    out = np.array([[[0.5, -1.0, 2.0]]], dtype=np.float32)
    return [MergeCall(MergeCase(out, np.array([[np.nan]], np.float32), out * 3, np.array([[other]], np.float32),
                                0, 0, 32, True)) for other in (-np.inf, np.inf, 1.5)]


def merge_nan_probe(ctx: Context) -> str | None:
    """Upstream drops a NaN LSE beside an empty side ((0, -inf)) and keeps it beside a finite one (NaN)."""
    for call in nan_lse_cases():
        got = capture(merge_upstream, ctx, call)
        if isinstance(got, FAILED):
            return f"the NaN-LSE merge did not answer: {got}"
        out, lse = got["output"], got["lse"]
        other = float(call.states.suffix_lse[0, 0])
        if np.isfinite(other):
            if not (np.isnan(lse).all() and np.isnan(out).all()):
                return f"NaN beside finite LSE {other}: upstream gave lse {lse.tolist()}, out {out.tolist()}"
        elif not (np.isneginf(lse).all() and (out == 0).all()):
            return (f"NaN beside empty LSE {other}: upstream gave lse {lse.tolist()}, out {out.tolist()} (expected "
                    f"-inf, 0)")
    return None


def prepare_merge(ctx: Context) -> None:
    """Whether the release's kernel indexes LSEs by their strides (0.27.1 on)."""
    import inspect

    ctx.state["lse_strides"] = "prefix_lse_head_stride" in inspect.signature(ctx.up.merge_attn_states_kernel).parameters


def parent_loading(upstream: Any, up: Any) -> dict[str, Any]:
    """In this process the kernel is only read (its parameters), never launched: the fp8 dtype its module reads."""
    from types import SimpleNamespace

    import torch

    platform = SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)
    return {"modules": {"vllm.platforms": SimpleNamespace(current_platform=platform)}}


MERGE_STATES = Differential(
    kernel=True, examples=kernel_examples, loading=parent_loading, prepare=prepare_merge,
    inputs=lambda ctx: merge_calls(ctx.state["lse_strides"]), pinned=lambda ctx: nan_lse_cases(),
    model=merge_model, upstream=merge_upstream, compare=TOLERANCE, describe=lambda ctx, call: call,
    probes=(Probe("merge_nan_lse_beside_empty",
                  "a NaN LSE beside an empty side merges to (0, -inf) (maxnum), beside a finite LSE to NaN, "
                  "in upstream and in the model alike", merge_nan_probe),))
