"""Backend selection of the batch MLA wrapper (FlashInfer 0.7.4, `_auto_policy.py`, `_wrapper.py`).

* `auto_order(request, cc)`: the candidate order of `_BatchMLAPagedAttentionAutoBackend` per compute
  capability: SM80 `ordered_sm80_backends`, SM90 `ordered_sm90_backends`, SM100/103
  `ordered_sm100_backends` (a workload-dependent ranking, `order_sm100`), SM107
  `_ordered_sm107_backends`, SM120/121 `ordered_sm12x_backends`, anything else (SM89 included) the
  default order. Each is a complete list of the nine backends.
* `select_backend(request, backend, cc, outcomes, variant)`: explicit backend (never falls back), the
  `"cute-dsl"` family alias, or auto: metadata first (malformed metadata is never a candidate's
  refusal), then each candidate in order; only the typed `BackendUnsupported` moves on to the next
  (`variant.fallback_only_on_unsupported`); all rejected raises `BackendUnsupported` listing every
  `candidate: reason`. A single candidate (a CUDA-graph re-plan pinned to its previous backend)
  re-raises its own rejection.

A backend's plan is its capability check (`capabilities.capability_rejection`) followed by what the
matrix cannot say (architecture, JIT, allocation): `outcomes[backend]`, one of `OUTCOMES`, supplied by
the caller (a property's case, a fault the transition system injects).

`SelectionTrace` is the model's diagnostic (FlashInfer 0.7.4 exposes only the rejection text; the
PR head's `MLAAutoSelectionTrace` is not in the release): the candidates, every rejection, the
backends probed, the resolved backend or the error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .capabilities import CAPABILITIES, CUTE_DSL_FAMILY, PlanContract, capability_rejection
from .metadata import MetadataError, PlanMetadata, resolve_csr
from .variants import FIXED, MlaBackendsVariant

FA2, FA3, TRT, MONO, MODULAR, MTP = "fa2", "fa3", "trtllm-gen", "cute-dsl-monolithic", "cute-dsl-modular", \
    "cute-dsl-rubin-mtp"
# `_AUTO_BACKEND_CANDIDATES`: FA, TRT/CuTe, the narrow adapters, then the experimental cutile
DEFAULT_ORDER = (FA2, FA3, TRT, MONO, MODULAR, MTP, "cutlass", "xqa", "cutile")
COMPUTE_CAPABILITIES = ((8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (10, 7), (12, 0), (12, 1))
OUTCOMES = ("ok", "unsupported", "error:jit", "error:allocation", "error:runtime", "error:invalid_input")
REQUESTS = ("auto", "cute-dsl") + tuple(CAPABILITIES)


class BackendUnsupported(ValueError):
    """`_BackendPlanUnsupportedError`: the typed signal, the only one auto selection falls back on."""


class BackendFailure(RuntimeError):
    """Any other plan-time failure (JIT, allocation, runtime, invalid input): it propagates."""

    def __init__(self, backend: str, kind: str) -> None:
        self.backend, self.kind = backend, kind
        super().__init__(f"{backend}: plan failed ({kind})")


@dataclass(frozen=True)
class PlanRequest:
    """What `plan()` declares: metadata, the run contract and the workload facts the ranking reads."""

    metadata: PlanMetadata
    page_size: int = 1
    num_heads: int = 16
    causal: bool = False
    contract: PlanContract = PlanContract()
    use_cuda_graph: bool = False
    fp8: bool = False  # q, KV and output all float8_e4m3fn
    head_dim_ckv: int = 512
    head_dim_kpe: int = 64
    sm_scale: float = 192 ** -0.5
    use_profiler: bool = False


@dataclass
class SelectionTrace:
    request: str
    candidates: tuple[str, ...] = ()
    rejections: list[tuple[str, str]] = field(default_factory=list)  # (candidate, reason)
    probed: list[str] = field(default_factory=list)  # backends whose plan ran (capability check included)
    resolved: str | None = None
    error: str | None = None  # "unsupported", "metadata:<rule>" or "failure:<kind>"
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.resolved is not None


def prefer(*first: str) -> tuple[str, ...]:
    return first + tuple(b for b in DEFAULT_ORDER if b not in first)


def _lengths(request: PlanRequest) -> tuple[list[int], list[int]]:
    csr = resolve_csr(request.metadata, request.page_size)
    q = [b - a for a, b in zip(csr.qo_indptr, csr.qo_indptr[1:])]
    return q, list(csr.kv_len_arr)


def order_sm100(request: PlanRequest) -> tuple[str, ...]:
    """`ordered_sm100_backends`: coarse work regimes decide which of FA2, TRT and CuTe lead."""
    q, kv = _lengths(request)
    if not q or len(q) != len(kv) or not sum(q) or not sum(kv):
        return prefer(MONO, TRT)
    heads, graph = request.num_heads, request.use_cuda_graph
    work = heads * sum(a * b for a, b in zip(q, kv))
    out_work, total_q, total_kv, batch = heads * sum(q), sum(q), sum(kv), len(q)
    max_q, min_kv, max_kv = max(q), min(kv), max(kv)
    small = work <= 2 ** 21 and out_work <= 32768
    if not graph and _eager_keeps_fa2(heads, work, out_work, max_q, max_kv, batch, total_kv, small):
        return prefer(FA2, TRT)
    near_prefill = (4 if heads <= 8 else 2) * total_q + 32 * batch >= total_kv
    if request.contract.lse_mode == "base2" and work <= 2 ** 23 and out_work <= 32768 and max_q > 1 \
            and max_kv <= 1024 and near_prefill:
        return prefer(FA2, TRT)
    if graph:
        return _graph_order(heads, work, out_work, total_q, max_q, min_kv, max_kv)
    if heads >= 128:
        order = prefer(TRT, MONO)
    elif small:
        order = prefer(TRT, MONO) if max_q == 1 else prefer(TRT, FA2)
    else:
        order = prefer(MONO, TRT)
    fa2_for_q4 = heads <= 16 and max_q == 4 and min(q) == 4 and not request.causal
    if max_q > 1 and not fa2_for_q4 and (work >= 5 * 2 ** 20 or total_kv >= 5 * 2 ** 14):
        return _move_before(order, MODULAR, FA2)
    return order


def _eager_keeps_fa2(heads: int, work: int, out_work: int, max_q: int, max_kv: int, batch: int, total_kv: int,
                     small: bool) -> bool:
    """The three eager regimes where conversion and launch costs keep FA2 first."""
    if small and max_kv <= 4096:
        return True
    if heads >= 128 and (max_q > 1 or out_work <= 2048 or max_kv <= 2048):
        within = work < 5 * 2 ** 20
    else:
        within = work <= 2 ** 22
    if within and out_work <= 32768 and max_kv < 32768 and total_kv < 5 * 2 ** 14:
        return True
    return (max_q == 1 and work < 5 * 2 ** 20 and max_kv <= 4096 and out_work <= 2048 and batch < 32
            and total_kv < 5 * 2 ** 14)


def _graph_order(heads: int, work: int, out_work: int, total_q: int, max_q: int, min_kv: int,
                 max_kv: int) -> tuple[str, ...]:
    """CUDA-graph plans: TRT or monolithic CuTe first, by launch-amortisation regime."""
    trt_first, mono_first = prefer(TRT, MONO), prefer(MONO, TRT)
    if heads >= 64 and max_q >= 128 and out_work >= 65536 and max_kv <= 512:
        return trt_first
    if heads >= 64 and out_work >= 24576 and 16 <= max_q <= 32 and max_kv <= 32:
        return trt_first
    tile = max_q * heads
    if work <= 2 ** 20 and max_kv <= 512 and (tile <= 128 or max_q <= 16):
        return trt_first if tile <= 576 else mono_first
    if max_q == 1 and heads >= 64 and total_q >= 96 and max_kv <= 512:
        return trt_first
    if heads >= 128:
        if min_kv >= 2048:
            limit = 6 * 2 ** 20 if max_kv <= 4096 else 2 ** 22
            if 1 < max_q <= 8 and min_kv > 4096:
                limit = 2 ** 23
            if work <= limit:
                return mono_first
        return trt_first
    if max_q == 1 and (min_kv >= 8192 or (out_work > 384 and max_kv > 512)
                       or (16 < heads < 32 and min_kv > 512 and max_kv <= 2048)):
        return mono_first
    if work <= 2 ** 20 and max_q == 1:
        return trt_first
    return mono_first


def _move_before(order: tuple[str, ...], backend: str, anchor: str) -> tuple[str, ...]:
    rest = tuple(b for b in order if b != backend)
    at = rest.index(anchor)
    return rest[:at] + (backend,) + rest[at:]


def _mtp_eligible(request: PlanRequest) -> bool:
    c = request.contract
    return (request.fp8 and request.num_heads == 128 and request.head_dim_ckv == 512 and request.head_dim_kpe == 64
            and request.page_size in (64, 128) and request.causal and c.query_layout == "packed"
            and c.kv_cache_layout == "packed" and c.scale_mode == "default" and request.sm_scale > 0
            and c.output_scale == "none" and not c.use_sinks and not request.use_profiler and not c.skip_softmax
            and c.enable_pdl is not True)


def order_sm107(request: PlanRequest) -> tuple[str, ...]:
    """`_ordered_sm107_backends`: the SM100 order, with Rubin MTP moved before monolithic CuTe in its regime."""
    order = order_sm100(request)
    if not _mtp_eligible(request):
        return order
    q, kv = _lengths(request)
    batch = len(kv)
    if not 32 <= batch <= 128 or len(q) != batch or q[0] not in (2, 4) or any(x != q[0] for x in q) \
            or min(kv) < q[0]:
        return order
    total_q, min_k, max_k = batch * q[0], min(kv), max(kv)
    aligned_k = -(-max_k // 128) * 128
    dense = request.metadata.dense
    if dense is None and request.use_cuda_graph:
        return order
    capacity = dense.width * request.page_size if dense is not None else aligned_k
    capacity = -(-capacity // 128) * 128
    if request.use_cuda_graph:
        mtp = total_q >= 256 and capacity <= 2048 and capacity <= aligned_k and (capacity <= 256 or min_k == max_k)
    else:
        mtp = (min_k == max_k and total_q >= 128 and capacity <= 65536 and capacity <= 2 * max_k
               and (min_k >= 32768 or (total_q >= 256 and min_k >= 8192)))
    return _move_before(order, MTP, MONO) if mtp else order


def auto_order(request: PlanRequest, cc: tuple[int, int]) -> tuple[str, ...]:
    """The auto candidates for a device of compute capability `cc`."""
    if cc == (8, 0):
        return prefer(FA2)
    if cc == (9, 0):
        return prefer(FA3, FA2)
    if cc in ((10, 0), (10, 3)):
        return order_sm100(request)
    if cc == (10, 7):
        return order_sm107(request)
    if cc in ((12, 0), (12, 1)):
        return prefer(FA2, "xqa", "cutile")
    return DEFAULT_ORDER


def plan_backend(name: str, request: PlanRequest, outcomes: Mapping[str, str]) -> str:
    """One backend's `plan_from_wrapper`: its capability check, then what the environment says."""
    rejection = capability_rejection(request.contract, CAPABILITIES[name])
    if rejection is not None:
        raise BackendUnsupported(rejection.message)
    outcome = outcomes.get(name, "ok")
    if outcome == "unsupported":
        raise BackendUnsupported(f"{name} is not supported on this device or configuration")
    if outcome.startswith("error:"):
        raise BackendFailure(name, outcome[len("error:"):])
    return name


