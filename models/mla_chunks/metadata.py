"""MLA chunked-context metadata: per-request `ContextChunk`s (b38e111d) and the old uniform chunks.

Follows vLLM commit b38e111d (PR #50613): `build_mla_chunked_context_metadata`,
`MLACommonPrefillMetadata.ContextChunk`, `ChunkedContextMetadata` and the accumulation of
`_compute_prefill_context` (`init_mla_context_partial`, `accumulate_mla_context_chunk`);
for the pre-fix variants, the 2-D per-chunk tensors of the uniform plan and
`prefill_tokens_with_context`. Research note `vllm.md` sections 1.2-1.3.

Both chunk types expose the same core fields (`request_slice`, `token_slice`,
`query_start_loc`, `starts`, `seq_lens`, `cu_seq_lens`, `token_to_seq`,
`num_context_tokens`, `max_seq_len`, and under DCP `local_starts`,
`padded_local_seq_lens`, `num_local_context_tokens`, `local_context_lens_allranks`) so
the properties and the numeric path read either. `starts` is always global here; upstream's
`starts` tensor carries the local starts under DCP, which this model keeps in `local_starts`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from itertools import accumulate
from typing import Callable, Sequence

from kvsim.engine.errors import ConfigError, check_int

from .planner import (FIXED, MlaVariant, check_counts, chunked_context_workspace_size, mla_chunk_alignment,
                      plan_mla_context_chunks, plan_uniform_context_chunks, round_down)
from .dcp import DcpConfig, get_dcp_local_seq_lens


def _cumsum0(values: Sequence[int]) -> tuple[int, ...]:
    return (0, *accumulate(values))


def _repeat_index(lens: Sequence[int]) -> tuple[int, ...]:
    """`k` repeated `lens[k]` times, for each `k` in order (a chunk's `token_to_seq`)."""
    index: list[int] = []
    for k, n in enumerate(lens):
        index += (k,) * n
    return tuple(index)


def query_start_loc_of(query_lens: Sequence[int]) -> tuple[int, ...]:
    """Prefix sums of the prefill query lengths (`qsl`), starting at 0; each query has >= 1 token."""
    lens = check_counts(query_lens, "query_lens")
    for i, q in enumerate(lens):
        check_int(q, f"query_lens[{i}]", minimum=1)
    return _cumsum0(lens)


def _check_qsl(query_start_loc: Sequence[int], n: int) -> tuple[int, ...]:
    qsl = check_counts(query_start_loc, "query_start_loc")
    if len(qsl) != n + 1 or qsl[0] != 0 or any(b < a for a, b in zip(qsl, qsl[1:])):
        raise ConfigError("query_start_loc", f"{n + 1} non-decreasing entries starting at 0", qsl)
    return qsl


@dataclass(frozen=True)
class ContextChunk:
    """`MLACommonPrefillMetadata.ContextChunk`: one chunk of the per-request plan."""

    index: int
    request_slice: slice
    token_slice: slice
    continuation_token_end: int  # qsl[request_start + 1]: end of the first request's query tokens
    is_continuation: bool
    num_context_tokens: int
    query_start_loc: tuple[int, ...]  # rebased so the chunk's first token is 0
    max_query_len: int
    cu_seq_lens: tuple[int, ...]
    starts: tuple[int, ...]  # global
    seq_lens: tuple[int, ...]
    max_seq_len: int
    token_to_seq: tuple[int, ...]
    all_rows_active: bool  # every query of the chunk has a token and every span a row (no masking needed)
    # DCP only
    local_starts: tuple[int, ...] | None = None
    padded_local_seq_lens: tuple[int, ...] | None = None
    padded_local_cu_seq_lens: tuple[int, ...] | None = None
    padded_local_token_to_seq: tuple[int, ...] | None = None
    num_local_context_tokens: int | None = None
    local_context_lens_allranks: tuple[tuple[int, ...], ...] | None = None


_CHUNK_DEFAULTS = {f.name: f.default for f in fields(ContextChunk) if f.default is not MISSING}


def _context_chunk(**values) -> ContextChunk:
    """`ContextChunk(**values)`, built the way the builder's loop can afford (hundreds of chunks a batch): the
    frozen `__init__` guards each of its 20 fields with `object.__setattr__`; this fills the instance's
    `__dict__` at once, the unset fields at their defaults. The record is the same (equal, same repr)."""
    chunk = object.__new__(ContextChunk)
    chunk.__dict__.update(_CHUNK_DEFAULTS, **values)
    return chunk


@dataclass(frozen=True)
class ChunkedContextMetadata:
    """`ChunkedContextMetadata` of the per-request plan (workspace given by its size)."""

    context_lens: tuple[int, ...]
    query_start_loc: tuple[int, ...]
    workspace_size: int
    split_alignment: int
    chunks: tuple[ContextChunk, ...]
    empty_token_slices: tuple[slice, ...]
    dcp: DcpConfig | None = None

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]


