"""vLLM's Triton MLA decode (`decode_attention_fwd`, vllm/v1/attention/ops/triton_decode_attention.py, the kernel of
`TritonMLAImpl.forward_mqa`) over a paged KV cache, against the `mla-backends` model's paged absorbed MLA.

`MLA_PAGED_DECODE` (a kernel Differential: the kernel runs in the target's kernel child, `run_decode` here, under
the Triton interpreter on the CPU or natively with `--device cuda`). Absorbed MLA (one latent KV head) over a
paged cache in random page order, page sizes 1/16/32/64, KV lengths 0, 1 and non-multiples of the page size
(the `mla-backends` paged strategy), given to the release's kernel through both metadata forms: the dense form
(a block table with junk past each row's live pages) and the CSR form converted by the model's `dense_from_csr`
at the case's table-width alignment, as a backend does; both forms' rows go to the kernel in one launch (its
programs are per row: each form's rows are answered as in a launch of their own, and the interpreter's fixed cost
per launch is paid once). Every parameter of `decode_attention_fwd` is drawn: the query heads (1: the MHA path
`decode_attention_fwd_normal`; 2 or 16: the grouped one), the latent and rope widths (512 / 64, MLA's; 256 / 32,
the other tile the kernel names; 128 / 16, any other), the cache as a 4D paged buffer or a 3D one of tokens
(`_page_stride`), `num_kv_splits` 1-4, `logit_cap` (none, or a soft cap), `k_scale` / `v_scale` (absent, or given)
and `is_mla`. Drawn batches are kept small for the interpreter (its cost is the programs: rows x heads x splits,
and MLA's tile is three times the others'): a decode batch (a row per request) at any tile and head count, or up
to two queries per request at the smaller tiles and 1-2 heads; MLA's batches of many queries are pinned.

Inputs are rounded to the launch dtype: bf16 on a GPU (what vLLM's MLA decode runs in), fp16 under the Triton
interpreter (the 3.9 interpreter reads bf16 tensors as garbage: 8e8 for N(0, 1) data, so it cannot run bf16
here); the reference is the model's `paged_mla_attention` on the same rounded inputs, itself checked against
float64 torch SDPA by `paged_mla_matches_sdpa`. The answer is the output and LSE (the kernel's natural log, in the
launch dtype, converted to base 2) of every row with a key, whether both forms gave the same bytes, and how many
elements past the end of its tensors the launch changed (`past_end`: each tensor is the start of a buffer one row
longer, that row a sentinel; the model's 0): a kernel writing one row past (a head mask one past the head count)
shows, where it wrote into the child's heap before and crashed the child, or not, by chance; `LaunchTolerance`
compares them within research note 2.6's tolerances for the launch dtype the answers name:
FlashInfer's `assert_mla_close` for bf16 (rtol 2e-2, atol 2e-2), `test_deepseek_mla.py`'s varlen fp16 (rtol
1e-3, atol 2e-3).

Adapter conventions: a request of `q_len > 1` is flattened to one decode row per query as `forward_mqa` does
(the block table repeated per row; causal rows get the extents `kv_len - (q_len - 1 - t)`, non-causal rows all
`kv_len`); `num_kv_splits` is drawn (upstream derives it from the longest sequence and the SM count); the scales
are 1.0 (they scale only fp8 caches); rows of extent 0 are compared by the probe, not the differential.
Probe `empty_row_is_nan`: a row of extent 0 (a request with no KV, or the padding rows `forward_mqa` clamps to 0)
comes out of the kernel as NaN output with LSE -inf, where the model (and SDPA's convention) says (0, -inf);
vLLM's caller discards padding rows, so this is a documented convention, checked to still hold.

Survivors (declared in `models/mla_backends/conform.py`): the ROCm lines (`is_hip_`: block 16, the AMD launch
arguments; the platform stand-in is not ROCm), and the fp8 scale loads (`k.dtype.is_fp8()`: no fp8 cache is
drawn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential, Probe
from kvsim.engine.conformance.compare import Close, Difference

from ..kernels import call_kernel, kernel_examples
from ..loader import check_signature
from ..source import EngineSource

DECODE = "vllm/v1/attention/ops/triton_decode_attention.py"
NAME = "mla-paged-decode"
RUNNER = "kvsim.conform.vllm.mla_decode:run_decode"
PARAMS = ("q", "k_buffer", "v_buffer", "o", "lse", "req_to_token", "b_seq_len", "attn_logits", "num_kv_splits",
          "sm_scale", "page_size", "logit_cap", "k_scale", "v_scale", "is_mla")
# (rtol, atol) per launch dtype: FlashInfer assert_mla_close for bf16, test_deepseek_mla.py varlen fp16 (note 2.6)
TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (1e-3, 2e-3)}
WIDTHS = ((512, 64), (256, 32), (128, 16))  # (latent, rope): MLA's, the kernel's other named tile, any other
LN2 = float(np.log(2.0))
FORMS = ("dense", "csr")  # the metadata forms of a batch, launched together
PAST_END = -32768.0  # what the row past each tensor's end holds (`guarded`): exact in every launch dtype, not NaN


@dataclass(frozen=True)
class DecodeCase:
    """A paged batch (`kvsim.properties.mla_backends.cases.PagedCase`) and the launch's other arguments."""

    paged: Any
    num_kv_splits: int = 1
    widths: tuple[int, int] = (512, 64)
    paged_buffer: bool = True  # the cache as [pages, page, 1, D] (else [pages * page, 1, D])
    logit_cap: float = 0.0
    scales: bool = False  # k_scale / v_scale given (1.0 tensors) or left to the default
    is_mla: bool = True


