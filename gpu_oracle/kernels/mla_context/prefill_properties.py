"""End-to-end properties of the MLA chunked prefill against torch `scaled_dot_product_attention`.

* `mla_prefill_sdpa_oracle` (torch backends): the variant's
  `chunked_prefill_attention` equals SDPA over [context | new tokens] (context
  visible, new tokens causal) in float64 and float32, and its LSE equals float64
  logsumexp. It fails the uniform pre-fix variants (research note 1.7).
* `mla_prefill_sdpa_oracle_low_precision` (torch-cuda only): float16 and bfloat16.
* `mla_prefill_kernels_vs_sdpa` (every backend): the variant's prefill assembled from
  the backend's gather and fp32 merge kernels (the model supplies the per-chunk attention,
  the DCP reorg and the accumulation schedule) against float64 SDPA.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kernel_property
from kvsim.models.mla_chunks.attention import run_prefill_context_chunk
from kvsim.models.mla_chunks.metadata import mla_accumulation_schedule
from kvsim.models.mla_chunks.prefill import (MlaPrefillInputs, build_context_caches, chunked_prefill_attention,
                                             make_mla_prefill_inputs, reorg_chunk_rows, suffix_attention, up_project)
from kvsim.properties.mla_chunks.cases import MlaChunkCase

from ...runtime.discovery import BACKEND_NAMES
from .backends import gather_mla_context, merge_attn_states

MODEL = "mla-chunks"
# (rtol, atol) of |model - SDPA| <= atol + rtol |SDPA|, outputs O(1) (unit-variance values, logits O(1)).
# float64: both sides exact up to summation order (seen: 3.6e-15). float32: seen 1.2e-6 at most. float16 /
# bfloat16 (inputs rounded to 11 / 8 significant bits, accumulation in fp32): seen at most 4.1e-3 / 3.1e-2
# absolute on torch CPU over 2,000 generated cases; stated at 2.5x or more, in line with vLLM's bf16 rtol
# 1e-2 (trtllm_flashinfer.md 2.6). The low-precision figures are not yet measured on a GPU.
SDPA_TOLERANCE = {"float64": (1e-10, 1e-12), "float32": (2e-5, 2e-5), "float16": (1e-2, 1e-2),
                  "bfloat16": (4e-2, 8e-2)}
LSE_TOLERANCE = 1e-10  # float64 logsumexp vs the model's float64 LSE, relative to 1 + |lse|
# fp32 merges on top of float64 attention: each merge owes ~2e-6 relative (MERGE_TOLERANCE), a few chain up.
KERNEL_PATH_TOLERANCE = {"output": (2e-5, 2e-5), "lse_rtol": 1e-5}


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """One intra-op thread while a case runs: on these tiny tensors waking the thread pool costs more than the
    attention (seen 5-40x slower on a 2-core machine under load). Restores the setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def inputs_of(case: MlaChunkCase) -> MlaPrefillInputs:
    return make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, seed=case.seed)


def sdpa_full_attention(inputs: MlaPrefillInputs, dtype: str, device: str) -> tuple[np.ndarray, np.ndarray]:
    """Per request, SDPA over [context | new] in `dtype` on `device`, and the float64 logsumexp of its logits."""
    import torch

    qsl = inputs.query_start_loc
    outs, lses = [], []
    for r, (c, lat) in enumerate(zip(inputs.context_lens, inputs.latent)):
        n = inputs.query_lens[r]
        k, v = (torch.from_numpy(np.ascontiguousarray(x)).to(device).transpose(0, 1) for x in up_project(lat, inputs))
        q = torch.from_numpy(inputs.q[qsl[r]:qsl[r + 1]]).to(device).transpose(0, 1)  # [H, n, Dqk]
        visible = np.ones((n, c + n), dtype=bool)
        visible[:, c:] = np.tri(n, dtype=bool)  # built on the host: tiny torch ops cost more than the attention
        mask = torch.from_numpy(visible).to(device)
        scale = inputs.shape.softmax_scale
        tdtype = getattr(torch, dtype)
        out = torch.nn.functional.scaled_dot_product_attention(q.to(tdtype), k.to(tdtype), v.to(tdtype),
                                                               attn_mask=mask, scale=scale)
        logits = torch.where(mask, (q @ k.transpose(1, 2)) * scale, float("-inf"))
        outs.append(out.transpose(0, 1).to(torch.float64).cpu().numpy())
        lses.append(torch.logsumexp(logits, dim=-1).cpu().numpy())  # [H, n]
    return np.concatenate(outs, axis=0), np.concatenate(lses, axis=1)