def _dcp_fields(allranks: tuple[tuple[int, ...], ...], local_starts: Sequence[int],
                padded_lens: Sequence[int]) -> dict:
    """The DCP fields of a chunk; `allranks`: `get_dcp_local_seq_lens` of each of its requests (the builder computes
    them once a batch, not once a chunk: a split request is in many chunks)."""
    padded_cu = _cumsum0(padded_lens)
    return dict(local_starts=tuple(local_starts), padded_local_seq_lens=tuple(padded_lens),
                padded_local_cu_seq_lens=padded_cu, padded_local_token_to_seq=_repeat_index(padded_lens),
                num_local_context_tokens=padded_cu[-1], local_context_lens_allranks=allranks)


def chunk_plan_arguments(workspace_size: int, block_size: int, dcp: DcpConfig | None,
                         align_chunk_to_block: bool) -> tuple[int, int, int, Callable[[int], int] | None]:
    """(split alignment, row budget, max_context_chunk, padded_rows) the builder hands `plan_mla_context_chunks`.

    Without block alignment the splits still align to the DCP interleave under DCP (lcm(1, world*interleave)).
    """
    split_block = block_size if align_chunk_to_block else 1
    if dcp is not None:
        alignment, budget, pad = mla_chunk_alignment(split_block, dcp), workspace_size // dcp.world_size, \
            dcp.padded_rows
    else:
        alignment, budget, pad = split_block, workspace_size, None
    return alignment, budget, round_down(workspace_size, alignment), pad


def build_mla_chunked_context_metadata(context_lens: Sequence[int], query_start_loc: Sequence[int],
                                       workspace_size: int, block_size: int, *, dcp: DcpConfig | None = None,
                                       align_chunk_to_block: bool = True) -> ChunkedContextMetadata | None:
    """Plan the context chunks and lay out each chunk's metadata; None when no prefill has context.

    Parameters as in the note's table: without DCP the split alignment is `block_size`
    (1 if `align_chunk_to_block` is false) and the row budget is `W`; under DCP the
    alignment is `lcm(block, world*interleave)`, the budget `W // world` local rows (the metadata
    builder's constructor asserts `W % world == 0`; the function itself floors) and the cost of rows
    `[0, r)` is `padded_rows(r)`. `max_context_chunk = round_down(W, alignment)`.
    """
    ctx = check_counts(context_lens, "context_lens")
    qsl = _check_qsl(query_start_loc, len(ctx))
    check_int(workspace_size, "workspace_size", minimum=1)
    check_int(block_size, "block_size", minimum=1)
    if not ctx or max(ctx) <= 0:
        return None
    alignment, budget, max_context_chunk, pad = chunk_plan_arguments(workspace_size, block_size, dcp,
                                                                      align_chunk_to_block)
    if max_context_chunk <= 0:
        raise ConfigError("workspace_size", f">= split alignment {alignment}", workspace_size)

    query_lens_of = [b - a for a, b in zip(qsl, qsl[1:])]
    allranks = None if dcp is None else tuple(get_dcp_local_seq_lens(c, dcp) for c in ctx)
    chunks = []
    for index, plan in enumerate(plan_mla_context_chunks(ctx, budget, max_context_chunk, alignment, pad)):
        rs, re, starts, seq_lens = plan.request_start, plan.request_end, plan.starts, plan.seq_lens
        extra = {}
        if dcp is not None:
            local_starts = [dcp.padded_rows(s) for s in starts]  # exact: starts are virtual-aligned
            padded = [dcp.padded_rows(s + n) - ls for s, n, ls in zip(starts, seq_lens, local_starts)]
            extra = _dcp_fields(allranks[rs:re], local_starts, padded)
        if re - rs == 1:  # one request (every chunk of a split request): the same fields, each written at once
            rows, query_len = seq_lens[0], query_lens_of[rs]
            cu_seq_lens, query_start_loc, token_to_seq = (0, rows), (0, query_len), (0,) * rows
            max_query_len, max_seq_len, all_rows_active = query_len, rows, query_len > 0 and rows > 0
        else:
            query_lens, q0 = query_lens_of[rs:re], qsl[rs]
            cu_seq_lens, query_start_loc = _cumsum0(seq_lens), tuple(q - q0 for q in qsl[rs:re + 1])
            token_to_seq, max_query_len, max_seq_len = _repeat_index(seq_lens), max(query_lens), max(seq_lens)
            all_rows_active = min(query_lens) > 0 and min(seq_lens) > 0
        chunks.append(_context_chunk(
            index=index, request_slice=slice(rs, re), token_slice=slice(qsl[rs], qsl[re]),
            continuation_token_end=qsl[rs + 1], is_continuation=plan.is_continuation,
            num_context_tokens=cu_seq_lens[-1], query_start_loc=query_start_loc, max_query_len=max_query_len,
            cu_seq_lens=cu_seq_lens, starts=starts, seq_lens=seq_lens, max_seq_len=max_seq_len,
            token_to_seq=token_to_seq, all_rows_active=all_rows_active, **extra))
    empty = tuple(slice(qsl[i], qsl[i + 1]) for i, c in enumerate(ctx) if c == 0)
    return ChunkedContextMetadata(context_lens=ctx, query_start_loc=qsl, workspace_size=workspace_size,
                                  split_alignment=alignment, chunks=tuple(chunks), empty_token_slices=empty, dcp=dcp)