# --- child side ---------------------------------------------------------------------------------------

def run_decode(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from .common import load_in_child

    ns = load_in_child(source, DECODE, ("decode_attention_fwd",), device)
    dtype = getattr(torch, case["dtype"])
    q_host = unpack(case["q"])
    q, q_past = guarded(torch, q_host.shape, dtype, device)  # [rows, H, Lk]
    q.copy_(torch.from_numpy(q_host))
    cache = torch.from_numpy(unpack(case["cache"])).to(device=device, dtype=dtype)  # [pages, page, Lk]
    table = torch.tensor(case["table"], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(case["seq_lens"], dtype=torch.int32, device=device)
    rows, heads, splits, lv = q.shape[0], q.shape[1], int(case["splits"]), int(case["lv"])
    kv = cache.unsqueeze(2)  # the head dim of 1, as forward_mqa adds it
    if not case["paged_buffer"]:
        kv = kv.flatten(0, 1)  # a 3D buffer of tokens: pages packed along the token dim
    (o, o_past), (lse, lse_past) = guarded(torch, (rows, heads, lv), dtype, device), \
        guarded(torch, (rows, heads), dtype, device)
    logits, logits_past = guarded(torch, (rows, heads, splits, lv + 1), torch.float32, device, empty=True)
    scales = {}
    if case["scales"]:
        scales = {"k_scale": torch.tensor(1.0, device=device), "v_scale": torch.tensor(1.0, device=device)}
    ns.decode_attention_fwd(q, kv, kv[..., :lv], o, lse, table, seq_lens, logits, splits, float(case["scale"]),
                            int(case["page_size"]), logit_cap=float(case["logit_cap"]), is_mla=case["is_mla"],
                            **scales)
    if device == "cuda":
        torch.cuda.synchronize()
    past = sum(int((t != PAST_END).sum()) for t in (q_past, o_past, lse_past, logits_past))
    return {"output": pack(o.float().cpu().numpy()), "lse": pack(lse.float().cpu().numpy()), "past_end": past}


def guarded(torch: Any, shape: tuple[int, ...], dtype: Any, device: str, empty: bool = False) -> tuple[Any, Any]:
    """A tensor of `shape` (zeros, or uninitialised where `empty`, as `torch.empty` gives) at the start of a buffer
    one leading row longer, and that row, all `PAST_END`: a kernel that writes past the tensor's last row (a head
    mask one past the head count, at the last row) writes there, where the result counts what it changed
    (`past_end`), and not into the child's heap, where it crashed the child or not by chance."""
    make = torch.empty if empty else torch.zeros
    buffer = make((shape[0] + 1, *shape[1:]), dtype=dtype, device=device)
    buffer[shape[0]:] = PAST_END
    return buffer[:shape[0]], buffer[shape[0]:]


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


def tensors(case: DecodeCase, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """`(q_nope, q_pe, ckv, kpe, scale)` of the batch at the case's widths, rounded to the launch dtype."""
    from kvsim.models.mla_backends.metadata import pages_for

    paged, (lv, lr) = case.paged, case.widths
    if case.widths == (512, 64):
        q_nope, q_pe, ckv, kpe, scale = paged.tensors()
    else:
        rng = np.random.default_rng(paged.seed)
        pages = sum(pages_for(n, paged.page_size) for n in paged.kv_lens) + 1
        total_q = sum(paged.q_lens)
        q_nope = rng.standard_normal((total_q, paged.heads, lv)).astype(np.float32)
        q_pe = rng.standard_normal((total_q, paged.heads, lr)).astype(np.float32)
        ckv = rng.standard_normal((pages, paged.page_size, lv)).astype(np.float32)
        kpe = rng.standard_normal((pages, paged.page_size, lr)).astype(np.float32)
        scale = (lv // 4 + lr) ** -0.5
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


def launch(ctx: Context, case: DecodeCase, forms: tuple[str, ...] = FORMS,
           past: list[int] | None = None) -> list[tuple[np.ndarray, np.ndarray, list[int]]]:
    """The kernel's `(output [rows, H, Lv], lse2 [rows, H], extents)` of the batch given in each of `forms`, all in
    one launch: the forms' rows one after another (each form's table rows padded with page 0 to the widest), the
    query repeated per form. The kernel's programs are per row, so a form's rows are its own launch's; the one
    launch spares the interpreter's fixed cost per launch (about that of a row's programs). `past`, where given,
    gets the count of elements the launch wrote or left past the end of its tensors (`guarded`)."""
    from kvsim.gpu_oracle.runtime.asan import pack, unpack
    from kvsim.models.mla_backends.metadata import dense_from_csr

    paged, dtype = case.paged, launch_dtype(ctx.options.device)
    q_nope, q_pe, ckv, kpe, scale = tensors(case, dtype)
    metadata = paged.metadata()
    tables = {"dense": metadata.dense, "csr": lambda: dense_from_csr(metadata.csr(), paged.alignment)}
    per_form = [decode_rows(paged, tables[form]().block_tables) for form in forms]
    width = max(len(row) for rows, _ in per_form for row in rows)
    table = [row + [0] * (width - len(row)) for rows, _ in per_form for row in rows]
    q = np.concatenate([q_nope, q_pe], axis=-1)
    result = call_kernel(ctx, RUNNER, {
        "q": pack(np.concatenate([q] * len(forms))), "cache": pack(np.concatenate([ckv, kpe], axis=-1)),
        "table": table, "seq_lens": [n for _, extents in per_form for n in extents], "splits": case.num_kv_splits,
        "scale": scale, "lv": case.widths[0], "page_size": paged.page_size, "dtype": dtype,
        "paged_buffer": case.paged_buffer, "logit_cap": case.logit_cap, "scales": case.scales, "is_mla": case.is_mla})
    out, lse, rows = unpack(result["output"]), unpack(result["lse"]) / LN2, len(q)
    if past is not None:
        past.append(result["past_end"])
    return [(out[k * rows:(k + 1) * rows], lse[k * rows:(k + 1) * rows], extents)
            for k, (_, extents) in enumerate(per_form)]


def live_rows(case: DecodeCase) -> np.ndarray:
    from kvsim.models.mla_backends.metadata import dense_from_csr

    metadata = case.paged.metadata()
    _, extents = decode_rows(case.paged, dense_from_csr(metadata.csr(), case.paged.alignment).block_tables)
    return np.array(extents, dtype=np.int64) > 0


def answer(dtype: str, out: np.ndarray, lse: np.ndarray, live: np.ndarray, forms_agree: bool,
           past_end: int = 0) -> dict[str, Any]:
    """What the model and the kernel are compared on; `past_end`: elements past the end of the kernel's tensors
    that it wrote (the model: none)."""
    return {"dtype": dtype, "forms_agree": forms_agree, "past_end": past_end, "output": out[live].astype(np.float32),
            "lse": lse[live].astype(np.float32)}


def decode_model(ctx: Context, case: DecodeCase) -> dict[str, Any]:
    """The model's paged absorbed MLA on the inputs rounded to the launch dtype (CSR form)."""
    from kvsim.models.mla_backends.paged import paged_mla_attention

    paged, dtype = case.paged, launch_dtype(ctx.options.device)
    q_nope, q_pe, ckv, kpe, scale = tensors(case, dtype)
    out, lse = paged_mla_attention(q_nope, q_pe, ckv, kpe, paged.metadata().csr(), scale, causal=paged.causal,
                                   chunk_pages=paged.chunk_pages, logit_cap=case.logit_cap)
    return answer(dtype, out, lse, live_rows(case), True)


def decode_upstream(ctx: Context, case: DecodeCase) -> dict[str, Any]:
    past: list[int] = []
    by_dense, (out, lse, extents) = launch(ctx, case, past=past)
    agree = all(np.array_equal(x, y, equal_nan=True) for x, y in zip(by_dense[:2], (out, lse)))
    return answer(launch_dtype(ctx.options.device), out, lse, np.array(extents, dtype=np.int64) > 0, agree, past[0])


@dataclass(frozen=True)
class LaunchTolerance(Close):
    """`Close` within the tolerance of the launch dtype both answers name (`TOLERANCE`); the rest exact."""

    def difference(self, model: Any, upstream: Any) -> Difference | None:
        if isinstance(model, dict) and isinstance(upstream, dict) and model.get("dtype") == upstream.get("dtype") \
                and model.get("dtype") in TOLERANCE:
            rtol, atol = TOLERANCE[model["dtype"]]
            return Close(rtol=rtol, atol=atol).difference(model, upstream)
        return super().difference(model, upstream)


def empty_row_probe(ctx: Context) -> str | None:
    """A row of extent 0 is NaN output with LSE -inf (the documented convention)."""
    from kvsim.properties.mla_backends.cases import PAGED_DECODE

    [(out, lse, extents)] = launch(ctx, DecodeCase(PAGED_DECODE, 2), ("csr",))
    empty = [r for r, n in enumerate(extents) if n == 0]
    if not empty:
        return "the pinned decode batch has no empty row any more"
    for r in empty:
        if not (np.isnan(out[r]).all() and np.isneginf(lse[r]).all()):
            return (f"row {r} (extent 0): expected NaN output and LSE -inf, got output {out[r, 0, :3].tolist()}... "
                    f"lse {lse[r].tolist()}")
    return None


def decode_cases(ctx: Context) -> Any:
    from dataclasses import replace

    from kvsim.properties.mla_backends.strategies import PAGED_CASES

    def build(paged: Any, shape: tuple[int, int, tuple[int, int]], splits: int, paged_buffer: bool, cap: float,
              scales: bool, is_mla: bool) -> DecodeCase:
        queries, heads, widths = shape
        paged = replace(paged, q_lens=tuple(min(q, queries) for q in paged.q_lens), heads=heads)
        return DecodeCase(paged, splits, widths, paged_buffer, cap, scales, is_mla)

    # The interpreter's cost grows with the programs (rows x head blocks x splits in stage 1, rows x heads in stage
    # 2) and with MLA's tile (512 + 64: three times the smaller ones'), hardly with the KV length. Every shape is
    # bounded whichever Hypothesis favours: a decode batch (a row per request) at any tile and head count (1: the
    # ungrouped kernel; 2; 16: a full head block), or at the smaller tiles and 1-2 heads up to two queries per
    # request (causal rows of one request see different extents). MLA's own batches of many queries are pinned.
    small = WIDTHS[:0:-1]
    shapes = ([(1, h, w) for w in small for h in (2, 1)] + [(2, h, w) for w in small for h in (2, 1)]
              + [(1, 16, w) for w in small] + [(1, h, WIDTHS[0]) for h in (2, 1, 16)])
    return st.builds(build, PAGED_CASES, st.sampled_from(shapes), st.integers(1, 4), st.booleans(),
                     st.sampled_from((0.0, 0.0, 30.0, 2.0)), st.booleans(), st.sampled_from((True,) * 4 + (False,)))


def pinned(ctx: Context) -> list[DecodeCase]:
    from dataclasses import replace

    from kvsim.properties.mla_backends.cases import PAGED_DECODE, PAGED_PREFILL

    # The first two take every launch option the MLA batches after them leave at its default, one in each kernel
    # (1 head: the ungrouped one): a soft cap, the cache as a buffer of tokens, the scales given, 4 splits and
    # is_mla False (without them a mutant of those lines lived until a drawn input took them, about the tenth). The
    # cap is 1, which a test `logit_cap > 1` in place of `> 0` would leave uncapped (the drawn caps are 2 and 30).
    # 20 heads: more than the grouped kernel's head block (BLOCK_H 16) and not a multiple of it, so the last head
    # block's mask against the head count is the one that stops it (a model with 20 heads per rank). The small
    # tiles come first: a mutation run stops at the first divergence, and they cost a fraction of MLA's 512 + 64.
    # A rope width of 24 (not a power of two: its tile of 32 has lanes past Lk) is the one input whose rope mask
    # `offs_dpe < Lk` masks a lane (the drawn widths are powers of two, each tile exactly full).
    return [DecodeCase(replace(PAGED_DECODE, heads=1), 4, WIDTHS[2], False, 1.0, True),
            DecodeCase(PAGED_PREFILL, 4, WIDTHS[2], False, 1.0, True, False),
            DecodeCase(PAGED_DECODE, 2, (128, 24)),
            DecodeCase(replace(PAGED_DECODE, heads=20), 1, WIDTHS[2]),
            DecodeCase(PAGED_DECODE, 2), DecodeCase(PAGED_PREFILL, 3)]


def describe(ctx: Context, case: DecodeCase) -> dict[str, Any]:
    p = case.paged
    return {"q_lens": list(p.q_lens), "kv_lens": list(p.kv_lens), "page_size": p.page_size, "seed": p.seed,
            "chunk_pages": p.chunk_pages, "causal": p.causal, "alignment": p.alignment, "heads": p.heads,
            "num_kv_splits": case.num_kv_splits, "widths": list(case.widths), "paged_buffer": case.paged_buffer,
            "logit_cap": case.logit_cap, "scales": case.scales, "is_mla": case.is_mla}


MLA_PAGED_DECODE = Differential(
    kernel=True, examples=kernel_examples,
    prepare=lambda ctx: check_signature(ctx.up.decode_attention_fwd, PARAMS, f"{DECODE}:decode_attention_fwd"),
    inputs=decode_cases, pinned=pinned, model=decode_model, upstream=decode_upstream, describe=describe,
    compare=LaunchTolerance(),
    probes=(Probe("empty_row_is_nan", "a row of extent 0 is NaN output with LSE -inf in the release's kernel",
                  empty_row_probe),))
