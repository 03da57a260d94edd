"""vLLM's uniform-plan context accumulation on its own Triton kernels: `mask_empty_context` (#49294) and
`merge_attn_states` (vllm/v1/attention/ops/triton_merge_attn_states.py), against the `mla-chunks` model.

Target `mla-context-accumulation` (releases with the uniform plan, before b38e111d): the per-chunk partials
of `_compute_prefill_context` (each chunk's attention as the model's backend gives it, an empty span's
scratch included: NaN output, finite LSE) are handed to the release's kernels, which the adapter calls in
the order of that loop: `mask_empty_context(lse, out, query_start_loc, cu_seq_lens[i])` when
`has_empty_context[i]` (only where the release has it: #49294), the first chunk kept, every later one
merged with `merge_attn_states` into the other of two ping-pong buffers. The result is compared with the
model's `compute_prefill_context` of the release's variant (`pre_b38e111d` with the mask, `uniform_unmasked`
without) within the fp32 kernel-path tolerance of `gpu_oracle` (`KERNEL_PATH_TOLERANCE`; NaN where the model
has NaN), and probe `context_partial_matches_context_attention` (the #49294 seed bug's property) checks the
release's accumulated partial against attention over each request's whole context.
Adapter conventions: the loop itself, the gather, the up-projection and the backend's per-chunk attention are
the model's (they need CUDA upstream); partials are float32 (a CUDA backend's output) on CPU tensors, Triton
under the interpreter; `query_start_loc` and `cu_seq_lens` are int32; batches without DCP
(`_context_parallel_compute_prefill_context` is another loop).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..kernels import Divergence, KernelCheck, Probe, as_target, unpacked
from ..loader import names_in
from ..source import EngineSource

MERGE = "vllm/v1/attention/ops/triton_merge_attn_states.py"
MLA = "vllm/model_executor/layers/attention/mla_attention.py"
NAME = "mla-context-accumulation"
PROBED = 6  # drawn batches the probe adds to the pinned ones


# --- child side ---------------------------------------------------------------------------------------

_LOADED: dict[tuple[str, bool], Any] = {}


def run_accumulate(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from ..triton_child import load_upstream
    from .common import vllm_modules

    masked = bool(case["masked"])
    key = (str(source.root), masked)
    if key not in _LOADED:
        names = ("merge_attn_states", "mask_empty_context") if masked else ("merge_attn_states",)
        _LOADED[key] = load_upstream(source, MERGE, names, modules=vllm_modules(device))
    ns = _LOADED[key]
    qsl = torch.tensor(case["qsl"], dtype=torch.int32, device=device)
    output = output_lse = merge_output = merge_output_lse = None
    for chunk in case["chunks"]:  # the loop of _compute_prefill_context
        out = torch.from_numpy(unpack(chunk["out"])).to(device)
        lse = torch.from_numpy(unpack(chunk["lse"])).to(device)
        if masked and chunk["has_empty"]:
            ns.mask_empty_context(lse, out, qsl, torch.tensor(chunk["cu"], dtype=torch.int32, device=device))
        if output is None:
            output, output_lse = out, lse
            continue
        if merge_output is None:
            merge_output, merge_output_lse = torch.empty_like(output), torch.empty_like(output_lse)
        ns.merge_attn_states(output=merge_output, output_lse=merge_output_lse, prefix_output=output,
                             prefix_lse=output_lse, suffix_output=out, suffix_lse=lse)
        output, merge_output = merge_output, output
        output_lse, merge_output_lse = merge_output_lse, output_lse
    if device == "cuda":
        torch.cuda.synchronize()
    assert output is not None and output_lse is not None
    return {"output": pack(output.cpu().numpy()), "lse": pack(output_lse.cpu().numpy())}


CHILD_KERNELS = {"vllm.mla_context_accumulate": run_accumulate}


# --- parent side --------------------------------------------------------------------------------------

_MASKED: dict[str, bool] = {}


def has_mask(source: EngineSource) -> bool:
    """#49294: the release neutralises empty spans before merging."""
    key = str(source.file(MERGE))
    if key not in _MASKED:
        _MASKED[key] = "mask_empty_context" in names_in(source.file(MERGE))
    return _MASKED[key]


def release_variant(source: EngineSource) -> Any:
    from kvsim.models.mla_chunks.planner import VARIANTS

    return VARIANTS["pre_b38e111d" if has_mask(source) else "uniform_unmasked"]


def uniform_loop_shape(source: EngineSource) -> str | None:
    if source.has(MLA) and "plan_mla_context_chunks" in names_in(source.file(MLA)):
        return (f"{MLA}: {source.label} plans per request (b38e111d): the uniform loop with mask_empty_context is "
                "gone (empty spans are never planned)")
    return None


def upstream_partial(child: Any, case: Any) -> tuple[Any, Any, np.ndarray, np.ndarray] | None:
    """(inputs, model variant, output, lse) of the release's accumulation, or None for a batch without context;
    kept per child, so the differential and the probe run a pinned batch through the interpreter once."""
    seen = child.__dict__.setdefault("_mla_context_accumulated", {})
    if case not in seen:
        seen[case] = _upstream_partial(child, case)
    return seen[case]


