"""FlashInfer 0.7.4 backend capabilities and auto order (`_capabilities.py`, `_auto_policy.py`) against `mla-backends`.

* `CAPABILITIES` (a Differential): the whole capability matrix (pinned: every backend's `_plan_capabilities`,
  read from the backend files' literal arguments and built with the release's `MLAPlanCapabilities`) against
  the model's `CAPABILITIES`, field by field; then `plan_capability_rejection_reason` against the model's
  `capability_rejection` on random plan contracts (every field, `enable_pdl` None / False / True, a query kind
  of None) for a release backend's record or a random one (any modes, any flags: the rules the release's
  matrix never exercises, such as skip-softmax with an LSE), or a random one widened to admit the contract's
  modes and layouts (`admitting`: only the flags can reject, so each flag rule is reached). Convention:
  upstream returns a message, the model a `Rejection` kind; the adapter names upstream's message by its wording
  (`KIND_WORDS`) and by the backend name it starts with. Pinned besides the matrix: each flag rule's contract on
  a record admitting every mode and layout, every flag set or none (`flag_cases`).
* `AUTO_ORDER` (a Differential): `ordered_sm80_backends`, `ordered_sm90_backends`, `ordered_sm100_backends`,
  `_ordered_sm107_backends`, `ordered_sm12x_backends` and the default `_AUTO_BACKEND_CANDIDATES` against the
  model's `auto_order` on each compute capability, on random workloads of two kinds: any batch (empty ones
  too), query and KV lengths up to 70k, heads, LSE mode, CUDA graph, causal, fp8, page size, CSR or dense
  (wider than needed); and Rubin-MTP workloads (`_ordered_sm107_backends`' regime: fp8, 128 heads, 512 / 64,
  page 64 or 128, causal, packed, 32-128 uniform requests of 2 or 4 queries), with one eligibility fact
  changed in some (heads, head dims, page size, causal, layouts, scale and output modes, sinks, profiler,
  skip-softmax, PDL, sm_scale). Pinned: workloads on the regime boundaries of the SM100 and SM107 orders
  (`boundary_workloads`), each eligibility fact changed alone in a workload that prefers Rubin MTP (eagerly and
  under a graph), and `THRESHOLDS`: workloads exactly at or next to a limit of the two orders (work, output work,
  total and max KV, query tile, capacity; requests with no query), one for each comparison or constant a
  regression could move. Convention: upstream reads a `_MLAPlanArguments`; the adapter passes a stand-in with
  the fields those functions read and a `csr()` that returns the CSR tensors.

Survivors (declared in `models/mla_backends/conform.py`): symmetric or equal-valued changes (zip's lists swapped,
`q_lens[1]` for `q_lens[0]` once all are equal, limits moved by one where the values are even or multiples of
128), tests another rule has settled before (rule 3's output limit, the graph rule's `max_kv > 512`), one FP8
dtype test of three (the model has one fp8 flag), and the flat-CSR length tests (not drawn: the model resolves a
strict CSR).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential
from kvsim.models.mla_backends import capabilities as model_caps
from kvsim.models.mla_backends.capabilities import CAPABILITIES as MODEL_CAPABILITIES
from kvsim.models.mla_backends.capabilities import PlanContract, capability_rejection
from kvsim.models.mla_backends.metadata import CsrMetadata, PlanMetadata, csr_from_dense, dense_from_csr
from kvsim.models.mla_backends.selection import COMPUTE_CAPABILITIES, DEFAULT_ORDER, PlanRequest, auto_order

from .common import MLA, as_dict, int32, table, upstream_capabilities

POLICY = f"{MLA}/_auto_policy.py"
ORDER_FUNCTIONS = {(8, 0): "ordered_sm80_backends", (9, 0): "ordered_sm90_backends",
                   (10, 0): "ordered_sm100_backends", (10, 3): "ordered_sm100_backends",
                   (10, 7): "_ordered_sm107_backends", (12, 0): "ordered_sm12x_backends",
                   (12, 1): "ordered_sm12x_backends"}
KIND_WORDS = (("packed query view", "packed_query"), ("packed KV-cache view", "packed_kv_cache"),
              ("combined LSE and skip-softmax", "skip_softmax_with_lse"), ("LSE contract", "lse"),
              ("KV layout contract", "kv_layout"), ("output contract", "output_scale"),
              ("scale contract", "scale_mode"), ("skip-softmax contract", "skip_softmax"),
              ("enable_pdl", "enable_pdl"), ("sink inputs", "sinks"))
FLAGS = ("is_experimental", "supports_skip_softmax", "supports_skip_softmax_with_lse", "supports_enable_pdl",
         "supports_sinks", "supports_cuda_graph_replan", "requires_packed_query", "requires_packed_kv_cache")


def prepare_capabilities(ctx: Context) -> None:
    """The release's matrix, read once."""
    ctx.state["caps"] = upstream_capabilities(ctx.source, ctx.up.MLAPlanCapabilities)


