"""Hypothesis strategies of the pipelined-transfer properties (imported only when a property runs)."""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.models.pipelined_transfer.chunks import cdiv
from kvsim.models.pipelined_transfer.gates import TransceiverSetup
from kvsim.models.pipelined_transfer.sim import SimConfig

from .cases import ChunkCase, GroupSpec
from .timing import MaxPlusCase, WorkloadCase


@st.composite
def chunk_cases(draw: st.DrawFn) -> ChunkCase:
    tpb = draw(st.integers(1, 8))
    prompt = draw(st.integers(1, 64))
    total = cdiv(prompt, tpb)
    prefix = draw(st.integers(0, prompt - 1))
    cuts = sorted(draw(st.sets(st.integers(prefix + 1, prompt - 1), max_size=5)) if prompt - 1 > prefix else ())
    bounds = [prefix, *cuts, prompt]
    chunks = tuple(zip(bounds, bounds[1:]))
    boundary = draw(st.sampled_from(("A", "B")))
    prefix_sent = boundary == "B" and draw(st.booleans())
    rx_cached = draw(st.integers(0, total - 1))
    groups = [GroupSpec(total, total, draw(st.one_of(st.none(), st.integers(1, prompt + 4))))]
    for _ in range(draw(st.integers(0, 2))):
        end = draw(st.integers(0, total))
        held = draw(st.integers(0, end))
        window = draw(st.one_of(st.none(), st.integers(1, prompt + 4)))
        groups.append(GroupSpec(held, end, window))
    return ChunkCase(prompt, tpb, chunks, prefix, boundary, prefix_sent, rx_cached, tuple(groups))


@st.composite
def projections(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    """(held, resident_block_end, chunk_block_offset, chunk_block_count, total_blocks)."""
    total = draw(st.integers(0, 24))
    end = draw(st.integers(0, total))
    held = draw(st.integers(0, end + 2))  # may exceed the range: upstream clamps the resident start at 0
    offset = draw(st.integers(0, total + 2))
    count = draw(st.integers(-1, total + 2))
    return held, end, offset, count, total


CHUNK_CASES = chunk_cases()
PROJECTIONS = projections()


@st.composite
def max_plus_cases(draw: st.DrawFn) -> MaxPlusCase:
    n = draw(st.integers(1, 8))
    times = st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False)
    return MaxPlusCase(tuple(draw(times) for _ in range(n)), tuple(draw(times) for _ in range(n)), draw(times))


@st.composite
def workloads(draw: st.DrawFn) -> WorkloadCase:
    tpb = draw(st.sampled_from((1, 4, 16, 64)))
    prompt = draw(st.integers(1, 64 * tpb))  # at most 64 blocks: the cost of a write is linear in its blocks
    chunk = draw(st.integers(max(1, prompt // 12), prompt))
    prefix = draw(st.integers(0, min(prompt - 1, 1024)))
    boundary = draw(st.sampled_from(("A", "B")))
    params = SimConfig(
        requests=draw(st.integers(1, 3)), arrival_rate=0.01, prompt_len=prompt, chunk_tokens=chunk,
        tokens_per_block=tpb, prefix_hit=prefix, rx_cached_blocks=draw(st.integers(0, (prompt - 1) // tpb)),
        boundary=boundary, swa_window=draw(st.sampled_from((0, 0, 1, tpb * 3, prompt))),
        ranks=draw(st.integers(1, 4)), bandwidth_gbs=draw(st.floats(0.5, 200.0)),
        latency_us=draw(st.floats(0.0, 200.0)), handoff_us=draw(st.floats(0.0, 500.0)),
        aux_us=draw(st.floats(0.0, 100.0)), notify_us=draw(st.floats(0.0, 100.0)),
        compute_us_per_token=draw(st.floats(0.001, 5.0)), context_slowdown=draw(st.floats(0.0, 2.0)),
        jitter=draw(st.floats(0.0, 0.5)))
    return WorkloadCase(params, draw(st.integers(0, 2 ** 16)))


MAX_PLUS = max_plus_cases()
WORKLOADS = workloads()


@st.composite
def setups(draw: st.DrawFn) -> TransceiverSetup:
    return TransceiverSetup(
        transceiver_runtime=draw(st.sampled_from((None, "PYTHON", "CPP"))),
        backend=draw(st.sampled_from(("NIXL", "UCX", "MOONCAKE"))), enable_chunked_prefill=draw(st.booleans()),
        pipeline_parallel_size=draw(st.integers(1, 4)), role=draw(st.sampled_from(("context", "generation"))),
        kv_cache_bounce_size_mb=draw(st.sampled_from((0, 64))), agent_bounce_buffer_enable=draw(st.booleans()),
        cache_manager=draw(st.sampled_from(("KVCacheManager", "MambaHybridCacheManager",
                                            "MambaHybridCacheManagerV2"))),
        cp_size=draw(st.integers(1, 4)), kv_cache_manager_v2=draw(st.booleans()),
        block_reuse_policy=draw(st.sampled_from(("ALL_REUSABLE", "LAST_CHUNK", "NONE"))))


SETUPS = setups()