@dataclass(frozen=True)
class UniformContextChunk:
    """One column of the pre-b38e111d plan: every prefill, global rows `[i*mcc, (i+1)*mcc)`."""

    index: int
    request_slice: slice
    token_slice: slice
    query_start_loc: tuple[int, ...]
    max_query_len: int
    starts: tuple[int, ...]
    seq_lens: tuple[int, ...]
    cu_seq_lens: tuple[int, ...]
    token_to_seq: tuple[int, ...]
    num_context_tokens: int  # seq_tot[i]
    max_seq_len: int
    has_empty_context: bool
    # DCP only: local chunk i covers local rows [i*P, min(padded_local_ctx, (i+1)*P))
    local_starts: tuple[int, ...] | None = None
    padded_local_seq_lens: tuple[int, ...] | None = None
    padded_local_cu_seq_lens: tuple[int, ...] | None = None
    padded_local_token_to_seq: tuple[int, ...] | None = None
    num_local_context_tokens: int | None = None  # toks
    local_context_lens_allranks: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class UniformChunkedContextMetadata:
    context_lens: tuple[int, ...]
    query_start_loc: tuple[int, ...]
    workspace_size: int
    max_context_chunk: int
    local_chunk_size: int | None
    chunks: tuple[UniformContextChunk, ...]
    prefill_tokens_with_context: int  # qsl[n_ctx]: assumes context-ful prefills come first
    dcp: DcpConfig | None = None

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]