def check_against_sdpa(case: MlaChunkCase, variant: Any, backend: str, dtypes: tuple[str, ...]) -> None:
    """`variant`'s chunked prefill equals SDPA in every dtype within its tolerance."""
    device = "cuda" if backend == "torch-cuda" else "cpu"
    inputs = inputs_of(case)
    with single_threaded_torch():
        got = chunked_prefill_attention(inputs, workspace_size=case.workspace_size, max_num_seqs=case.max_num_seqs,
                                        block_size=case.block_size, dcp=case.dcp,
                                        align_chunk_to_block=case.align_chunk_to_block, cache_seed=case.seed,
                                        variant=variant)
        for dtype in dtypes:
            want, want_lse = sdpa_full_attention(inputs, dtype, device)
            rtol, atol = SDPA_TOLERANCE[dtype]
            bad = ~(np.abs(got.output - want) <= atol + rtol * np.abs(want))  # NaN counts as bad
            if bad.any():
                t, h, d = np.argwhere(bad)[0]
                raise PropertyViolation(
                    f"{variant} chunked prefill output vs SDPA {dtype} on {device} at token {t} head {h} dim {d}: "
                    f"expected {want[t, h, d]!r} within {atol} + {rtol}|x|, got {got.output[t, h, d]!r} "
                    f"({int(bad.sum())} elements off)")
            lse_bad = ~(np.abs(got.lse - want_lse) <= LSE_TOLERANCE * (1 + np.abs(want_lse)))
            if lse_bad.any():
                h, t = np.argwhere(lse_bad)[0]
                raise PropertyViolation(f"{variant} chunked prefill LSE vs float64 logsumexp at head {h} token {t}: "
                                        f"expected {want_lse[h, t]!r}, got {got.lse[h, t]!r}")


@kernel_property(model=MODEL, strategy="PREFILL_CASES", backends=("torch-cpu", "torch-cuda"))
def mla_prefill_sdpa_oracle(case: MlaChunkCase, variant: Any, backend: str) -> None:
    """For generated batches (context 0-40 rows, with and without DCP, workspaces small enough to force many
    chunks and continuations), the variant's chunked_prefill_attention equals torch
    scaled_dot_product_attention over [context | new tokens] (context visible, new tokens causal): float64
    within 1e-12 + 1e-10|x|, float32 within 2e-5 + 2e-5|x|; the LSE equals float64 logsumexp within 1e-10."""
    check_against_sdpa(case, variant, backend, ("float64", "float32"))


@kernel_property(model=MODEL, strategy="PREFILL_CASES", backends=("torch-cuda",))
def mla_prefill_sdpa_oracle_low_precision(case: MlaChunkCase, variant: Any, backend: str) -> None:
    """On a GPU only: the same batches against SDPA in float16 (within 1e-2 + 1e-2|x|) and bfloat16 (within
    8e-2 + 4e-2|x|), tolerances set at 2.5x or more the largest error torch CPU gave."""
    check_against_sdpa(case, variant, backend, ("float16", "bfloat16"))


