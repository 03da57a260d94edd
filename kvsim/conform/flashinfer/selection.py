"""FlashInfer 0.7.4 backend capabilities and auto order (`_capabilities.py`, `_auto_policy.py`) against `mla-backends`.

* `capabilities`: every backend's `_plan_capabilities` (read from the backend files' literal arguments
  and built with the release's `MLAPlanCapabilities`) against the model's `CAPABILITIES`, field by field;
  then `plan_capability_rejection_reason` against the model's `capability_rejection` on random plan
  contracts for every backend. Convention: upstream returns a message, the model a `Rejection` kind;
  the adapter names upstream's message by its wording (`KIND_WORDS`).
* `auto-order`: `ordered_sm80_backends`, `ordered_sm90_backends`, `ordered_sm100_backends`,
  `_ordered_sm107_backends`, `ordered_sm12x_backends` and the default `_AUTO_BACKEND_CANDIDATES`
  against the model's `auto_order` per compute capability, on random workloads (batch, query and KV
  lengths up to 70k, heads, LSE mode, CUDA graph, causal, fp8, page size, CSR or dense). Convention:
  upstream reads a `_MLAPlanArguments`; the adapter passes a stand-in with the fields those functions
  read and a `csr()` that returns the CSR tensors.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

from kvsim.models.mla_backends.capabilities import CAPABILITIES, capability_rejection
from kvsim.models.mla_backends.metadata import CsrMetadata, PlanMetadata, csr_from_dense, dense_from_csr
from kvsim.models.mla_backends.selection import PlanRequest, auto_order

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .common import MLA, int32, load, table, upstream_capabilities

CAPS = f"{MLA}/_backends/_capabilities.py"
POLICY = f"{MLA}/_auto_policy.py"
ORDER_FUNCTIONS = {(8, 0): "ordered_sm80_backends", (9, 0): "ordered_sm90_backends",
                   (10, 0): "ordered_sm100_backends", (10, 3): "ordered_sm100_backends",
                   (10, 7): "_ordered_sm107_backends", (12, 0): "ordered_sm12x_backends",
                   (12, 1): "ordered_sm12x_backends", (8, 9): "_AUTO_BACKEND_CANDIDATES"}
KIND_WORDS = (("packed query view", "packed_query"), ("packed KV-cache view", "packed_kv_cache"),
              ("combined LSE and skip-softmax", "skip_softmax_with_lse"), ("LSE contract", "lse"),
              ("KV layout contract", "kv_layout"), ("output contract", "output_scale"),
              ("scale contract", "scale_mode"), ("skip-softmax contract", "skip_softmax"),
              ("enable_pdl", "enable_pdl"), ("sink inputs", "sinks"))


def kind_of(message: str | None) -> str | None:
    if message is None:
        return None
    return next((kind for words, kind in KIND_WORDS if words in message), f"unrecognised: {message}")


def run_capabilities(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    result = TargetResult("capabilities", source.version)
    upstream = upstream_capabilities(source)
    for name, model in CAPABILITIES.items():
        got = upstream.get(name)
        result.compared += 1
        want = dataclasses.asdict(model)
        have = dataclasses.asdict(got) if got is not None else None
        if have != want:
            result.diverge({"backend": name}, want, have, "capability matrix")
    reason_fn = load(source, CAPS, ["plan_capability_rejection_reason"]).plan_capability_rejection_reason
    from hypothesis import strategies as st

    from kvsim.properties.mla_backends.strategies import CONTRACTS

    def check(contract: Any) -> None:
        for name, caps in upstream.items():
            result.compared += 1
            got = kind_of(reason_fn(contract, caps))
            model = capability_rejection(contract, CAPABILITIES[name])
            want = model.kind if model is not None else None
            if got != want:
                result.diverge({"backend": name, "contract": dataclasses.asdict(contract)}, want, got,
                               "plan_capability_rejection_reason")

    drive(st.one_of(CONTRACTS), check, options)
    result.note = f"{len(CAPABILITIES)} backends' matrices; rejection reasons on {options.max_examples} contracts x " \
                  f"{len(CAPABILITIES)} backends"
    return result.finish(started)


@dataclasses.dataclass(frozen=True)
class Workload:
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int
    heads: int
    lse_mode: str
    graph: bool
    causal: bool
    fp8: bool
    dense: bool
    extra_width: int = 0


def workloads() -> Any:
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> Workload:
        batch = draw(st.integers(1, 48))
        uniform = draw(st.booleans())
        q_one = draw(st.sampled_from((1, 2, 4, 16, 32, 128)))
        q = tuple(q_one if uniform else draw(st.sampled_from((0, 1, 2, 4, 16, 130))) for _ in range(batch))
        kv_one = draw(st.sampled_from((0, 1, 64, 500, 2048, 4097, 9000, 33000, 70000)))
        kv = tuple(kv_one if uniform else draw(st.sampled_from((0, 1, 300, 1024, 5000, 40000))) for _ in range(batch))
        return Workload(q, kv, draw(st.sampled_from((64, 128, 1024))), draw(st.sampled_from((8, 16, 24, 64, 128))),
                        draw(st.sampled_from(("none", "base2", "basee"))), draw(st.booleans()), draw(st.booleans()),
                        draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 3)))
    return build()


def _csr_of(w: Workload) -> CsrMetadata:
    qo, kv, indices = [0], [0], []
    for q, n in zip(w.q_lens, w.kv_lens):
        pages = -(-n // w.page_size)
        qo.append(qo[-1] + q)
        indices.extend(range(kv[-1], kv[-1] + pages))
        kv.append(kv[-1] + pages)
    return CsrMetadata(tuple(qo), tuple(kv), tuple(indices), w.kv_lens)


def _request(w: Workload) -> PlanRequest:
    from kvsim.models.mla_backends.capabilities import PlanContract

    csr = _csr_of(w)
    if w.dense:
        dense = dense_from_csr(csr)
        dense = dataclasses.replace(dense, width=dense.width + w.extra_width,
                                    block_tables=tuple(r + (0,) * w.extra_width for r in dense.block_tables))
        metadata = PlanMetadata(dense=dense)
    else:
        metadata = PlanMetadata(csr=csr)
    return PlanRequest(metadata, page_size=w.page_size, num_heads=w.heads, causal=w.causal,
                       contract=PlanContract(lse_mode=w.lse_mode), use_cuda_graph=w.graph, fp8=w.fp8)


def upstream_args(request: PlanRequest) -> SimpleNamespace:
    import torch

    c = request.contract
    meta = request.metadata
    csr = meta.csr if meta.csr is not None else csr_from_dense(meta.dense, request.page_size)  # type: ignore[arg-type]
    dtype = torch.float8_e4m3fn if request.fp8 else torch.bfloat16
    block_tables = table(meta.dense.block_tables, meta.dense.width) if meta.dense is not None else None
    return SimpleNamespace(
        csr=lambda: SimpleNamespace(qo_indptr=int32(csr.qo_indptr), kv_indptr=int32(csr.kv_indptr),
                                    kv_indices=int32(csr.kv_indices), kv_len_arr=int32(csr.kv_len_arr)),
        metadata=SimpleNamespace(block_tables=block_tables), num_heads=request.num_heads, lse_mode=c.lse_mode,
        _use_cuda_graph=request.use_cuda_graph, causal=request.causal, q_data_type=dtype, kv_data_type=dtype,
        output_dtype=dtype, head_dim_ckv=request.head_dim_ckv, head_dim_kpe=request.head_dim_kpe,
        page_size=request.page_size, query_layout=c.query_layout, kv_cache_layout=c.kv_cache_layout,
        scale_mode=c.scale_mode, sm_scale=request.sm_scale, output_scale=c.output_scale, use_sinks=c.use_sinks,
        use_profiler=request.use_profiler, skip_softmax=c.skip_softmax, enable_pdl=c.enable_pdl)


def run_auto_order(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    result = TargetResult("auto-order", source.version)
    ns = load(source, POLICY, sorted(set(ORDER_FUNCTIONS.values())))

    def check(w: Workload) -> None:
        request = _request(w)
        args = upstream_args(request)
        for cc, name in ORDER_FUNCTIONS.items():
            fn = getattr(ns, name)
            got = tuple(fn) if isinstance(fn, tuple) else tuple(fn(args))
            want = auto_order(request, cc)
            result.compared += 1
            if got != want:
                result.diverge({"sm": f"{cc[0]}{cc[1]}", **dataclasses.asdict(w)}, list(want), list(got), name)

    drive(workloads(), check, options)
    result.note = f"{options.max_examples} workloads x {len(ORDER_FUNCTIONS)} compute capabilities"
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "capabilities", CAPS, ("MLAPlanCapabilities", "plan_capability_rejection_reason"),
           "mla-backends", "every backend's capability matrix, and the rejection rule on random contracts",
           run_capabilities),
    Target("flashinfer", "auto-order", POLICY, tuple(sorted(set(ORDER_FUNCTIONS.values()))), "mla-backends",
           "the auto candidate order per compute capability on random workloads", run_auto_order),
)