# -- capabilities -------------------------------------------------------------------------------------------

def kind_of(message: str | None, backend: str) -> str | None:
    """The rejection kind upstream's message names (None: no rejection); a message that does not start with the
    backend's name is named as such."""
    if message is None:
        return None
    kind = next((k for words, k in KIND_WORDS if words in message), f"unrecognised: {message}")
    return kind if message.startswith(f"{backend} backend ") else f"{kind} (not naming {backend}: {message})"


def matrix(caps: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The matrix as plain data: each backend's fields, sets sorted."""
    return {name: {k: sorted(v) if isinstance(v, frozenset) else v for k, v in as_dict(c).items()}
            for name, c in caps.items()}


@dataclasses.dataclass(frozen=True)
class RejectionCase:
    """`plan_capability_rejection_reason(contract, capabilities)`: a release backend's record (`backend`), or a
    random one (`record`: the fields of `MLAPlanCapabilities`)."""

    contract: PlanContract
    backend: str | None = None
    record: tuple[tuple[str, Any], ...] = ()


MATRIX = "the capability matrix"
FLAG_CONTRACTS = (PlanContract(skip_softmax=True, lse_mode="base2"), PlanContract(skip_softmax=True),
                  PlanContract(enable_pdl=True), PlanContract(use_sinks=True))  # one per flag rule


def records() -> Any:
    def subset(values: tuple[str, ...]) -> Any:
        return st.lists(st.sampled_from(values), unique=True).map(lambda xs: tuple(sorted(xs)))

    return st.builds(lambda lse, kv, out, scale, flags: (("backend_name", "random"), ("lse_modes", lse),
                                                          ("kv_layouts", kv), ("output_scales", out),
                                                          ("scale_modes", scale), *zip(FLAGS, flags)),
                     subset(model_caps.LSE_MODES), subset(model_caps.KV_LAYOUTS), subset(model_caps.OUTPUT_SCALES),
                     subset(model_caps.SCALE_MODES), st.tuples(*(st.booleans() for _ in FLAGS)))


def admitting(contract: PlanContract, record: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """`record` widened to admit `contract`'s modes and layouts (its own and the contract's), packed views not
    required: only its flags can reject, so the flag rules (checked last) are reached with either flag value."""
    modes = {"lse_modes": contract.lse_mode, "kv_layouts": contract.kv_layout, "output_scales": contract.output_scale,
             "scale_modes": contract.scale_mode}
    return tuple((k, tuple(sorted({*v, modes[k]})) if k in modes else False if k.startswith("requires_") else v)
                 for k, v in record)


def rejection_cases() -> Any:
    from kvsim.properties.mla_backends.strategies import CONTRACTS

    return st.one_of(st.builds(RejectionCase, CONTRACTS, st.sampled_from(tuple(MODEL_CAPABILITIES))),
                     st.builds(lambda c, r: RejectionCase(c, record=r), CONTRACTS, records()),
                     st.builds(lambda c, r: RejectionCase(c, record=admitting(c, r)), CONTRACTS, records()))


def _record(cls: type, case: RejectionCase) -> Any:
    fields = dict(case.record)
    return cls(**{k: frozenset(v) if isinstance(v, tuple) else v for k, v in fields.items()})


def flag_cases(ctx: Context) -> list[Any]:
    """The matrix, and each flag rule's contract on a record admitting every mode and layout, with every flag set
    and with none: the rule decides alone (random records reach it seldom, behind four set-membership rules)."""
    every = (("lse_modes", model_caps.LSE_MODES), ("kv_layouts", model_caps.KV_LAYOUTS),
             ("output_scales", model_caps.OUTPUT_SCALES), ("scale_modes", model_caps.SCALE_MODES))
    return [MATRIX] + [RejectionCase(c, record=admitting(c, (("backend_name", "random"), *every,
                                                             *((f, flag) for f in FLAGS))))
                       for c in FLAG_CONTRACTS for flag in (True, False)]


def capabilities_model(ctx: Context, case: Any) -> Any:
    if case == MATRIX:
        return matrix(MODEL_CAPABILITIES)
    caps = MODEL_CAPABILITIES[case.backend] if case.backend else _record(model_caps.MLAPlanCapabilities, case)
    found = capability_rejection(case.contract, caps)
    return {"rejection": found.kind if found is not None else None}


def capabilities_upstream(ctx: Context, case: Any) -> Any:
    if case == MATRIX:
        return matrix(ctx.state["caps"])
    caps = ctx.state["caps"][case.backend] if case.backend else _record(ctx.up.MLAPlanCapabilities, case)
    args = SimpleNamespace(**as_dict(case.contract))
    return {"rejection": kind_of(ctx.up.plan_capability_rejection_reason(args, caps), caps.backend_name)}


def describe_capabilities(ctx: Context, case: Any) -> Any:
    if case == MATRIX:
        return MATRIX
    return {"contract": as_dict(case.contract), "backend": case.backend, "record": dict(case.record) or None}


CAPABILITIES = Differential(
    prepare=prepare_capabilities, inputs=lambda ctx: rejection_cases(), pinned=flag_cases,
    model=capabilities_model, upstream=capabilities_upstream, describe=describe_capabilities,
    note=lambda ctx: f"{len(MODEL_CAPABILITIES)} backends' matrices; rejection reasons on release and random "
                     f"capability records")


# -- the auto order -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Workload:
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int
    heads: int
    contract: PlanContract = PlanContract()
    graph: bool = False
    causal: bool = False
    fp8: bool = False
    dense: bool = False
    extra_width: int = 0
    head_dims: tuple[int, int] = (512, 64)
    sm_scale: float = 192 ** -0.5
    profiler: bool = False


@st.composite
def general_workloads(draw: st.DrawFn) -> Workload:
    batch = draw(st.one_of(st.integers(0, 48), st.sampled_from((95, 96, 128))))
    uniform = draw(st.booleans())
    q_one = draw(st.sampled_from((1, 2, 4, 8, 16, 32, 128)))
    q = tuple(q_one if uniform else draw(st.sampled_from((0, 1, 2, 4, 16, 130))) for _ in range(batch))
    kv_one = draw(st.sampled_from((0, 1, 32, 64, 500, 512, 1024, 2048, 4096, 4097, 8192, 9000, 33000, 70000)))
    kv = tuple(kv_one if uniform else draw(st.sampled_from((0, 1, 300, 1024, 2048, 5000, 40000))) for _ in range(batch))
    lse = draw(st.sampled_from(("none", "base2", "basee")))
    return Workload(q, kv, draw(st.sampled_from((64, 128, 1024))),
                    draw(st.sampled_from((8, 9, 16, 17, 24, 31, 32, 64, 127, 128, 256))),
                    PlanContract(lse_mode=lse), draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
                    draw(st.booleans()), draw(st.integers(0, 3)))


MTP_CHANGES = ("heads", "head_dim_ckv", "head_dim_kpe", "page_size", "causal", "query_layout", "kv_cache_layout",
               "scale_mode", "output_scale", "use_sinks", "skip_softmax", "enable_pdl", "sm_scale", "profiler",
               "fp8", "mixed_q", "short_kv")


@st.composite
def mtp_workloads(draw: st.DrawFn) -> Workload:
    """`_ordered_sm107_backends`' regime, one eligibility fact changed in about half of them."""
    batch = draw(st.sampled_from((31, 32, 33, 64, 100, 128, 129)))
    q = draw(st.sampled_from((2, 4, 1, 3)))
    same = draw(st.booleans())
    kv_one = draw(st.sampled_from((2, 100, 256, 1024, 2048, 8192, 16384, 32768, 40000)))
    kv = tuple(kv_one if same else draw(st.sampled_from((4, 128, 256, 2000, 8192, 32768, 40000)))
               for _ in range(batch))
    page = draw(st.sampled_from((64, 128)))
    w = Workload((q,) * batch, kv, page, 128, PlanContract(enable_pdl=draw(st.sampled_from((None, False)))),
                 graph=draw(st.booleans()), causal=True, fp8=True, dense=draw(st.booleans()),
                 extra_width=draw(st.sampled_from((0, 0, 1, 16, 300))))
    change = draw(st.sampled_from((None,) * len(MTP_CHANGES) + MTP_CHANGES))
    return mtp_change(w, change) if change else w


def mtp_change(w: Workload, change: str) -> Workload:
    """`w` (a Rubin-MTP workload) with one eligibility fact changed (`MTP_CHANGES`)."""
    c, q, batch = w.contract, w.q_lens[0], len(w.q_lens)
    changes = {"heads": {"heads": 64}, "head_dim_ckv": {"head_dims": (256, 64)}, "head_dim_kpe": {"head_dims": (512, 32)},
               "page_size": {"page_size": 32}, "causal": {"causal": False},
               "query_layout": {"contract": dataclasses.replace(c, query_layout="split")},
               "kv_cache_layout": {"contract": dataclasses.replace(c, kv_cache_layout="split")},
               "scale_mode": {"contract": dataclasses.replace(c, scale_mode="bmm-scalar")},
               "output_scale": {"contract": dataclasses.replace(c, output_scale="per-tensor")},
               "use_sinks": {"contract": dataclasses.replace(c, use_sinks=True)},
               "skip_softmax": {"contract": dataclasses.replace(c, skip_softmax=True)},
               "enable_pdl": {"contract": dataclasses.replace(c, enable_pdl=True)}, "sm_scale": {"sm_scale": 0.0},
               "profiler": {"profiler": True}, "fp8": {"fp8": False},
               "mixed_q": {"q_lens": (q,) * (batch - 1) + (q + 2,)}, "short_kv": {"kv_lens": (1,) + w.kv_lens[1:]}}
    return dataclasses.replace(w, **changes[change])


def boundary_workloads(ctx: Context) -> list[Workload]:
    """Workloads on the thresholds the SM100 and SM107 orders compare with (work, output work, KV lengths), one
    past each, and one in each regime random workloads seldom reach (CUDA-graph decode batches of 96 and more,
    base-2 prefill, Rubin MTP preferred eagerly and under a graph)."""
    out = []
    for heads, q in ((16, 1), (128, 1), (64, 4), (128, 16)):
        for work in (2 ** 20, 2 ** 21, 5 * 2 ** 20, 2 ** 22, 6 * 2 ** 20, 2 ** 23):
            kv, rest = divmod(work, heads * q)
            if rest == 0 and kv <= 70000:
                out += [Workload((q,), (n,), 1024, heads, graph=graph) for n in (kv, kv + 1) for graph in (False, True)]
    for kv in (32, 512, 1024, 2048, 4096, 8192, 32768):
        for heads, q in ((16, 1), (64, 16), (128, 1), (128, 128)):
            out += [Workload((q,) * 2, (n, kv), 1024, heads, graph=graph) for n in (kv - 1, kv, kv + 1)
                    for graph in (False, True)]
    decode = Workload((1,) * 96, (512,) * 96, 64, 64, graph=True)
    out += [decode, dataclasses.replace(decode, q_lens=(1,) * 95, kv_lens=(512,) * 95), dataclasses.replace(decode, kv_lens=(513,) * 96),
            Workload((1,) * 24, (600,) * 24, 64, 16, graph=True),  # small output work, longer KV
            Workload((4,) * 4, (40,) * 4, 64, 16, PlanContract(lse_mode="base2"), graph=True),
            Workload((4,) * 4, (41,) * 4, 64, 16, PlanContract(lse_mode="base2"), graph=True),
            Workload((128,) * 4, (300,) * 4, 1024, 128, graph=True), Workload((32,) * 12, (32,) * 12, 1024, 64, graph=True),
            Workload((1,) * 17, (4096,) * 17, 1024, 64),  # the third eager rule (work past 2^22, decode)
            Workload((1,) * 8, (2048,) * 8, 64, 128, graph=True), Workload((2,) * 8, (5000,) * 8, 64, 128, graph=True)]
    # long-KV multi-query graphs on SM100: the raised graph limit holds for 1 < max_q <= 8 and min_kv > 4096 only
    out += [Workload((q,) * b, (kv,) * b, 64, 128, graph=True) for q in (8, 9) for kv in (4096, 4097)
            for b in (1, 2, 4, 8)]
    mtp = Workload((2,) * 64, (32768,) * 64, 128, 128, causal=True, fp8=True)
    graph_mtp = dataclasses.replace(mtp, graph=True, dense=True, kv_lens=(2048,) * 64, q_lens=(4,) * 64)
    # each eligibility fact changed alone in a workload that prefers Rubin MTP, eagerly and under a graph
    out += [mtp_change(w, change) for w in (mtp, graph_mtp) for change in MTP_CHANGES]
    out += [mtp, dataclasses.replace(mtp, q_lens=(4,) * 64, kv_lens=(8192,) * 64), graph_mtp,
            dataclasses.replace(mtp, graph=True, dense=True, q_lens=(2,) * 128, kv_lens=(256,) * 128, page_size=64),
            dataclasses.replace(mtp, graph=True, dense=True, q_lens=(2,) * 128, kv_lens=(200,) * 127 + (256,),
                                page_size=64)]
    return out + [_runs(*entry) for entry in THRESHOLDS]


# Workloads on the thresholds of the SM100 and SM107 orders that the rules above do not reach (one per boundary
# a changed comparison or constant would move, found by searching threshold-hitting batches: work, output work,
# total and max KV exactly at or next to a limit, requests with no query): (heads, page size, query lengths, KV
# lengths, flags[, LSE mode[, extra table width[, scale mode]]]), lengths as (value, count) runs, flags g: CUDA
# graph, c: causal, f: fp8, d: dense.
THRESHOLDS = (
    (127, 64, ((127, 24),), ((5, 24),), 'g'), (128, 128, ((1, 2),), ((20479, 2),), ''),
    (17, 128, ((1, 21),), ((513, 21),), 'g'), (17, 128, ((2, 1),), ((81920, 1),), 'c'),
    (17, 128, ((4, 97),), ((2049, 97),), ''), (24, 128, ((1, 1),), ((2048, 1),), 'gc'),
    (32, 1024, ((1, 1),), ((2047, 1),), 'g'), (32, 64, ((2, 128),), ((639, 128),), ''),
    (64, 64, ((1, 4),), ((4096, 4),), 'gcf'), (128, 128, ((2, 4),), ((4097, 4),), 'gc'),
    (64, 1024, ((1, 16),), ((4097, 16),), 'c'), (128, 64, ((4, 127),), ((4, 127),), 'gcfd'),
    (128, 64, ((4, 33),), ((2047, 33),), 'gcfd'), (128, 128, ((4, 100),), ((65536, 100),), 'cf'),
    (33, 128, ((16, 1),), ((0, 1),), 'c', 'base2'), (64, 64, ((0, 1),), ((992, 1),), 'c', 'base2'),
    (128, 64, ((1, 4),), ((33, 4),), 'gf', 'base2'), (64, 64, ((9, 33),), ((51, 33),), 'g', 'basee'),
    (128, 128, ((4, 128),), ((32769, 128),), 'gcfd'), (17, 64, ((3, 1),), ((32767, 1),), 'c', 'base2'),
    (24, 128, ((1, 2),), ((513, 1), (512, 1)), 'gc'), (64, 64, ((128, 8),), ((287, 8),), 'g', 'base2'),
    (8, 64, ((256, 2),), ((1024, 2),), 'g', 'base2'), (33, 64, ((1, 993),), ((32, 993),), 'f', 'base2'),
    (63, 64, ((17, 97),), ((21, 97),), 'gc', 'base2'), (64, 64, ((1, 31),), ((2641, 31),), 'c', 'basee'),
    (64, 64, ((16, 97),), ((32, 97),), 'gf', 'base2'), (8, 1024, ((2, 24),), ((40, 24),), 'gc', 'base2'),
    (24, 1024, ((1, 1),), ((2049, 1),), 'gf', 'basee'), (33, 128, ((3, 331),), ((1, 331),), 'gc', 'base2'),
    (127, 1024, ((1, 24),), ((1719, 24),), '', 'base2'), (256, 1024, ((15, 95),), ((1, 95),), 'gc', 'base2'),
    (31, 1024, ((1, 12),), ((1024, 12),), 'g', 'base2'), (63, 1024, ((129, 16),), ((39, 16),), 'g', 'base2'),
    (64, 1024, ((128, 4),), ((288, 4),), 'gc', 'base2'), (64, 1024, ((2, 257),), ((32, 257),), 'g', 'basee'),
    (63, 128, ((1, 521),), ((512, 521),), 'gf', 'basee'), (128, 128, ((32, 97),), ((50240, 97),), 'cf', 'base2'),
    (128, 128, ((2, 128),), ((3, 128),), 'gcfd', 'none', 1), (33, 64, ((1, 24), (0, 1)), ((3392, 24), (512, 1)), ''),
    (8, 64, ((3, 2), (4, 1), (3, 28)), ((69845, 31),), 'f'), (128, 128, ((2, 33),), ((40000, 33),), 'cf', 'none', 16),
    (128, 128, ((4, 32),), ((40000, 32),), 'cf', 'none', 16),
    (128, 64, ((2, 128),), ((8191, 128),), 'cfd', 'none', 2),
    (128, 64, ((4, 64),), ((16384, 64),), 'cfd', 'none', 300),
    (128, 64, ((4, 64),), ((65537, 64),), 'cf', 'none', 1000),
    (128, 128, ((2, 129),), ((32769, 129),), 'cfd', 'none', 2),
    (128, 128, ((2, 127),), ((32767, 127),), 'cfd', 'none', 16),
    (128, 128, ((4, 100),), ((4, 15), (1, 1), (4, 84)), 'gcfd'),
    (16, 64, ((16, 128), (0, 40)), ((31, 128), (4096, 40)), 'c'),
    (8, 128, ((1, 49),), ((2048, 9), (4097, 1), (2048, 39)), ''),
    (8, 1024, ((3, 95),), ((45, 34), (44, 1), (45, 60)), 'g', 'base2'),
    (9, 1024, ((16, 16), (4, 1), (16, 7)), ((3413, 24),), '', 'base2'),
    (127, 64, ((16, 81), (0, 1), (16, 46)), ((33, 128),), 'g', 'base2'),
    (128, 1024, ((9, 4),), ((49, 1), (4096, 1), (49, 2)), 'c', 'base2'),
    (128, 128, ((2, 128),), ((2048, 105), (128, 1), (2048, 22)), 'gcfd'),
    (64, 1024, ((128, 33), (0, 1)), ((3, 33), (512, 1)), 'gcf', 'base2'),
    (64, 128, ((128, 4),), ((287, 2), (143, 1), (287, 1)), 'c', 'base2'),
    (8, 1024, ((256, 9), (255, 3)), ((31, 9), (1025, 3)), 'gc', 'base2'),
    (17, 128, ((16, 19), (17, 1), (16, 11)), ((65, 31),), 'gcf', 'basee'),
    (9, 64, ((1, 16),), ((12949, 7), (32, 1), (12949, 8)), 'gc', 'base2'),
    (128, 64, ((1, 64),), ((512, 42), (4096, 1), (512, 21)), 'c', 'basee'),
    (64, 64, ((1, 32),), ((2559, 22), (2560, 1), (2559, 9)), 'c', 'basee'),
    (9, 1024, ((1, 95),), ((512, 77), (513, 1), (512, 17)), 'gf', 'basee'),
    (128, 128, ((1, 129),), ((256, 129),), 'cfd', 'none', 16, 'bmm-scalar'),
    (128, 64, ((1, 16),), ((2584, 12), (2583, 1), (2584, 3)), 'c', 'base2'),
    (9, 1024, ((128, 13), (127, 1), (128, 2)), ((288, 16),), 'gc', 'base2'),
    (127, 128, ((129, 76), (2, 1), (129, 18)), ((513, 95),), 'gcf', 'base2'),
    (128, 128, ((2, 128),), ((128, 86), (4, 1), (128, 41)), 'cf', 'none', 1000),
    (8, 64, ((2, 1), (1, 32)), ((4097, 20), (4098, 1), (4097, 12)), '', 'basee'),
    (128, 64, ((2, 64),), ((65536, 52), (32768, 1), (65536, 11)), 'cf', 'none', 2),
    (128, 128, ((4, 64),), ((8192, 64),), 'cfd', 'none', 64),  # capacity exactly twice the KV length (Rubin MTP)
    # eager, at the edges of the within-eager-limit exception (heads >= 128) with rule 3 shut by a batch of 32
    (128, 64, ((2, 8), (1, 1)), ((2100, 8), (100, 1)), ''), (128, 64, ((1, 16), (0, 16)), ((2100, 16), (0, 16)), ''),
    (683, 64, ((1, 3), (0, 29)), ((2100, 3), (0, 29)), ''), (683, 64, ((1, 3),), ((2100, 3),), ''),
    (128, 64, ((1, 17), (0, 15)), ((2048, 17), (0, 15)), ''), (128, 64, ((1, 17), (0, 15)), ((2049, 17), (0, 15)), ''),
    (128, 64, ((1, 17), (0, 15)), ((2100, 17), (0, 15)), ''),
    # small work exactly at its work and output limits; rule 3 at its work and total-KV limits; base-2 at 2^23
    (16, 64, ((1, 32),), ((4096, 32),), ''), (128, 64, ((256, 1), (0, 20)), ((1, 1), (4096, 20)), ''),
    (128, 64, ((1, 10),), ((4096, 10),), ''), (60, 64, ((1, 20),), ((4096, 20),), ''),
    (64, 64, ((128, 4),), ((256, 4),), '', 'base2'),
    # graph: output work one below 65536 and 24576, max_q or max_kv 33, query tiles of 128, 129 and 577, output
    # work 384 and 385 on decode
    (85, 64, ((128, 6), (3, 1)), ((512, 7),), 'g'), (983, 64, ((16, 1), (9, 1)), ((32, 2),), 'g'),
    (64, 64, ((33, 12),), ((32, 12),), 'g'), (64, 64, ((32, 12),), ((33, 12),), 'g'),
    (4, 64, ((32, 1),), ((512, 1),), 'g'), (3, 64, ((43, 1),), ((512, 1),), 'g'),
    (577, 64, ((1, 1),), ((512, 1),), 'g'), (64, 64, ((1, 6),), ((600, 6),), 'g'),
    (35, 64, ((1, 11),), ((600, 11),), 'g'),
)


def _runs(heads: int, page: int, q: tuple[tuple[int, int], ...], kv: tuple[tuple[int, int], ...], flags: str,
          lse: str = "none", extra: int = 0, scale: str = "default") -> Workload:
    """A `THRESHOLDS` entry as a workload."""
    return Workload(tuple(v for v, n in q for _ in range(n)), tuple(v for v, n in kv for _ in range(n)), page, heads,
                    PlanContract(lse_mode=lse, scale_mode=scale), graph="g" in flags, causal="c" in flags,
                    fp8="f" in flags, dense="d" in flags, extra_width=extra)


def workloads() -> Any:
    return st.one_of(general_workloads(), mtp_workloads())


def _csr_of(w: Workload) -> CsrMetadata:
    qo, kv, indices = [0], [0], []
    for q, n in zip(w.q_lens, w.kv_lens):
        pages = -(-n // w.page_size)
        qo.append(qo[-1] + q)
        indices.extend(range(kv[-1], kv[-1] + pages))
        kv.append(kv[-1] + pages)
    return CsrMetadata(tuple(qo), tuple(kv), tuple(indices), w.kv_lens)


def request_of(w: Workload) -> PlanRequest:
    csr = _csr_of(w)
    if w.dense:
        dense = dense_from_csr(csr)
        dense = dataclasses.replace(dense, width=dense.width + w.extra_width,
                                    block_tables=tuple(r + (0,) * w.extra_width for r in dense.block_tables))
        metadata = PlanMetadata(dense=dense)
    else:
        metadata = PlanMetadata(csr=csr)
    return PlanRequest(metadata, page_size=w.page_size, num_heads=w.heads, causal=w.causal, contract=w.contract,
                       use_cuda_graph=w.graph, fp8=w.fp8, head_dim_ckv=w.head_dims[0], head_dim_kpe=w.head_dims[1],
                       sm_scale=w.sm_scale, use_profiler=w.profiler)


def upstream_args(request: PlanRequest) -> SimpleNamespace:
    """A stand-in `_MLAPlanArguments`: the fields the order functions read, and `csr()` (the CSR tensors)."""
    import torch

    c = request.contract
    meta = request.metadata
    csr = meta.csr if meta.csr is not None else csr_from_dense(meta.dense, request.page_size)  # type: ignore[arg-type]
    dtype = torch.float8_e4m3fn if request.fp8 else torch.bfloat16
    block_tables = table(meta.dense.block_tables, meta.dense.width) if meta.dense is not None else None
    tensors = SimpleNamespace(qo_indptr=int32(csr.qo_indptr), kv_indptr=int32(csr.kv_indptr),
                              kv_indices=int32(csr.kv_indices), kv_len_arr=int32(csr.kv_len_arr))
    return SimpleNamespace(
        csr=lambda: tensors,
        metadata=SimpleNamespace(block_tables=block_tables), num_heads=request.num_heads, lse_mode=c.lse_mode,
        _use_cuda_graph=request.use_cuda_graph, causal=request.causal, q_data_type=dtype, kv_data_type=dtype,
        output_dtype=dtype, head_dim_ckv=request.head_dim_ckv, head_dim_kpe=request.head_dim_kpe,
        page_size=request.page_size, query_layout=c.query_layout, kv_cache_layout=c.kv_cache_layout,
        scale_mode=c.scale_mode, sm_scale=request.sm_scale, output_scale=c.output_scale, use_sinks=c.use_sinks,
        use_profiler=request.use_profiler, skip_softmax=c.skip_softmax, enable_pdl=c.enable_pdl)


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


def order_model(ctx: Context, w: Workload) -> dict[str, list[str]]:
    request = request_of(w)
    return {_sm(cc): list(auto_order(request, cc)) for cc in COMPUTE_CAPABILITIES}


def order_upstream(ctx: Context, w: Workload) -> dict[str, list[str]]:
    args = upstream_args(request_of(w))
    return {_sm(cc): list(getattr(ctx.up, ORDER_FUNCTIONS[cc])(args)) if cc in ORDER_FUNCTIONS
            else list(ctx.up._AUTO_BACKEND_CANDIDATES) for cc in COMPUTE_CAPABILITIES}


def describe_workload(ctx: Context, w: Workload) -> dict[str, Any]:
    shown = dataclasses.asdict(w)
    shown["contract"] = {k: v for k, v in as_dict(w.contract).items() if v != getattr(PlanContract(), k)}
    return shown


AUTO_ORDER = Differential(
    inputs=lambda ctx: workloads(), pinned=boundary_workloads, model=order_model, upstream=order_upstream,
    describe=describe_workload,
    note=lambda ctx: f"each workload on {len(COMPUTE_CAPABILITIES)} compute capabilities (default order "
                     f"{len(DEFAULT_ORDER)} backends)")
