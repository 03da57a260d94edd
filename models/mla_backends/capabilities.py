"""The declarative capability matrix of the batch MLA backends and the plan-time support check.

FlashInfer 0.7.4, `mla/_batch_mla/_backends/_capabilities.py` (`MLAPlanCapabilities`,
`structural_eligibility_rejection_reason`, `plan_capability_rejection_reason`) and each backend's
`_plan_capabilities`. The release differs from the research note's PR head (34525d1): trtllm-gen
also returns a natural-log LSE, cute-dsl-monolithic also base 2, xqa takes only the combined KV
layout, and two more backends exist (`cute-dsl-rubin-mtp`, a copy of monolithic's matrix, and
the experimental `cutile`). `conform flashinfer --target capabilities` reads the matrix from the
release and compares it with `CAPABILITIES`.

A rejection is a `Rejection(kind, backend, message)`: `kind` names the rule (one of
`REJECTION_KINDS`), so a caller can tell the structural pre-filter from a contract mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

LSE_MODES = ("none", "base2", "basee")
KV_LAYOUTS = ("combined", "adjacent-split", "independent-split")
OUTPUT_SCALES = ("none", "per-tensor")
SCALE_MODES = ("default", "kv-per-tensor", "bmm-scalar", "bmm-tensor")
REJECTION_KINDS = ("packed_query", "packed_kv_cache", "lse", "skip_softmax_with_lse", "kv_layout", "output_scale",
                   "scale_mode", "skip_softmax", "enable_pdl", "sinks")


@dataclass(frozen=True)
class MLAPlanCapabilities:
    backend_name: str
    lse_modes: frozenset[str]
    kv_layouts: frozenset[str]
    output_scales: frozenset[str]
    scale_modes: frozenset[str]
    is_experimental: bool = False
    supports_skip_softmax: bool = False
    supports_skip_softmax_with_lse: bool = False
    supports_enable_pdl: bool = False
    supports_sinks: bool = False
    supports_cuda_graph_replan: bool = False
    requires_packed_query: bool = False
    requires_packed_kv_cache: bool = False


def _caps(name: str, lse: str, kv: str, out: str, scale: str, **flags: bool) -> MLAPlanCapabilities:
    return MLAPlanCapabilities(name, frozenset(lse.split()), frozenset(kv.split()), frozenset(out.split()),
                               frozenset(scale.split()), **flags)


_PACKED = dict(requires_packed_query=True, requires_packed_kv_cache=True)
_MONOLITHIC = _caps("cute-dsl-monolithic", "none basee base2", "combined adjacent-split", "none",
                    "default bmm-scalar", **_PACKED)
# The matrix of FlashInfer 0.7.4, keyed by the wrapper's backend name (`_BACKEND_TYPES`).
CAPABILITIES: dict[str, MLAPlanCapabilities] = {
    "fa2": _caps("fa2", "none base2 basee", "combined adjacent-split independent-split", "none",
                 "default kv-per-tensor", supports_cuda_graph_replan=True),
    "fa3": _caps("fa3", "none base2 basee", "combined adjacent-split independent-split", "none",
                 "default kv-per-tensor", supports_cuda_graph_replan=True),
    "cutlass": _caps("cutlass", "none", "combined adjacent-split", "none per-tensor", "default", **_PACKED),
    "cutile": _caps("cutile", "none", "combined independent-split", "none", "default", is_experimental=True),
    "trtllm-gen": _caps("trtllm-gen", "none base2 basee", "combined adjacent-split", "none",
                        "default bmm-scalar bmm-tensor", supports_skip_softmax=True, supports_enable_pdl=True,
                        supports_sinks=True, **_PACKED),
    "xqa": _caps("XQA", "none", "combined", "none", "default bmm-scalar", supports_enable_pdl=True, **_PACKED),
    "cute-dsl-monolithic": _MONOLITHIC,
    "cute-dsl-modular": _caps("cute-dsl-modular", "none", "combined adjacent-split", "none", "default bmm-scalar",
                              **_PACKED),
    "cute-dsl-rubin-mtp": replace(_MONOLITHIC, backend_name="cute-dsl-rubin-mtp"),
}
BACKENDS = tuple(CAPABILITIES)
CUTE_DSL_FAMILY = ("cute-dsl-monolithic", "cute-dsl-modular", "cute-dsl-rubin-mtp")


@dataclass(frozen=True)
class PlanContract:
    """The facts of `_MLAPlanArguments` the capability check reads (the wrapper's declared run contract)."""

    query_layout: str = "packed"  # packed | split
    kv_cache_layout: str = "packed"
    query_kind: str | None = "packed"  # packed | adjacent-split | independent-split | dual | None
    kv_kind: str | None = "packed"
    lse_mode: str = "none"
    kv_layout: str = "combined"
    output_scale: str = "none"
    scale_mode: str = "default"
    skip_softmax: bool = False
    enable_pdl: bool | None = None
    use_sinks: bool = False


class Rejection(NamedTuple):
    kind: str  # one of REJECTION_KINDS
    backend: str
    message: str


def structural_rejection(args: PlanContract, caps: MLAPlanCapabilities) -> Rejection | None:
    """The structural pre-filter: a packed-only backend cannot take an independent split (or a split layout)."""
    if caps.requires_packed_query and (args.query_kind == "independent-split" or args.query_layout == "split"):
        return Rejection("packed_query", caps.backend_name, f"{caps.backend_name} needs a packed query; "
                         "the declared query is split")
    if caps.requires_packed_kv_cache and (args.kv_kind == "independent-split" or args.kv_cache_layout == "split"):
        return Rejection("packed_kv_cache", caps.backend_name, f"{caps.backend_name} needs a packed KV cache; "
                         "the declared KV cache is split")
    return None


def capability_rejection(args: PlanContract, caps: MLAPlanCapabilities) -> Rejection | None:
    """Why `caps` cannot serve the declared contract (the first rule broken), or None."""
    found = structural_rejection(args, caps)
    if found is not None:
        return found
    name = caps.backend_name
    checks = (
        ("lse", args.lse_mode not in caps.lse_modes, f"LSE mode {args.lse_mode}"),
        ("skip_softmax_with_lse", args.skip_softmax and args.lse_mode != "none"
         and not caps.supports_skip_softmax_with_lse, "skip-softmax together with an LSE"),
        ("kv_layout", args.kv_layout not in caps.kv_layouts, f"KV layout {args.kv_layout}"),
        ("output_scale", args.output_scale not in caps.output_scales, f"output scale {args.output_scale}"),
        ("scale_mode", args.scale_mode not in caps.scale_modes, f"scale mode {args.scale_mode}"),
        ("skip_softmax", args.skip_softmax and not caps.supports_skip_softmax, "skip-softmax"),
        ("enable_pdl", args.enable_pdl is True and not caps.supports_enable_pdl, "enable_pdl=True"),
        ("sinks", args.use_sinks and not caps.supports_sinks, "attention sinks"),
    )
    for kind, broken, what in checks:
        if broken:
            return Rejection(kind, name, f"{name} does not support {what}")
    return None


def lse_capable(backend: str) -> tuple[str, ...]:
    """The LSE modes a backend can return: what a chunked merge needs from it."""
    return tuple(m for m in LSE_MODES if m != "none" and m in CAPABILITIES[backend].lse_modes)
