"""S10: a run with pipelining enabled never has beam > 1, context-first scheduling, a Mamba/hybrid manager,
CP > 1, sender PP > 1, the Python bounce buffer or a non-ALL_REUSABLE reuse policy (research note 1.2, 1.9)."""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pipelined_transfer.gates import (MAMBA_MANAGERS, TransceiverSetup, resolve_pipelined_transfer,
                                                   validate_request)
from kvsim.models.pipelined_transfer.variants import PipelinedVariant

MODEL = "pipelined-transfer"
PINNED = (TransceiverSetup(), TransceiverSetup(pipeline_parallel_size=2, role="generation"),
          TransceiverSetup(pipeline_parallel_size=2), TransceiverSetup(transceiver_runtime="CPP"),
          TransceiverSetup(kv_cache_bounce_size_mb=64, agent_bounce_buffer_enable=True),
          TransceiverSetup(kv_cache_manager_v2=True, block_reuse_policy="LAST_CHUNK"))


def refused_features(s: TransceiverSetup) -> list[str]:
    """The section 1.2 list, restated feature by feature."""
    found = []
    if s.transceiver_runtime == "CPP":
        found.append("CPP runtime")
    if s.backend != "NIXL":
        found.append("not NIXL")
    if not s.enable_chunked_prefill:
        found.append("no chunked prefill")
    if s.role == "context" and s.pipeline_parallel_size > 1:
        found.append("sender PP > 1")
    if s.kv_cache_bounce_size_mb and not s.agent_bounce_buffer_enable:
        found.append("Python bounce buffer")
    if s.cache_manager in MAMBA_MANAGERS:
        found.append("Mamba/hybrid")
    if s.cp_size > 1:
        found.append("CP > 1")
    if s.kv_cache_manager_v2 and s.block_reuse_policy != "ALL_REUSABLE":
        found.append("non-ALL_REUSABLE reuse policy")
    return found


@kv_property(model=MODEL, strategy="SETUPS", examples=PINNED)
def gates_refuse_unsupported_setups(case: TransceiverSetup, variant: PipelinedVariant) -> None:
    """S10: `_resolve_pipelined_transfer` accepts a setup exactly when it has none of the refused features, and
    selects the Python runtime; a request needs beam 1 and generation-first scheduling."""
    res = resolve_pipelined_transfer(case)
    features = refused_features(case)
    if bool(res.refusals) != bool(features) or len(res.refusals) != len(features):
        raise PropertyViolation(f"refusals of {case}: expected {len(features)} ({features}), got "
                                f"{list(res.refusals)}")
    if not features and res.runtime != "PYTHON":
        raise PropertyViolation(f"runtime of an accepted setup: expected PYTHON, got {res.runtime}")
    for beam, style, ok in ((1, "GENERATION_FIRST", True), (1, None, True), (2, "GENERATION_FIRST", False),
                            (1, "CONTEXT_FIRST", False)):
        if (validate_request(beam, style) is None) != ok:
            raise PropertyViolation(f"request with beam {beam}, schedule_style {style}: expected "
                                    f"{'accepted' if ok else 'rejected'}")