def _upstream_partial(child: Any, case: Any) -> tuple[Any, Any, np.ndarray, np.ndarray] | None:
    from kvsim.gpu_oracle.runtime.asan import pack
    from kvsim.models.mla_chunks.attention import run_prefill_context_chunk
    from kvsim.models.mla_chunks.prefill import (build_context_caches, gather_chunk_rows, make_mla_prefill_inputs,
                                                 up_project)

    variant = release_variant(child.source)
    metadata = case.metadata(variant)
    if metadata is None or case.dcp is not None:
        return None
    inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, case.seed)
    caches = build_context_caches(inputs, case.block_size, None, case.seed + 1)
    chunks = []
    for chunk in metadata.chunks:
        k, v = up_project(gather_chunk_rows(chunk, caches, None), inputs)
        out, lse = run_prefill_context_chunk(inputs.q[chunk.token_slice], k, v, chunk.query_start_loc,
                                             chunk.cu_seq_lens, inputs.shape.softmax_scale)
        chunks.append({"out": pack(out.astype(np.float32)), "lse": pack(lse.astype(np.float32)),
                       "cu": list(chunk.cu_seq_lens), "has_empty": bool(chunk.has_empty_context)})
    result = child.call("vllm.mla_context_accumulate", {"masked": has_mask(child.source),
                                                        "qsl": list(case.query_start_loc), "chunks": chunks})
    return (inputs, variant, unpacked(result, "output").astype(np.float64),
            unpacked(result, "lse").astype(np.float64))


def states_differ(out: np.ndarray, lse: np.ndarray, want_out: np.ndarray, want_lse: np.ndarray,
                  nan_ok: bool) -> str | None:
    """Where fp32 states differ from float64 ones beyond the kernel-path tolerance (-inf exact)."""
    from kvsim.gpu_oracle.kernels.mla_context.prefill_properties import KERNEL_PATH_TOLERANCE

    rtol, atol = KERNEL_PATH_TOLERANCE["output"]
    with np.errstate(invalid="ignore"):  # -inf - -inf: the exact comparison decides those
        close = np.abs(out - want_out) <= atol + rtol * np.abs(want_out)
        lse_close = (lse == want_lse) | (np.abs(lse - want_lse) <= KERNEL_PATH_TOLERANCE["lse_rtol"]
                                         * (1 + np.abs(want_lse)))
    if nan_ok:
        close |= np.isnan(out) & np.isnan(want_out)
    if nan_ok:
        lse_close |= np.isnan(lse) & np.isnan(want_lse)
    bad = ~close.all(axis=(1, 2)) | ~lse_close.all(axis=0)
    if not bad.any():
        return None
    t = int(np.argmax(bad))
    return (f"token {t}: expected output {np.round(want_out[t, 0, :3], 6).tolist()}... lse "
            f"{np.round(want_lse[:, t], 6).tolist()}, got output {np.round(out[t, 0, :3], 6).tolist()}... lse "
            f"{np.round(lse[:, t], 6).tolist()} ({int(bad.sum())} tokens off)")


def accumulate_compare(child: Any, case: Any) -> Divergence | None:
    from hypothesis import reject

    from kvsim.models.mla_chunks.prefill import build_context_caches, compute_prefill_context

    got = upstream_partial(child, case)
    if got is None:
        reject()
    inputs, variant, out, lse = got
    metadata = case.metadata(variant)
    want_out, want_lse = compute_prefill_context(inputs, metadata, build_context_caches(inputs, case.block_size, None,
                                                                                        case.seed + 1), variant)
    differ = states_differ(out, lse, want_out, want_lse, nan_ok=True)
    if differ is None:
        return None
    return Divergence(case, f"compute_prefill_context ({variant.name}, float64)",
                      "mask_empty_context + merge_attn_states (fp32)", differ)


def probe_cases() -> list[Any]:
    from hypothesis import HealthCheck, given, settings

    from kvsim.properties.mla_chunks.cases import NUMERIC_EXAMPLES
    from kvsim.properties.mla_chunks.strategies import numeric_cases

    drawn: list[Any] = []

    def keep(case: Any) -> None:
        drawn.append(case)

    settings(max_examples=PROBED, database=None, derandomize=True, deadline=None,
             suppress_health_check=list(HealthCheck))(given(numeric_cases(dcp=False))(keep))()
    return [c for c in NUMERIC_EXAMPLES if c.dcp is None] + drawn


def context_partial_probe(child: Any) -> str | None:
    """The #49294 seed bug's property on the release's kernels: each token's accumulated context partial is attention
    over its request's whole context ((0, -inf) for a context-free request)."""
    from kvsim.models.mla_chunks.prefill import context_attention_reference

    for case in probe_cases():
        got = upstream_partial(child, case)
        if got is None:
            continue
        inputs, _, out, lse = got
        want_out, want_lse = context_attention_reference(inputs)
        differ = states_differ(out, lse, want_out, want_lse, nan_ok=False)
        if differ is not None:
            return f"context partial for contexts {list(case.context_lens)}, W {case.workspace_size}: {differ}"
    return None


def _strategy() -> Any:
    from kvsim.properties.mla_chunks.strategies import numeric_cases

    return numeric_cases(dcp=False)


def _pinned() -> list[Any]:
    from kvsim.properties.mla_chunks.cases import NUMERIC_EXAMPLES

    return [c for c in NUMERIC_EXAMPLES if c.dcp is None and c.shape.kv_lora_rank <= 64]


ACCUMULATE = KernelCheck(
    engine="vllm", name=NAME, relpath=MERGE, symbols=("merge_attn_states", "merge_attn_states_kernel"),
    model="mla-chunks", doc=__doc__.split("\n\n")[1].strip(), kernel="vllm.mla_context_accumulate",
    strategy=_strategy, compare=accumulate_compare, pinned=_pinned, shape=uniform_loop_shape,
    probes=(Probe("context_partial_matches_context_attention",
                  "the #49294 property on the release's mask_empty_context + merge_attn_states",
                  context_partial_probe),))

TARGETS = (as_target(ACCUMULATE),)