def kernel_prefill(backend: str, case: MlaChunkCase, inputs: MlaPrefillInputs,
                   variant: Any) -> tuple[np.ndarray, np.ndarray]:
    """`forward_mha` of `variant` with `backend`'s gather and merge in place of the model's."""
    dcp = case.dcp
    metadata = case.metadata(variant)
    suffix_out, suffix_lse = suffix_attention(inputs)
    if metadata is None:
        return suffix_out, suffix_lse
    caches = build_context_caches(inputs, case.block_size, dcp, case.seed)
    partials = []
    for chunk in metadata.chunks:
        rs = chunk.request_slice
        if dcp is None:
            rows = gather_mla_context(backend, caches[0].kv_cache, caches[0].block_table[rs], chunk.cu_seq_lens,
                                      chunk.token_to_seq, chunk.starts)
        else:
            local = [gather_mla_context(backend, c.kv_cache, c.block_table[rs], chunk.padded_local_cu_seq_lens,
                                        chunk.padded_local_token_to_seq, chunk.local_starts) for c in caches]
            rows = reorg_chunk_rows(chunk, np.concatenate(local, axis=0), variant=variant)
        k, v = up_project(rows, inputs)
        partials.append(run_prefill_context_chunk(inputs.q[chunk.token_slice], k, v, chunk.query_start_loc,
                                                  chunk.cu_seq_lens, inputs.shape.softmax_scale))
    acc_out = np.full(suffix_out.shape, np.nan)  # torch.empty: a token the schedule never writes shows up
    acc_lse = np.full(suffix_lse.shape, np.nan)
    for op in mla_accumulation_schedule(metadata):
        a, b = op.token_start, op.token_end
        if op.kind == "init_empty":
            acc_out[a:b], acc_lse[:, a:b] = 0.0, -np.inf
            continue
        base = metadata.chunks[op.chunk].token_slice.start
        out, lse = partials[op.chunk][0][a - base:b - base], partials[op.chunk][1][:, a - base:b - base]
        if op.kind == "merge":
            merged = merge_attn_states(backend, acc_out[a:b], acc_lse[:, a:b], out, lse)
            out, lse = merged.output, merged.lse
        acc_out[a:b], acc_lse[:, a:b] = out, lse
    final = merge_attn_states(backend, acc_out, acc_lse, suffix_out, suffix_lse)
    assert final.lse is not None
    return final.output.astype(np.float64), final.lse.astype(np.float64)


@kernel_property(model=MODEL, strategy="PREFILL_CASES", backends=BACKEND_NAMES)
def mla_prefill_kernels_vs_sdpa(case: MlaChunkCase, variant: Any, backend: str) -> None:
    """The variant's chunked prefill built from the backend's gather_mla_context and fp32 merge_attn_states
    kernels (per-chunk attention, DCP reorg and accumulation schedule from the model) equals float64 torch
    scaled_dot_product_attention over [context | new tokens] within 2e-5 + 2e-5|x|, and float64 logsumexp within
    1e-5 (1 + |lse|)."""
    rtol, atol = KERNEL_PATH_TOLERANCE["output"]
    inputs = inputs_of(case)
    with single_threaded_torch():
        out, lse = kernel_prefill(backend, case, inputs, variant)
        want, want_lse = sdpa_full_attention(inputs, "float64", "cpu")
    bad = ~(np.abs(out - want) <= atol + rtol * np.abs(want))
    if bad.any():
        t, h, d = np.argwhere(bad)[0]
        raise PropertyViolation(f"prefill from the {backend} kernels vs SDPA float64 at token {t} head {h} dim "
                                f"{d}: expected {want[t, h, d]!r} within {atol} + {rtol}|x|, got {out[t, h, d]!r} "
                                f"({int(bad.sum())} elements off)")
    lse_bad = ~(np.abs(lse - want_lse) <= KERNEL_PATH_TOLERANCE["lse_rtol"] * (1 + np.abs(want_lse)))
    if lse_bad.any():
        h, t = np.argwhere(lse_bad)[0]
        raise PropertyViolation(f"prefill LSE from the {backend} kernels vs float64 logsumexp at head {h} token "
                                f"{t}: expected {want_lse[h, t]!r}, got {lse[h, t]!r}")
