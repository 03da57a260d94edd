"""End-to-end oracle for MLA chunked prefill: torch `scaled_dot_product_attention` vs `models.mla_prefill`.

The model (`chunked_prefill_attention`, float64) gathers the context in workspace-sized
chunks, attends each chunk, merges the partials and then the suffix. The oracle knows
none of that: per request it runs SDPA once over `[context | new tokens]` with the mask
vLLM's `test_mla_backends.py` builds (all context visible, new tokens causal), on the
same up-projected keys and values (research note trtllm_flashinfer.md 2.5, "Oracle"). The
LSE is checked against `torch.logsumexp` of the same masked logits in float64.

* `mla_prefill.sdpa_oracle` (torch-cpu, torch-cuda): SDPA in float64 and float32.
* `mla_prefill.sdpa_oracle_low_precision` (torch-cuda only): SDPA in float16 and bfloat16;
  without a GPU the framework skips it with torch-cuda's reason.
* `mla_prefill.kernels_vs_sdpa` (every backend): the fixed variant's prefill assembled from
  the backend's gather and fp32 merge kernels (the model supplies the per-chunk attention,
  the DCP reorg and the accumulation schedule) against float64 SDPA.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.errors import PropertyViolation
from kvsim.models.mla_chunks.attention import run_prefill_context_chunk
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.metadata import build_context_metadata, mla_accumulation_schedule
from kvsim.models.mla_chunks.prefill import (MlaPrefillInputs, MlaShape, build_context_caches, chunked_prefill_attention,
                                make_mla_prefill_inputs, reorg_chunk_rows, suffix_attention, up_project)

from ...runtime.checks import CheckOutcome, hypothesis_check, oracle_check
from ...runtime.discovery import BACKEND_NAMES
from .backends import gather_mla_context, merge_attn_states

# (rtol, atol) of |model - SDPA| <= atol + rtol |SDPA|, outputs O(1) (unit-variance values, logits O(1)).
# float64: both sides exact up to summation order (seen: 3.6e-15). float32: seen 1.2e-6 at most. float16 /
# bfloat16 (inputs rounded to 11 / 8 significant bits, accumulation in fp32): seen at most 4.1e-3 / 3.1e-2
# absolute on torch CPU over 2,000 generated cases; stated at 2.5x or more, in line with vLLM's bf16 rtol
# 1e-2 (trtllm_flashinfer.md 2.6). The low-precision figures are not yet measured on a GPU.
SDPA_TOLERANCE = {"float64": (1e-10, 1e-12), "float32": (2e-5, 2e-5), "float16": (1e-2, 1e-2),
                  "bfloat16": (4e-2, 8e-2)}
LSE_TOLERANCE = 1e-10  # float64 logsumexp vs the model's float64 LSE, relative to 1 + |lse|


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """One intra-op thread while a check runs: on these tiny tensors waking the thread pool costs more than the
    attention (seen 5-40x slower on a 2-core machine under load). Restores the setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class PrefillCase:
    """One batch and engine configuration of `chunked_prefill_attention`."""

    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    block_size: int
    workspace_size: int
    max_num_seqs: int
    dcp: tuple[int, int] | None
    align_chunk_to_block: bool
    shape: MlaShape
    seed: int


@st.composite
def prefill_cases(draw: st.DrawFn) -> PrefillCase:
    ctx = draw(st.lists(st.integers(-8, 40).map(lambda c: max(c, 0)), min_size=1, max_size=4))
    dcp = draw(st.none() | st.sampled_from(((2, 1), (2, 2), (4, 1))))
    virtual = 1 if dcp is None else dcp[0] * dcp[1]
    shape = MlaShape(num_heads=draw(st.integers(1, 3)), kv_lora_rank=draw(st.integers(1, 12)),
                     qk_rope_head_dim=draw(st.integers(1, 4)), qk_nope_head_dim=draw(st.integers(1, 6)),
                     v_head_dim=draw(st.integers(1, 6)))
    return PrefillCase(tuple(ctx), tuple(draw(st.lists(st.integers(1, 4), min_size=len(ctx), max_size=len(ctx)))),
                       virtual * draw(st.sampled_from((1, 2, 4, 8))), draw(st.integers(1, 48)),
                       len(ctx) + draw(st.integers(0, 2)), dcp, dcp is not None or draw(st.booleans()), shape,
                       draw(st.integers(0, 2**16)))


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


