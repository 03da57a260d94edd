"""vLLM's Triton MLA decode (`decode_attention_fwd`, vllm/v1/attention/ops/triton_decode_attention.py, the kernel of
`TritonMLAImpl.forward_mqa`) over a paged KV cache, against the `mla-backends` model's paged absorbed MLA.

Target `mla-paged-decode`: absorbed MLA (576 / 512, one latent KV head) over a paged cache in random page order,
page sizes 1/16/32/64, KV lengths 0, 1 and non-multiples of the page size (the `mla-backends` paged strategy), given
to the release's kernel through both metadata forms: the dense form (a block table with junk past each row's live
pages) and the CSR form converted by the model's `dense_from_csr` at the case's table-width alignment, as a backend
does. Inputs are rounded to the launch dtype: bf16 on a GPU (what vLLM's MLA decode runs in), fp16 under the
Triton interpreter (the 3.9 interpreter reads bf16 tensors as garbage: 8e8 for N(0, 1) data, so it cannot run bf16
here); the reference is the model's `paged_mla_attention` on the same rounded inputs, itself checked against
float64 torch SDPA by `paged_mla_matches_sdpa`. Tolerances of research note 2.6: FlashInfer's `assert_mla_close`
for bf16 (rtol 2e-2, atol 2e-2), `test_deepseek_mla.py`'s varlen fp16 (rtol 1e-3, atol 2e-3), on the output and on
the LSE (the kernel's natural log, in the launch dtype, converted to base 2). The two forms must give the same
bytes. Adapter conventions: a request of `q_len > 1` is flattened to one decode row per query as
`forward_mqa` does (the block table repeated per row; causal rows get the extents `kv_len - (q_len - 1 - t)`,
non-causal rows all `kv_len`); `num_kv_splits` is drawn from 1-4 (upstream derives it from the longest sequence and
the SM count); rows of extent 0 are compared by the probe, not the differential.
Probe `empty_row_is_nan`: a row of extent 0 (a request with no KV, or the padding rows `forward_mqa` clamps to 0)
comes out of the kernel as NaN output with LSE -inf, where the model (and SDPA's convention) says (0, -inf);
vLLM's caller discards padding rows, so this is a documented convention, checked to still hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..kernels import Divergence, KernelCheck, Probe, as_target, unpacked
from ..loader import names_in
from ..source import EngineSource

DECODE = "vllm/v1/attention/ops/triton_decode_attention.py"
NAME = "mla-paged-decode"
# (rtol, atol) per launch dtype: FlashInfer assert_mla_close for bf16, test_deepseek_mla.py varlen fp16 (note 2.6)
TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (1e-3, 2e-3)}
LN2 = float(np.log(2.0))


@dataclass(frozen=True)
class DecodeCase:
    """A paged batch (`kvsim.properties.mla_backends.cases.PagedCase`) and the split count of the launch."""

    paged: Any
    num_kv_splits: int = 1


# --- child side ---------------------------------------------------------------------------------------

_LOADED: dict[str, Any] = {}


def run_decode(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from ..triton_child import load_upstream
    from .common import vllm_modules

    key = str(source.root)
    if key not in _LOADED:
        _LOADED[key] = load_upstream(source, DECODE, ("decode_attention_fwd",), modules=vllm_modules(device))
    ns = _LOADED[key]
    dtype = getattr(torch, case["dtype"])
    q = torch.from_numpy(unpack(case["q"])).to(device=device, dtype=dtype)  # [rows, H, 576]
    cache = torch.from_numpy(unpack(case["cache"])).to(device=device, dtype=dtype)  # [pages, page, 576]
    table = torch.tensor(case["table"], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(case["seq_lens"], dtype=torch.int32, device=device)
    rows, heads, splits = q.shape[0], q.shape[1], int(case["splits"])
    kv = cache.unsqueeze(2)  # the head dim of 1, as forward_mqa adds it
    o = torch.zeros(rows, heads, 512, dtype=dtype, device=device)
    lse = torch.zeros(rows, heads, dtype=dtype, device=device)
    logits = torch.empty(rows, heads, splits, 513, dtype=torch.float32, device=device)
    ns.decode_attention_fwd(q, kv, kv[..., :512], o, lse, table, seq_lens, logits, splits, float(case["scale"]),
                            int(case["page_size"]), is_mla=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"output": pack(o.float().cpu().numpy()), "lse": pack(lse.float().cpu().numpy())}


CHILD_KERNELS = {"vllm.mla_paged_decode": run_decode}


# --- parent side --------------------------------------------------------------------------------------


def launch_dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float16"


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16(x) if dtype == "bfloat16" else x.astype(np.float16).astype(np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    """`x` rounded to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def rounded_tensors(paged: Any, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    q_nope, q_pe, ckv, kpe, scale = paged.tensors()
    return rounded(q_nope, dtype), rounded(q_pe, dtype), rounded(ckv, dtype), rounded(kpe, dtype), scale


def decode_rows(paged: Any, table: tuple[tuple[int, ...], ...]) -> tuple[list[list[int]], list[int]]:
    """One decode row per query, as `forward_mqa` flattens a block: the request's table row and its extent."""
    width = max([len(r) for r in table] + [1])
    rows, extents = [], []
    for b, (q_len, kv_len) in enumerate(zip(paged.q_lens, paged.kv_lens)):
        for t in range(q_len):
            rows.append(list(table[b]) + [0] * (width - len(table[b])))
            extents.append(max(0, kv_len - (q_len - 1 - t)) if paged.causal else kv_len)
    return rows, extents


def launch(child: Any, case: DecodeCase, form: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The kernel's `(output [rows, H, 512], lse2 [rows, H], extents)` with the batch given in `form`."""
    from kvsim.gpu_oracle.runtime.asan import pack
    from kvsim.models.mla_backends.metadata import dense_from_csr

    paged, dtype = case.paged, launch_dtype(child.device)
    q_nope, q_pe, ckv, kpe, scale = rounded_tensors(paged, dtype)
    metadata = paged.metadata()
    dense = metadata.dense() if form == "dense" else dense_from_csr(metadata.csr(), paged.alignment)
    rows, extents = decode_rows(paged, dense.block_tables)
    result = child.call("vllm.mla_paged_decode", {
        "q": pack(np.concatenate([q_nope, q_pe], axis=-1)), "cache": pack(np.concatenate([ckv, kpe], axis=-1)),
        "table": rows, "seq_lens": extents, "splits": case.num_kv_splits, "scale": scale,
        "page_size": paged.page_size, "dtype": dtype})
    return unpacked(result, "output"), unpacked(result, "lse") / LN2, extents


def reference(case: DecodeCase, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The model's paged absorbed MLA on the inputs rounded to the launch dtype (CSR form)."""
    from kvsim.models.mla_backends.paged import paged_mla_attention

    paged = case.paged
    q_nope, q_pe, ckv, kpe, scale = rounded_tensors(paged, dtype)
    return paged_mla_attention(q_nope, q_pe, ckv, kpe, paged.metadata().csr(), scale, causal=paged.causal,
                               chunk_pages=paged.chunk_pages)


def decode_compare(child: Any, case: DecodeCase) -> Divergence | None:
    by_dense = launch(child, case, "dense")
    by_csr = launch(child, case, "csr")
    if not all(np.array_equal(x, y, equal_nan=True) for x, y in zip(by_dense[:2], by_csr[:2])):
        return Divergence(case, "the same bytes from either metadata form", "the forms differ",
                          f"dense_from_csr(csr, {case.paged.alignment}) and the dense table gave different results")
    out, lse, extents = by_csr
    dtype = launch_dtype(child.device)
    rtol, atol = TOLERANCE[dtype]
    want_out, want_lse = reference(case, dtype)
    live = np.array(extents) > 0
    with np.errstate(invalid="ignore"):
        out_ok = np.abs(out - want_out) <= atol + rtol * np.abs(want_out)
        lse_ok = np.abs(lse - want_lse) <= atol + rtol * np.abs(want_lse)
    bad = live & ~(out_ok.all(axis=(1, 2)) & lse_ok.all(axis=1))
    if not bad.any():
        return None
    r = int(np.argmax(bad))
    return Divergence(case, f"paged_mla_attention row {r}: output {np.round(want_out[r, 0, :3], 4).tolist()}... "
                      f"lse2 {np.round(want_lse[r], 4).tolist()}",
                      f"output {np.round(out[r, 0, :3], 4).tolist()}... lse2 {np.round(lse[r], 4).tolist()}",
                      f"{int(bad.sum())} of {int(live.sum())} live rows beyond rtol {rtol} / atol {atol} ({dtype})")


def empty_row_probe(child: Any) -> str | None:
    """A row of extent 0 is NaN output with LSE -inf (the documented convention)."""
    from kvsim.properties.mla_backends.cases import PAGED_DECODE

    out, lse, extents = launch(child, DecodeCase(PAGED_DECODE, 2), "csr")
    empty = [r for r, n in enumerate(extents) if n == 0]
    if not empty:
        return "the pinned decode batch has no empty row any more"
    for r in empty:
        if not (np.isnan(out[r]).all() and np.isneginf(lse[r]).all()):
            return (f"row {r} (extent 0): expected NaN output and LSE -inf, got output {out[r, 0, :3].tolist()}... "
                    f"lse {lse[r].tolist()}")
    return None


def _strategy() -> Any:
    from hypothesis import strategies as st

    from kvsim.properties.mla_backends.strategies import PAGED_CASES

    return st.builds(DecodeCase, PAGED_CASES, st.integers(1, 4))


def _pinned() -> list[DecodeCase]:
    from kvsim.properties.mla_backends.cases import PAGED_DECODE, PAGED_PREFILL

    return [DecodeCase(PAGED_DECODE, 2), DecodeCase(PAGED_PREFILL, 3)]


def decode_shape(source: EngineSource) -> str | None:
    if not source.has(DECODE) or "decode_attention_fwd" not in names_in(source.file(DECODE)):
        return f"{DECODE}: {source.label} has no decode_attention_fwd"
    return None


DECODE_CHECK = KernelCheck(
    engine="vllm", name=NAME, relpath=DECODE, symbols=("decode_attention_fwd", "_fwd_grouped_kernel_stage1",
                                                       "_fwd_kernel_stage2"),
    model="mla-backends", doc=__doc__.split("\n\n")[1].strip(), kernel="vllm.mla_paged_decode",
    strategy=_strategy, compare=decode_compare, pinned=_pinned, shape=decode_shape,
    probes=(Probe("empty_row_is_nan", "a row of extent 0 is NaN output with LSE -inf in the release's kernel",
                  empty_row_probe),))

TARGETS = (as_target(DECODE_CHECK),)