def select_backend(request: PlanRequest, backend: str = "auto", cc: tuple[int, int] = (9, 0),
                   outcomes: Mapping[str, str] = {}, *, previous: str | None = None, allow_experimental: bool = False,
                   variant: MlaBackendsVariant = FIXED) -> SelectionTrace:
    """Resolve `backend` ("auto", "cute-dsl" or a backend name) to a planned backend; never raises for a
    refusal: the trace records the resolved backend, or the error that plan() raises."""
    trace = SelectionTrace(backend)
    try:
        if backend == "auto":
            _select_auto(trace, request, cc, outcomes, previous, allow_experimental, variant)
        elif backend == "cute-dsl":
            _select_family(trace, request, outcomes)
        else:
            trace.candidates = (backend,)
            trace.probed.append(backend)
            trace.resolved = plan_backend(backend, request, outcomes)
    except BackendUnsupported as exc:
        trace.error, trace.message = "unsupported", str(exc)
    except MetadataError as exc:
        trace.error, trace.message = f"metadata:{exc.rule}", str(exc)
    except BackendFailure as exc:
        trace.error, trace.message = f"failure:{exc.kind}", str(exc)
    return trace


def _select_auto(trace: SelectionTrace, request: PlanRequest, cc: tuple[int, int], outcomes: Mapping[str, str],
                 previous: str | None, allow_experimental: bool, variant: MlaBackendsVariant) -> None:
    resolve_csr(request.metadata, request.page_size)  # malformed metadata is never a candidate's refusal
    if request.use_cuda_graph and previous is not None:
        trace.candidates = (previous,)  # a graph re-plan stays with the executable family it captured
    else:
        trace.candidates = auto_order(request, cc)
    fallback_on: type[Exception] = BackendUnsupported if variant.fallback_only_on_unsupported else Exception
    for candidate in trace.candidates:
        try:
            if CAPABILITIES[candidate].is_experimental and not allow_experimental:
                raise BackendUnsupported("experimental backend requires FLASHINFER_ALLOW_EXPERIMENTAL_AUTO_BACKENDS=1")
            trace.probed.append(candidate)
            trace.resolved = plan_backend(candidate, request, outcomes)
            return
        except fallback_on as exc:
            if len(trace.candidates) == 1:
                raise
            trace.rejections.append((candidate, str(exc)))
    raise BackendUnsupported("No supported planned MLA backend: "
                             + "; ".join(f"{c}: {r}" for c, r in trace.rejections))


def _select_family(trace: SelectionTrace, request: PlanRequest, outcomes: Mapping[str, str]) -> None:
    """The `"cute-dsl"` alias: monolithic, modular, Rubin MTP (only the sink-capable ones if sinks are used
    and any is); a member its capabilities refuse is not planned (not probed); the first that plans wins;
    else every rejection, joined (settled against 0.7.4 by `conform flashinfer --target selection-loops`)."""
    members = CUTE_DSL_FAMILY
    if request.contract.use_sinks:
        members = tuple(m for m in members if CAPABILITIES[m].supports_sinks) or members
    trace.candidates = members
    for member in members:
        try:
            rejection = capability_rejection(request.contract, CAPABILITIES[member])
            if rejection is not None:  # the alias checks each member's capabilities before planning it
                raise BackendUnsupported(rejection.message)
            trace.probed.append(member)
            trace.resolved = plan_backend(member, request, outcomes)
            return
        except BackendUnsupported as exc:
            trace.rejections.append((member, str(exc)))
    raise BackendUnsupported("; ".join(f"{c}: {r}" for c, r in trace.rejections))
