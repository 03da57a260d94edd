"""vLLM's uniform-plan context accumulation on its own Triton kernels: `mask_empty_context` (#49294) and
`merge_attn_states` (vllm/v1/attention/ops/triton_merge_attn_states.py), against the `mla-chunks` model.

`ACCUMULATE` (target `mla-context-accumulation`, releases with the uniform plan, before b38e111d): the per-chunk
partials of `_compute_prefill_context` (each chunk's attention as the model's backend gives it, an empty span's
scratch included: NaN output, finite LSE) are handed to the release's kernels in a kernel child, which runs
them in the order of that loop: `mask_empty_context(lse, out, query_start_loc, cu_seq_lens[i])` when
`has_empty_context[i]` (where the release has it: #49294, 0.26.0 on), the first chunk kept, every later one
merged with `merge_attn_states` into the other of two ping-pong buffers. The accumulated (output, LSE) is
compared with the model's `compute_prefill_context` of the release's variant (the declaration's table:
`uniform_unmasked` before 0.26.0, `pre_b38e111d` from it) within the fp32 kernel-path tolerance of
`gpu_oracle` (`KERNEL_PATH_TOLERANCE`; NaN where the model has NaN). Probe
`context_partial_matches_context_attention` (the #49294 seed bug's property) checks the release's accumulated
partial against attention over each request's whole context, on the pinned batches and a few drawn ones.
The checked definitions are the mask's (the merge is `merge-attn-states-triton`'s, on all its parameters).
Adapter conventions: the loop itself, the gather, the up-projection and the backend's per-chunk attention are
the model's (they need CUDA upstream); partials are float32 (a CUDA backend's output) on CPU tensors, Triton
under the interpreter; `query_start_loc` and `cu_seq_lens` are int32; batches without DCP
(`_context_parallel_compute_prefill_context` is another loop); a release whose MLA module plans per request
(0.28.0 on: no empty spans are planned) is "not present".
Survivors: none documented.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvsim.engine.conformance.adapters import Context, Differential, Probe
from kvsim.engine.conformance.answers import FAILED, capture
from kvsim.engine.conformance.compare import Close

from ..kernels import call_kernel, kernel_examples, unpacked
from ..loader import names_in
from ..source import EngineSource
from .merge_states import parent_loading

MERGE = "vllm/v1/attention/ops/triton_merge_attn_states.py"
MLA = "vllm/model_executor/layers/attention/mla_attention.py"
RUNNER = "kvsim.conform.vllm.context_merge:run_accumulate"
PROBED = 6  # drawn batches the probe adds to the pinned ones
TOLERANCE = Close(rtol=2e-5, atol=2e-5)  # gpu_oracle's KERNEL_PATH_TOLERANCE: fp32 merges over float64 attention


# --- child side ---------------------------------------------------------------------------------------

def run_accumulate(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    """The loop of `_compute_prefill_context` over the document's chunk partials, on the release's kernels."""
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from .common import load_in_child

    masked = bool(case["masked"])
    names = ("merge_attn_states", "mask_empty_context") if masked else ("merge_attn_states",)
    ns = load_in_child(source, MERGE, names, device)
    qsl = torch.tensor(case["qsl"], dtype=torch.int32, device=device)
    output = output_lse = merge_output = merge_output_lse = None
    for chunk in case["chunks"]:
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


# --- parent side --------------------------------------------------------------------------------------

def batch_inputs(case: Any) -> tuple[Any, Any]:
    """The batch's float64 inputs and paged caches (no DCP), as the model's prefill makes them."""
    from kvsim.models.mla_chunks.prefill import build_context_caches, make_mla_prefill_inputs

    inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, case.seed)
    return inputs, build_context_caches(inputs, case.block_size, None, case.seed + 1)


def accumulate_model(ctx: Context, case: Any) -> dict[str, Any]:
    from kvsim.models.mla_chunks.prefill import compute_prefill_context

    inputs, caches = batch_inputs(case)
    out, lse = compute_prefill_context(inputs, case.metadata(ctx.variant), caches, ctx.variant)
    return {"output": out, "lse": lse}


def accumulate_upstream(ctx: Context, case: Any) -> dict[str, Any]:
    """The release's accumulation of the model backend's chunk partials; kept per case, so the differential and
    the probe run a pinned batch through the interpreter once."""
    seen = ctx.state.setdefault("accumulated", {})
    if case not in seen:
        seen[case] = _accumulate_upstream(ctx, case)
    return seen[case]


def _accumulate_upstream(ctx: Context, case: Any) -> dict[str, Any]:
    from kvsim.gpu_oracle.runtime.asan import pack
    from kvsim.models.mla_chunks.attention import run_prefill_context_chunk
    from kvsim.models.mla_chunks.prefill import gather_chunk_rows, up_project

    inputs, caches = batch_inputs(case)
    chunks = []
    for chunk in case.metadata(ctx.variant).chunks:
        k, v = up_project(gather_chunk_rows(chunk, caches, None), inputs)
        out, lse = run_prefill_context_chunk(inputs.q[chunk.token_slice], k, v, chunk.query_start_loc,
                                             chunk.cu_seq_lens, inputs.shape.softmax_scale)
        chunks.append({"out": pack(out.astype(np.float32)), "lse": pack(lse.astype(np.float32)),
                       "cu": list(chunk.cu_seq_lens), "has_empty": bool(chunk.has_empty_context)})
    result = call_kernel(ctx, RUNNER, {"masked": ctx.variant.mask_empty_context, "qsl": list(case.query_start_loc),
                                       "chunks": chunks})
    return {"output": unpacked(result, "output").astype(np.float64),
            "lse": unpacked(result, "lse").astype(np.float64)}


def probe_cases() -> list[Any]:
    """The pinned batches without DCP, and `PROBED` drawn ones (derandomized)."""
    from kvsim.engine.draws import derandomized_draws
    from kvsim.properties.mla_chunks.cases import NUMERIC_EXAMPLES
    from kvsim.properties.mla_chunks.strategies import numeric_cases

    drawn = derandomized_draws(numeric_cases(dcp=False), PROBED)
    return [c for c in NUMERIC_EXAMPLES if c.dcp is None] + drawn


def context_partial_probe(ctx: Context) -> str | None:
    """The #49294 seed bug's property on the release's kernels: each token's accumulated context partial is attention
    over its request's whole context ((0, -inf) for a context-free request)."""
    from kvsim.models.mla_chunks.prefill import context_attention_reference

    for case in probe_cases():
        if case.metadata(ctx.variant) is None:
            continue
        got = capture(accumulate_upstream, ctx, case)
        if isinstance(got, FAILED):
            return f"context partial for contexts {list(case.context_lens)}: the kernels did not answer: {got}"
        want_out, want_lse = context_attention_reference(batch_inputs(case)[0])
        differ = TOLERANCE.difference({"output": want_out, "lse": want_lse}, got)
        if differ is not None:
            return (f"context partial for contexts {list(case.context_lens)}, W {case.workspace_size}: "
                    f"{differ.line()}")
    return None


