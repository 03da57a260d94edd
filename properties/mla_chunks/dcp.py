"""DCP properties of `mla-chunks` (research note vllm.md 1.4, invariants 11 and 12).

Coverage is checked on the rank model alone (which global rows each rank's local rows
stand for); the reorg is checked by running the variant's `reorg_kvcache` on all-gathered
rank buffers whose rows are labelled `request, rank, local index`, as the upstream test
`test_dcp_reorg_uses_each_chunks_local_starts` does.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.mla_chunks.dcp import DcpConfig, dcp_global_position
from kvsim.models.mla_chunks.metadata import UniformChunkedContextMetadata
from kvsim.models.mla_chunks.planner import FIXED, MlaVariant
from kvsim.models.mla_chunks.prefill import reorg_chunk_rows

from .cases import DCP_EXAMPLES, DCP_SOMETIMES, MlaChunkCase

MODEL = "mla-chunks"
# Labels: request * R + rank * K + local index (upstream uses 100000 and 10000).
_REQUEST, _RANK = 10 ** 9, 10 ** 6


def _ranges(rows) -> str:
    """Compact text for a sorted list of integers: `[a, b) ...`."""
    out, rows = [], sorted(rows)
    i = 0
    while i < len(rows) and len(out) < 4:
        j = i
        while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
            j += 1
        out.append(f"[{rows[i]}, {rows[j] + 1})")
        i = j + 1
    return " ".join(out) + (" ..." if i < len(rows) else "") if out else "none"


def _local_take(local_ctx: int, local_start: int, padded: int) -> int:
    return min(max(0, local_ctx - local_start), padded)


def check_dcp_coverage(chunks, dcp: DcpConfig) -> None:
    """For each chunk piece, the ranks' kept local rows map back to exactly the global rows `[start, start+len)`."""
    for chunk in chunks:
        i = chunk.index
        for k, r in enumerate(range(chunk.request_slice.start, chunk.request_slice.stop)):
            start, length = chunk.starts[k], chunk.seq_lens[k]
            ls, padded = chunk.local_starts[k], chunk.padded_local_seq_lens[k]
            got = Counter(dcp_global_position(rank, j, dcp)
                          for rank, local_ctx in enumerate(chunk.local_context_lens_allranks[k])
                          for j in range(ls, ls + _local_take(local_ctx, ls, padded)))
            want = Counter(range(start, start + length))
            if got != want:
                extra, missing = got - want, want - got
                twice = [p for p, n in got.items() if n > 1]
                raise PropertyViolation(
                    f"global rows the ranks gather for request {r} in chunk {i}: expected [{start}, {start + length}) "
                    f"({length} rows), got {sum(got.values())}: beyond the span {_ranges(extra)}, missing "
                    f"{_ranges(missing)}, twice {_ranges(twice)}")
        want_local = [dcp.padded_rows(s) for s in chunk.starts]
        if list(chunk.local_starts) != want_local:
            raise PropertyViolation(f"local_starts of chunk {i}: expected padded_rows(starts) = {want_local}, "
                                    f"got {list(chunk.local_starts)}")


def rank_buffers(chunk, dcp: DcpConfig) -> np.ndarray:
    """All-gathered labelled rows: rank `r`'s padded local rows of every request of the chunk at `r * toks`."""
    ranks = []
    for rank in range(dcp.world_size):
        labels = [r * _REQUEST + rank * _RANK + j
                  for k, r in enumerate(range(chunk.request_slice.start, chunk.request_slice.stop))
                  for j in range(chunk.local_starts[k], chunk.local_starts[k] + chunk.padded_local_seq_lens[k])]
        ranks.append(np.asarray(labels, dtype=np.int64).reshape(-1, 1))
    return np.concatenate(ranks, axis=0)


def _local_rows_in_span(rank: int, first: int, end: int, start: int, stop: int, dcp: DcpConfig) -> list[int]:
    """The local indices in `[first, end)` of rank `rank` whose global position lies in `[start, stop)`, in order.

    A rank's global position grows with its local index, so the walk stops at the first past `stop`.
    """
    rows = []
    for j in range(first, end):
        position = dcp_global_position(rank, j, dcp)
        if position >= stop:
            break
        if position >= start:
            rows.append(j)
    return rows


def check_dcp_reorg(chunks, dcp: DcpConfig, local_chunk_size: int | None, variant: MlaVariant = FIXED) -> None:
    """The reorg keeps `cu_seq_lens[-1]` rows; request `k` gets `seq_lens[k]` rows, rank-major, exactly its span."""
    for chunk in chunks:
        i = chunk.index
        out = reorg_chunk_rows(chunk, rank_buffers(chunk, dcp), local_chunk_size, strict=False, variant=variant)[:, 0]
        total = chunk.cu_seq_lens[-1]
        if out.shape[0] != total:
            raise PropertyViolation(f"rows after reorg_kvcache of chunk {i}: expected {total} (cu_seq_lens[-1]), "
                                    f"got {out.shape[0]}")
        for k, r in enumerate(range(chunk.request_slice.start, chunk.request_slice.stop)):
            start, length, ls = chunk.starts[k], chunk.seq_lens[k], chunk.local_starts[k]
            # Rank-major: each rank's local rows of the span, in local order.
            want = [r * _REQUEST + rank * _RANK + j
                    for rank, local_ctx in enumerate(chunk.local_context_lens_allranks[k])
                    for j in _local_rows_in_span(rank, ls, local_ctx, start, start + length, dcp)]
            got = out[chunk.cu_seq_lens[k]:chunk.cu_seq_lens[k + 1]].tolist()
            if got != want:
                decoded = sorted(dcp_global_position((x % _REQUEST) // _RANK, x % _RANK, dcp) for x in got
                                 if x // _REQUEST == r)
                raise PropertyViolation(
                    f"rows of request {r} after reorg_kvcache of chunk {i}: expected the {length} rows of "
                    f"[{start}, {start + length}) rank-major, got {len(got)} rows covering {_ranges(decoded)}")


@kv_property(model=MODEL, strategy="DCP_CASES", examples=DCP_EXAMPLES, sometimes=DCP_SOMETIMES)
def dcp_ranks_cover_each_span_exactly(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Under DCP the ranks' local rows of every chunk piece map back to exactly its global rows, once each."""
    md = case.metadata(variant)
    if md is not None and case.dcp is not None:
        check_dcp_coverage(md.chunks, case.dcp)


@kv_property(model=MODEL, strategy="DCP_CASES", examples=DCP_EXAMPLES, sometimes=DCP_SOMETIMES)
def dcp_reorg_matches_chunk_spans(case: MlaChunkCase, variant: MlaVariant) -> None:
    """reorg_kvcache of every chunk yields cu_seq_lens[-1] rows and each request's span, rank-major, no padding."""
    md = case.metadata(variant)
    if md is not None and case.dcp is not None:
        local = md.local_chunk_size if isinstance(md, UniformChunkedContextMetadata) else None
        check_dcp_reorg(md.chunks, case.dcp, local, variant)