def build_uniform_chunked_context_metadata(context_lens: Sequence[int], query_start_loc: Sequence[int],
                                           workspace_size: int, block_size: int, *, dcp: DcpConfig | None = None,
                                           align_chunk_to_block: bool = True) -> UniformChunkedContextMetadata | None:
    """The pre-b38e111d metadata: one column per chunk, all prefills in every chunk."""
    ctx = check_counts(context_lens, "context_lens")
    qsl = _check_qsl(query_start_loc, len(ctx))
    plan = plan_uniform_context_chunks(ctx, workspace_size, block_size, dcp, align_chunk_to_block=align_chunk_to_block)
    if plan is None:
        return None
    n = len(ctx)
    max_query_len = max(b - a for a, b in zip(qsl, qsl[1:]))
    allranks = None if dcp is None else tuple(get_dcp_local_seq_lens(c, dcp) for c in ctx)
    chunks = []
    for i in range(plan.num_chunks):
        lens = plan.seq_lens[i]
        cu_seq_lens = _cumsum0(lens)
        extra = {}
        if dcp is not None:
            p = plan.local_chunk_size
            padded = [max(0, min(dcp.padded_rows(c), (i + 1) * p) - i * p) for c in ctx]
            extra = _dcp_fields(allranks, [i * p] * n, padded)
        chunks.append(UniformContextChunk(
            index=i, request_slice=slice(0, n), token_slice=slice(0, qsl[n]), query_start_loc=qsl,
            max_query_len=max_query_len, starts=(plan.chunk_start(i),) * n,
            seq_lens=lens, cu_seq_lens=cu_seq_lens, token_to_seq=_repeat_index(lens),
            num_context_tokens=cu_seq_lens[-1], max_seq_len=max(lens), has_empty_context=0 in lens, **extra))
    n_ctx = sum(1 for c in ctx if c > 0)
    return UniformChunkedContextMetadata(context_lens=ctx, query_start_loc=qsl, workspace_size=workspace_size,
                                         max_context_chunk=plan.max_context_chunk,
                                         local_chunk_size=plan.local_chunk_size, chunks=tuple(chunks),
                                         prefill_tokens_with_context=qsl[n_ctx], dcp=dcp)


ContextMetadata = ChunkedContextMetadata | UniformChunkedContextMetadata


def build_context_metadata(context_lens: Sequence[int], query_lens: Sequence[int], workspace_size: int,
                           max_num_seqs: int, block_size: int, *, dcp: DcpConfig | None = None,
                           align_chunk_to_block: bool = True, variant: MlaVariant = FIXED) -> ContextMetadata | None:
    """The metadata a variant builds from the requested workspace size and the batch."""
    qsl = query_start_loc_of(query_lens)
    rows = chunked_context_workspace_size(workspace_size, max_num_seqs, block_size, dcp, variant)
    if variant.per_request_plan:
        return build_mla_chunked_context_metadata(context_lens, qsl, rows, block_size, dcp=dcp,
                                                  align_chunk_to_block=align_chunk_to_block)
    return build_uniform_chunked_context_metadata(context_lens, qsl, rows, block_size, dcp=dcp)


# -- accumulation schedule -----------------------------------------------------------------

@dataclass(frozen=True)
class AccumulateOp:
    """One step folding chunk partials into the context accumulator over tokens `[token_start, token_end)`.

    `kind`: "init_empty" (output 0, lse -inf; chunk -1), "copy" (first sight of these
    tokens) or "merge" (`merge_attn_states` with the accumulator as prefix).
    """

    chunk: int
    kind: str
    token_start: int
    token_end: int


def mla_accumulation_schedule(metadata: ContextMetadata) -> tuple[AccumulateOp, ...]:
    """The copy/merge steps of `_compute_prefill_context` for this metadata, in execution order.

    Per-request plan: a single chunk with no empty slices is returned as is (one copy).
    Otherwise `init_mla_context_partial` neutralises the empty slices, and each chunk
    merges its continuation tokens `[token_start, continuation_token_end)` and copies the
    rest. Uniform plan: the first chunk becomes the accumulator, every later one is merged
    over all tokens (the ping-pong buffer).
    """
    ops: list[AccumulateOp] = []
    if isinstance(metadata, UniformChunkedContextMetadata):
        for chunk in metadata.chunks:
            kind = "copy" if chunk.index == 0 else "merge"
            ops.append(AccumulateOp(chunk.index, kind, chunk.token_slice.start, chunk.token_slice.stop))
        return tuple(ops)
    if len(metadata.chunks) == 1 and not metadata.empty_token_slices:
        only = metadata.chunks[0]
        return (AccumulateOp(0, "copy", only.token_slice.start, only.token_slice.stop),)
    ops.extend(AccumulateOp(-1, "init_empty", s.start, s.stop) for s in metadata.empty_token_slices)
    for chunk in metadata.chunks:
        init_start = chunk.token_slice.start
        if chunk.is_continuation:
            ops.append(AccumulateOp(chunk.index, "merge", chunk.token_slice.start, chunk.continuation_token_end))
            init_start = chunk.continuation_token_end
        if init_start < chunk.token_slice.stop:
            ops.append(AccumulateOp(chunk.index, "copy", init_start, chunk.token_slice.stop))
    return tuple(ops)