def sdpa_test(backend: str, dtypes: tuple[str, ...], variant: str = "fixed"):  # type: ignore[no-untyped-def]
    """The per-case test: `variant`'s chunked prefill equals SDPA in every dtype within its tolerance."""
    device = "cuda" if backend == "torch-cuda" else "cpu"

    def test(case: PrefillCase) -> None:
        inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, seed=case.seed)
        got = chunked_prefill_attention(variant, inputs, workspace_size=case.workspace_size,
                                        max_num_seqs=case.max_num_seqs, block_size=case.block_size,
                                        dcp=None if case.dcp is None else DcpConfig(*case.dcp),
                                        align_chunk_to_block=case.align_chunk_to_block, cache_seed=case.seed)
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

    return test


@oracle_check("mla_prefill.sdpa_oracle", backends=("torch-cpu", "torch-cuda"))
def sdpa_oracle(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """For generated batches (context 0-40 rows, with and without DCP, workspaces small enough to force many
    chunks and continuations), models.mla_prefill.chunked_prefill_attention on the fixed variant equals torch
    scaled_dot_product_attention over [context | new tokens] (context visible, new tokens causal): float64
    within 1e-12 + 1e-10|x|, float32 within 2e-5 + 2e-5|x|; the LSE equals float64 logsumexp within 1e-10."""
    with single_threaded_torch():
        return hypothesis_check(prefill_cases(), sdpa_test(backend, ("float64", "float32")), max_examples, seed)


@oracle_check("mla_prefill.sdpa_oracle_low_precision", backends=("torch-cuda",))
def sdpa_oracle_low_precision(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """On a GPU only: the same batches against SDPA in float16 (within 1e-2 + 1e-2|x|) and bfloat16 (within
    8e-2 + 4e-2|x|), tolerances set at 2.5x or more the largest error torch CPU gave."""
    with single_threaded_torch():
        return hypothesis_check(prefill_cases(), sdpa_test(backend, ("float16", "bfloat16")), max_examples, seed)


# fp32 merges on top of float64 attention: each merge owes ~2e-6 relative (MERGE_TOLERANCE), a few chain up.
KERNEL_PATH_TOLERANCE = {"output": (2e-5, 2e-5), "lse_rtol": 1e-5}


def kernel_prefill(backend: str, case: PrefillCase, inputs: MlaPrefillInputs) -> tuple[np.ndarray, np.ndarray]:
    """`forward_mha` of the fixed variant with `backend`'s gather and merge in place of the model's."""
    dcp = None if case.dcp is None else DcpConfig(*case.dcp)
    metadata = build_context_metadata("fixed", case.context_lens, case.query_lens, case.workspace_size,
                                      case.max_num_seqs, case.block_size, dcp=dcp,
                                      align_chunk_to_block=case.align_chunk_to_block)
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
            rows = reorg_chunk_rows("fixed", chunk, np.concatenate(local, axis=0))
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


@oracle_check("mla_prefill.kernels_vs_sdpa", backends=BACKEND_NAMES)
def kernels_vs_sdpa(backend: str, max_examples: int, seed: int | None) -> CheckOutcome:
    """The fixed variant's chunked prefill built from the backend's gather_mla_context and fp32
    merge_attn_states kernels (per-chunk attention, DCP reorg and accumulation schedule from the model) equals
    float64 torch scaled_dot_product_attention over [context | new tokens] within 2e-5 + 2e-5|x|, and float64
    logsumexp within 1e-5 (1 + |lse|)."""
    rtol, atol = KERNEL_PATH_TOLERANCE["output"]

    def test(case: PrefillCase) -> None:
        inputs = make_mla_prefill_inputs(case.context_lens, case.query_lens, case.shape, seed=case.seed)
        out, lse = kernel_prefill(backend, case, inputs)
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

    with single_threaded_torch():
        return hypothesis_check(prefill_cases(), test, max_examples, seed)