def uniform_loop_shape(ctx: Context) -> tuple[str, str] | None:
    source = ctx.source
    if source.has(MLA) and "plan_mla_context_chunks" in names_in(source.file(MLA)):
        return ("not present", f"{MLA}: {source.label} plans per request (b38e111d): the uniform loop with "
                               "mask_empty_context is gone (empty spans are never planned)")
    return None


def cases(ctx: Context) -> Any:
    """`numeric_cases` without DCP that have context (a plan to accumulate) under the release's variant."""
    from kvsim.properties.mla_chunks.strategies import numeric_cases

    return numeric_cases(dcp=False).filter(lambda case: case.metadata(ctx.variant) is not None)


def long_queries() -> Any:
    """128 query tokens, one head (the mask's grid reserves a block per request more than the batch fills: its
    last one finds no token), a context-free request and a short one that runs out before the second chunk."""
    from kvsim.models.mla_chunks.prefill import MlaShape
    from kvsim.properties.mla_chunks.cases import case

    return case([16, 0, 4], [126, 1, 1], block_size=4, workspace_size=16, shape=MlaShape(num_heads=1))


def pinned(ctx: Context) -> list[Any]:
    """The pinned upstream batches of the float64 path at small dims (the three-request ones of a few tokens), and
    `long_queries`."""
    from kvsim.properties.mla_chunks.cases import NUMERIC_EXAMPLES

    return [c for c in (*NUMERIC_EXAMPLES, long_queries()) if c.dcp is None and c.shape.kv_lora_rank <= 64
            and c.query_start_loc[-1] <= 128 and c.metadata(ctx.variant) is not None]


def describe(ctx: Context, case: Any) -> dict[str, Any]:
    return {"context_lens": list(case.context_lens), "query_lens": list(case.query_lens), "block": case.block_size,
            "workspace": case.workspace(ctx.variant), "seed": case.seed}


ACCUMULATE = Differential(
    kernel=True, examples=kernel_examples, loading=parent_loading, skip=uniform_loop_shape, inputs=cases,
    pinned=pinned, model=accumulate_model, upstream=accumulate_upstream, compare=TOLERANCE, describe=describe,
    note=lambda ctx: f"model variant {ctx.variant.name}",
    probes=(Probe("context_partial_matches_context_attention",
                  "the #49294 property on the release's mask_empty_context + merge_attn_states",
                  context_partial_probe),))
