"""The configuration gates of pipelined transfer (research note section 1.2; invariant S10).

`resolve_pipelined_transfer` follows `KvCacheTransceiverV2._resolve_pipelined_transfer` and
`PyExecutor._validate_request` as the note paraphrases them: with
`enable_pipelined_transfer`, an unset `transceiver_runtime` auto-selects `"PYTHON"`, an explicit `"CPP"` is
a ValueError; the backend must be NIXL; chunked prefill is required; the sender needs
`pipeline_parallel_size == 1` (a generation worker, `TRTLLM_DISAGG_ROLE=generation`, may use PP > 1); the
Python bounce buffer, a Mamba/hybrid cache manager, context parallelism and a KV-cache-manager-V2 reuse policy
other than `ALL_REUSABLE` are refused; per request beam width 1 and `GENERATION_FIRST`.
"""

from __future__ import annotations

from dataclasses import dataclass

MAMBA_MANAGERS = ("MambaHybridCacheManager", "MambaHybridCacheManagerV2")


@dataclass(frozen=True)
class TransceiverSetup:
    enable_pipelined_transfer: bool = True
    transceiver_runtime: str | None = None  # None, "PYTHON" or "CPP"
    backend: str = "NIXL"
    enable_chunked_prefill: bool = True
    pipeline_parallel_size: int = 1
    role: str = "context"  # TRTLLM_DISAGG_ROLE: "context" or "generation"
    kv_cache_bounce_size_mb: int = 0
    agent_bounce_buffer_enable: bool = False
    cache_manager: str = "KVCacheManager"
    cp_size: int = 1
    kv_cache_manager_v2: bool = False
    block_reuse_policy: str = "ALL_REUSABLE"


@dataclass(frozen=True)
class Resolution:
    runtime: str | None  # the transceiver runtime in use ("PYTHON" when pipelining is on)
    refusals: tuple[str, ...]  # why the configuration is refused (empty: accepted)


def resolve_pipelined_transfer(setup: TransceiverSetup) -> Resolution:
    if not setup.enable_pipelined_transfer:
        return Resolution(setup.transceiver_runtime, ())
    reasons = []
    runtime = setup.transceiver_runtime or "PYTHON"
    if runtime == "CPP":
        reasons.append("transceiver_runtime CPP with pipelined transfer (ValueError)")
    if setup.backend != "NIXL":
        reasons.append(f"backend {setup.backend}: the Python transceiver supports only NIXL")
    if not setup.enable_chunked_prefill:
        reasons.append("enable_chunked_prefill is required")
    if setup.pipeline_parallel_size != 1 and setup.role != "generation":
        reasons.append(f"pipeline_parallel_size {setup.pipeline_parallel_size} on a sender")
    if setup.kv_cache_bounce_size_mb != 0 and not setup.agent_bounce_buffer_enable:
        reasons.append("the Python bounce buffer reserves one receiver region per request, not per chunk")
    if setup.cache_manager in MAMBA_MANAGERS:
        reasons.append(f"{setup.cache_manager}: recurrent state cannot be snapshotted per chunk")
    if setup.cp_size > 1:
        reasons.append(f"context parallelism cp_size {setup.cp_size}")
    if setup.kv_cache_manager_v2 and setup.block_reuse_policy != "ALL_REUSABLE":
        reasons.append(f"block_reuse_policy {setup.block_reuse_policy}: committing the whole prompt at the final "
                       f"chunk may re-base a prefix block an earlier chunk's read still uses")
    return Resolution(runtime, tuple(reasons))


def validate_request(beam_width: int, schedule_style: str | None) -> str | None:
    """`_validate_request` under pipelining: the reason a request is rejected, or None.

    `schedule_style` None: a request without disaggregated params, which passes."""
    if beam_width != 1:
        return f"beam width {beam_width}: the chunk builder asserts 1"
    if schedule_style is not None and schedule_style != "GENERATION_FIRST":
        return f"schedule_style {schedule_style}: the sender needs the receiver's block ids before chunk 0"
    return None
