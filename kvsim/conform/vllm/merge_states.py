"""vLLM's Triton `merge_attn_states` as a conform target (`mla-chunks`).

`merge-attn-states-triton`: `merge_attn_states` (vllm/v1/attention/ops/triton_merge_attn_states.py)
  on fp32 states, against `kvsim.models.mla_chunks.attention.merge_attn_states` in float64 within
  `gpu_oracle`'s `MERGE_TOLERANCE`, with empty states (-inf, FA2's +inf, both sides) and padded
  head strides. Adapter: upstream assumes the token stride is `num_heads * head_stride`, so the
  cases' `token_pad` is dropped (head padding is kept); `output_lse=None` when the case has no LSE;
  `current_platform.fp8_dtype()` is `torch.float8_e4m3fn` (only the FP8 output path reads it).
  NaN LSEs (probe `merge_nan_lse_beside_empty`): upstream's `tl.maximum` is maxnum, so a NaN LSE
  beside an empty side (-inf/+inf) is dropped and the merge gives (0, -inf); beside a finite LSE
  both give NaN. The model kept the NaN until this target found the difference; it now takes
  `fmax` as the kernels do, and the probe checks that model and upstream agree on these cases.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..kernels import Divergence, KernelCheck, Probe, as_target, unpacked
from ..source import EngineSource
from .common import load_in_child as _load

MERGE = "vllm/v1/attention/ops/triton_merge_attn_states.py"
MERGE_SYMBOLS = ("merge_attn_states", "merge_attn_states_kernel")


def run_merge(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    ns = _load(source, MERGE, MERGE_SYMBOLS, device)
    t, h, d = case["shape"]
    hs = case["head_stride"]

    def view(flat: np.ndarray) -> Any:
        return torch.from_numpy(flat).to(device).as_strided((t, h, d), (h * hs, hs, 1))

    out_flat = torch.from_numpy(unpack(case["output"])).to(device)
    output = out_flat.as_strided((t, h, d), (h * hs, hs, 1))
    lse = torch.full((h, t), float("nan"), dtype=torch.float32, device=device) if case["with_lse"] else None
    ns.merge_attn_states(output, view(unpack(case["prefix"])), torch.from_numpy(unpack(case["prefix_lse"])).to(device),
                         view(unpack(case["suffix"])), torch.from_numpy(unpack(case["suffix_lse"])).to(device), lse)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"output": pack(out_flat.cpu().numpy()), "lse": None if lse is None else pack(lse.cpu().numpy())}


CHILD_KERNELS = {"vllm.merge_attn_states": run_merge}


# --- parent side: merge_attn_states -------------------------------------------------------------------

def merge_document(case: Any) -> tuple[dict[str, Any], Any]:
    from kvsim.gpu_oracle.kernels.mla_context.backends import PAD_SENTINEL, prepare_merge
    from kvsim.gpu_oracle.runtime.asan import pack

    launch = prepare_merge(case.prefix_output, case.prefix_lse, case.suffix_output, case.suffix_lse,
                           head_pad=case.head_pad, token_pad=0, with_lse=case.with_lse)
    out = np.full(len(launch.prefix), PAD_SENTINEL, dtype=np.float32)
    return ({"shape": list(launch.shape), "head_stride": launch.head_stride, "with_lse": case.with_lse,
             "prefix": pack(launch.prefix), "suffix": pack(launch.suffix), "prefix_lse": pack(launch.prefix_lse),
             "suffix_lse": pack(launch.suffix_lse), "output": pack(out)}, launch)


def merge_upstream(child: Any, case: Any) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """(output [T, H, D], lse or None, padding untouched) from upstream's merge."""
    from kvsim.gpu_oracle.kernels.mla_context.backends import PAD_SENTINEL

    document, launch = merge_document(case)
    result = child.call("vllm.merge_attn_states", document)
    flat = unpacked(result, "output")
    covered = np.zeros(len(flat), dtype=bool)
    np.lib.stride_tricks.as_strided(covered, launch.shape, (launch.token_stride, launch.head_stride, 1))[...] = True
    lse = unpacked(result, "lse") if result["lse"] is not None else None
    return launch.view(flat).copy(), lse, bool((flat[~covered] == PAD_SENTINEL).all())


def merge_compare(child: Any, case: Any) -> Divergence | None:
    from kvsim.gpu_oracle.kernels.mla_context.properties import merge_violation

    out, lse, untouched = merge_upstream(child, case)
    message = merge_violation(case, "triton merge_attn_states", out, lse, untouched)
    if message is None:
        return None
    return Divergence(case, "float64 merge_attn_states within MERGE_TOLERANCE", "triton merge_attn_states", message)


def _merge_strategy() -> Any:
    from kvsim.gpu_oracle.kernels.mla_context import strategies

    return strategies.MERGE_CASES


def nan_lse_cases() -> list[Any]:
    """One token, one head, dim 3: a NaN prefix LSE beside an empty suffix (-inf, +inf), and beside a finite one."""
    from kvsim.gpu_oracle.kernels.mla_context.cases import MergeCase

    out = np.array([[[0.5, -1.0, 2.0]]], dtype=np.float32)
    return [MergeCase(out, np.array([[np.nan]], np.float32), out * 3, np.array([[other]], np.float32), 0, 0, 32, True)
            for other in (-np.inf, np.inf, 1.5)]


def merge_nan_probe(child: Any) -> str | None:
    """Upstream drops a NaN LSE beside an empty side ((0, -inf)) and keeps it beside a finite one (NaN)."""
    from kvsim.models.mla_chunks.attention import merge_attn_states as model_merge

    for case in nan_lse_cases():
        out, lse, _ = merge_upstream(child, case)
        ref_out, ref_lse = model_merge(*(x.astype(np.float64) for x in (case.prefix_output, case.prefix_lse,
                                                                        case.suffix_output, case.suffix_lse)))
        other = float(case.suffix_lse[0, 0])
        assert lse is not None
        if np.isfinite(other):
            if not (np.isnan(lse).all() and np.isnan(out).all() and np.isnan(ref_lse).all()):
                return (f"NaN beside finite LSE {other}: upstream gave lse {lse.tolist()}, out {out.tolist()}; "
                        f"model lse {ref_lse.tolist()}")
        elif not (np.isneginf(lse).all() and (out == 0).all() and np.isneginf(ref_lse).all()
                  and (ref_out == 0).all()):
            return (f"NaN beside empty LSE {other}: upstream gave lse {lse.tolist()}, out {out.tolist()}; "
                    f"model lse {ref_lse.tolist()}, out {ref_out.tolist()} (expected -inf, 0 on both)")
    return None


MERGE_ATTN_STATES = KernelCheck(
    engine="vllm", name="merge-attn-states-triton", relpath=MERGE, symbols=MERGE_SYMBOLS, model="mla-chunks",
    doc=__doc__.split("\n\n")[1].strip(), kernel="vllm.merge_attn_states", strategy=_merge_strategy,
    compare=merge_compare,
    probes=(Probe("merge_nan_lse_beside_empty",
                  "a NaN LSE beside an empty side merges to (0, -inf) (maxnum), beside a finite LSE to NaN, "
                  "in upstream and in the model alike",
                  merge_nan_probe),))

TARGETS = (as_target(MERGE_ATTN_STATES),)
