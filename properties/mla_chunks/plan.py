"""Planner and metadata properties of `mla-chunks` (research note vllm.md 1.4, invariants 1-10 and 15).

Each invariant is a named `check_*` function over plain metadata, so a test can hand it a
planted mutation and see it fail; the `@kv_property` wrappers build the variant's metadata
for a generated case and call the checks. Chunks of both plans share the fields read here
(see `kvsim.models.mla_chunks.metadata`); where the uniform plan has no counterpart (`is_continuation`,
`continuation_token_end`, `empty_token_slices`) the docstring says what is checked instead.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.mla_chunks.attention import init_mla_context_partial
from kvsim.models.mla_chunks.dcp import DcpConfig, cdiv
from kvsim.models.mla_chunks.metadata import (ChunkedContextMetadata, UniformChunkedContextMetadata,
                                             mla_accumulation_schedule)
from kvsim.models.mla_chunks.planner import MlaVariant, mla_chunk_alignment, round_down

from .cases import BATCH_SOMETIMES, PLAN_EXAMPLES, MlaChunkCase

MODEL = "mla-chunks"


def _pieces(chunks) -> list[tuple[int, int, int, int]]:
    """(chunk index, request, start, length) for every span of every chunk, in order."""
    return [(i, r, chunk.starts[k], chunk.seq_lens[k]) for i, chunk in enumerate(chunks)
            for k, r in enumerate(range(chunk.request_slice.start, chunk.request_slice.stop))]


def context_runs(context_lens: Sequence[int]) -> list[list[int]]:
    """Maximal runs of consecutive requests with context (indices)."""
    runs: list[list[int]] = []
    for r, c in enumerate(context_lens):
        if c > 0:
            if runs and runs[-1][-1] == r - 1:
                runs[-1].append(r)
            else:
                runs.append([r])
    return runs


# -- checks ---------------------------------------------------------------------------------

def check_exact_tiling(context_lens: Sequence[int], chunks) -> None:
    """Every context row of every request is gathered exactly once, in order: pieces start at 0, abut, sum to ctx."""
    cursor = [0] * len(context_lens)
    for i, r, start, length in _pieces(chunks):
        if length == 0:
            continue  # gathers nothing; chunks_have_no_empty_spans is about these
        if context_lens[r] == 0:
            raise PropertyViolation(f"rows gathered for context-free request {r} in chunk {i}: expected 0, "
                                    f"got {length}")
        if start != cursor[r]:
            what = "gathered twice" if start < cursor[r] else "dropped"
            raise PropertyViolation(f"start of request {r}'s piece in chunk {i}: expected {cursor[r]} (the rows "
                                    f"before it), got {start}: rows [{min(start, cursor[r])}, "
                                    f"{max(start, cursor[r])}) {what}")
        cursor[r] += length
    for r, (got, want) in enumerate(zip(cursor, context_lens)):
        if got != want:
            raise PropertyViolation(f"rows gathered for request {r}: expected {want}, got {got}")


def check_no_empty_spans(chunks) -> None:
    for i, r, _, length in _pieces(chunks):
        if length <= 0:
            raise PropertyViolation(f"span of request {r} in chunk {i}: expected > 0 rows, got {length}")


def check_row_budget(context_lens: Sequence[int], chunks, workspace: int, alignment: int,
                     dcp: DcpConfig | None) -> None:
    for i, chunk in enumerate(chunks):
        cu = (0, *accumulate(chunk.seq_lens))
        if tuple(chunk.cu_seq_lens) != cu:
            raise PropertyViolation(f"cu_seq_lens of chunk {i}: expected {list(cu)}, got {list(chunk.cu_seq_lens)}")
        if not chunk.num_context_tokens == cu[-1] == len(chunk.token_to_seq):
            raise PropertyViolation(f"rows of chunk {i}: expected num_context_tokens == cu_seq_lens[-1] == "
                                    f"len(token_to_seq), got {chunk.num_context_tokens}, {cu[-1]}, "
                                    f"{len(chunk.token_to_seq)}")
        if chunk.num_context_tokens > workspace:
            raise PropertyViolation(f"rows gathered by chunk {i}: expected <= workspace {workspace}, "
                                    f"got {chunk.num_context_tokens}")
        if chunk.max_seq_len != max(chunk.seq_lens):
            raise PropertyViolation(f"max_seq_len of chunk {i}: expected {max(chunk.seq_lens)}, "
                                    f"got {chunk.max_seq_len}")
        if dcp is not None and chunk.num_local_context_tokens > workspace // dcp.world_size:
            raise PropertyViolation(f"local rows gathered per rank by chunk {i}: expected <= "
                                    f"{workspace // dcp.world_size} (W // world), got {chunk.num_local_context_tokens}")
    cap = round_down(workspace, alignment)
    for i, r, start, length in _pieces(chunks):
        if start + length < context_lens[r] and length > cap:
            raise PropertyViolation(f"split piece of request {r} in chunk {i}: expected <= round_down(W, A) = {cap} "
                                    f"rows, got {length}")


def check_request_order(context_lens: Sequence[int], chunks) -> None:
    previous = 0
    for i, chunk in enumerate(chunks):
        rs, re = chunk.request_slice.start, chunk.request_slice.stop
        if rs < previous:
            raise PropertyViolation(f"request_slice.start of chunk {i}: expected >= {previous} (the previous "
                                    f"chunk's), got {rs}")
        previous = rs
        without = [r for r in range(rs, re) if context_lens[r] == 0]
        if without:
            raise PropertyViolation(f"requests of chunk {i} ({rs}..{re - 1}): expected a run of context-ful requests, "
                                    f"got context-free request(s) {without}")


def check_continuation(chunks) -> None:
    for i, chunk in enumerate(chunks):
        later = [s for s in chunk.starts[1:] if s != 0]
        if later:
            raise PropertyViolation(f"starts of chunk {i} after its first request: expected all 0, "
                                    f"got {list(chunk.starts[1:])}")
        if hasattr(chunk, "is_continuation") and chunk.is_continuation != (chunk.starts[0] > 0):
            raise PropertyViolation(f"is_continuation of chunk {i}: expected {chunk.starts[0] > 0} "
                                    f"(starts[0] = {chunk.starts[0]}), got {chunk.is_continuation}")
        if chunk.starts[0] > 0:
            prev_last = chunks[i - 1].request_slice.stop - 1 if i else None
            if prev_last != chunk.request_slice.start:
                raise PropertyViolation(f"request continued by chunk {i}: expected the previous chunk's last request "
                                        f"{prev_last}, got {chunk.request_slice.start}")


def check_alignment(chunks, alignment: int) -> None:
    for i, r, start, _ in _pieces(chunks):
        if start % alignment:
            raise PropertyViolation(f"start of request {r} in chunk {i}: expected a multiple of {alignment}, "
                                    f"got {start}")


def check_token_bookkeeping(query_start_loc: Sequence[int], chunks) -> None:
    qsl = query_start_loc
    for i, chunk in enumerate(chunks):
        rs, re = chunk.request_slice.start, chunk.request_slice.stop
        if (chunk.token_slice.start, chunk.token_slice.stop) != (qsl[rs], qsl[re]):
            raise PropertyViolation(f"token_slice of chunk {i}: expected ({qsl[rs]}, {qsl[re]}), got "
                                    f"({chunk.token_slice.start}, {chunk.token_slice.stop})")
        if hasattr(chunk, "continuation_token_end") and chunk.continuation_token_end != qsl[rs + 1]:
            raise PropertyViolation(f"continuation_token_end of chunk {i}: expected {qsl[rs + 1]}, "
                                    f"got {chunk.continuation_token_end}")
        rebased = tuple(q - qsl[rs] for q in qsl[rs:re + 1])
        if tuple(chunk.query_start_loc) != rebased:
            raise PropertyViolation(f"query_start_loc of chunk {i}: expected {list(rebased)}, "
                                    f"got {list(chunk.query_start_loc)}")
        widest = max(b - a for a, b in zip(rebased, rebased[1:]))
        if chunk.max_query_len != widest:
            raise PropertyViolation(f"max_query_len of chunk {i}: expected {widest}, got {chunk.max_query_len}")
        owners = tuple(k for k, n in enumerate(chunk.seq_lens) for _ in range(n))
        if tuple(chunk.token_to_seq) != owners:
            bad = next(t for t, (a, b) in enumerate(zip(chunk.token_to_seq + (-1,), owners + (-1,))) if a != b)
            raise PropertyViolation(f"token_to_seq[{bad}] of chunk {i}: expected repeat(range(n), seq_lens), "
                                    f"got length {len(chunk.token_to_seq)} vs {len(owners)}, first difference at {bad}")


def check_empty_token_slices(context_lens: Sequence[int], query_start_loc: Sequence[int],
                             metadata: ChunkedContextMetadata) -> None:
    qsl = query_start_loc
    want = [(qsl[i], qsl[i + 1]) for i, c in enumerate(context_lens) if c == 0]
    got = [(s.start, s.stop) for s in metadata.empty_token_slices]
    if got != want:
        raise PropertyViolation(f"empty_token_slices: expected {want}, got {got}")
    out, lse = init_mla_context_partial(np.zeros((1, 2, 3)), qsl[-1], metadata.empty_token_slices)
    for a, b in want:
        if not (np.all(out[a:b] == 0.0) and np.all(np.isneginf(lse[:, a:b]))):
            raise PropertyViolation(f"init_mla_context_partial on tokens [{a}, {b}): expected output 0 and lse -inf, "
                                    f"got output {out[a:b].ravel()[:3]}..., lse {lse[:, a:b].ravel()[:3]}...")


def check_accumulation_schedule(context_lens: Sequence[int], query_start_loc: Sequence[int], chunks, ops) -> None:
    """Per token of a context-ful request: exactly one copy, before any merge; merges = covering chunks - 1.

    Tokens of context-free requests are only initialised (0, -inf), never copied or merged.
    """
    qsl = query_start_loc
    covering = [0] * len(context_lens)
    for _, r, _, length in _pieces(chunks):
        covering[r] += length > 0
    for r, c in enumerate(context_lens):
        for t in range(qsl[r], qsl[r + 1]):
            kinds = [op.kind for op in ops if op.token_start <= t < op.token_end]
            if c == 0:
                if any(k != "init_empty" for k in kinds):
                    raise PropertyViolation(f"accumulation of token {t} (context-free request {r}): expected only "
                                            f"init_empty, got {kinds}")
                continue
            if kinds.count("copy") != 1 or kinds[0] != "copy":
                raise PropertyViolation(f"accumulation of token {t} (request {r}): expected one copy before any "
                                        f"merge, got {kinds}")
            if kinds.count("merge") != covering[r] - 1:
                raise PropertyViolation(f"merges of token {t} (request {r}): expected {covering[r] - 1} (chunks "
                                        f"covering it - 1), got {kinds.count('merge')}")


def chunk_count_lower_bound(context_lens: Sequence[int], workspace: int, per_run: bool) -> int:
    """`sum over runs R of cdiv(sum_R ctx, W)`; with `per_run=False` the global `cdiv(sum ctx, W)`."""
    if not per_run:
        return cdiv(sum(context_lens), workspace)
    return sum(cdiv(sum(context_lens[r] for r in run), workspace) for run in context_runs(context_lens))


def chunk_count_upper_bound(context_lens: Sequence[int], workspace: int, alignment: int,
                            dcp: DcpConfig | None) -> int | None:
    """Per run R: `1 + floor((C_R - 1) / (B - s))`, with `C_R` the run's padded rows, `B` the row budget and
    `s = (virtual + A - 2) / world` the most a chunk can leave unused (None if `B <= s`).

    Why: inside a run a chunk only closes when the next remainder does not fit, and then the
    largest aligned split that fits leaves less than `s` of the budget unused; splits start at
    multiples of the virtual block, so padded costs add up to `C_R`. Without DCP and with
    `A == 1` this is the lower bound.
    """
    world = 1 if dcp is None else dcp.world_size
    virtual = 1 if dcp is None else dcp.virtual_block
    pad = (lambda r: r) if dcp is None else dcp.padded_rows
    budget = workspace // world
    denominator = budget * world - (virtual + alignment - 2)
    if denominator <= 0:
        return None
    return sum(1 + ((sum(pad(context_lens[r]) for r in run) - 1) * world) // denominator
               for run in context_runs(context_lens))


# -- properties ------------------------------------------------------------------------------

def _chunks(case: MlaChunkCase, variant: MlaVariant):
    md = case.metadata(variant)
    return md, (() if md is None else md.chunks)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunks_tile_every_context_row_once(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Each request's pieces start at 0, abut and sum to its context; context-free requests gather nothing."""
    _, chunks = _chunks(case, variant)
    check_exact_tiling(case.context_lens, chunks)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunks_have_no_empty_spans(case: MlaChunkCase, variant: MlaVariant) -> None:
    """No chunk holds a request with an empty span (the uniform plan does, whenever contexts differ)."""
    _, chunks = _chunks(case, variant)
    check_no_empty_spans(chunks)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunks_fit_the_row_budget(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Rows per chunk <= W (and == cu_seq_lens[-1] == len(token_to_seq)); under DCP local rows <= W // world;
    split pieces <= round_down(W, A)."""
    _, chunks = _chunks(case, variant)
    check_row_budget(case.context_lens, chunks, case.workspace(variant), case.split_alignment, case.dcp)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunks_follow_request_order(case: MlaChunkCase, variant: MlaVariant) -> None:
    """request_slice.start never decreases and each chunk's requests are a run of context-ful requests."""
    _, chunks = _chunks(case, variant)
    check_request_order(case.context_lens, chunks)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def continuation_only_at_first_request(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Only a chunk's first request may start past 0; it is then the previous chunk's last request."""
    _, chunks = _chunks(case, variant)
    check_continuation(chunks)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunk_starts_are_aligned(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Every start is a multiple of the split alignment (block, or lcm(block, world*interleave) under DCP)."""
    _, chunks = _chunks(case, variant)
    check_alignment(chunks, case.split_alignment)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def token_bookkeeping_matches_query_start_loc(case: MlaChunkCase, variant: MlaVariant) -> None:
    """token_slice, continuation_token_end, rebased query_start_loc, max_query_len and token_to_seq follow qsl."""
    _, chunks = _chunks(case, variant)
    check_token_bookkeeping(case.query_start_loc, chunks)


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def context_free_prefills_are_neutralised(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Metadata is None iff no prefill has context; otherwise context-free prefills get a neutral partial.

    Per-request plan: `empty_token_slices` are exactly their token ranges and
    `init_mla_context_partial` leaves output 0, lse -inf there. Uniform plan: every chunk
    with an empty span must be masked (`mask_empty_context`), or the backend's scratch stays.
    """
    md = case.metadata(variant)
    if (md is None) != (max(case.context_lens) <= 0):
        raise PropertyViolation(f"metadata: expected None iff max(context_lens) <= 0, got "
                                f"{'None' if md is None else 'metadata'} for {list(case.context_lens)}")
    if isinstance(md, ChunkedContextMetadata):
        check_empty_token_slices(case.context_lens, case.query_start_loc, md)
    elif isinstance(md, UniformChunkedContextMetadata) and not variant.mask_empty_context:
        for chunk in md.chunks:
            empty = [r for r, n in enumerate(chunk.seq_lens) if n == 0]
            if empty:
                raise PropertyViolation(f"partial of requests {empty} in chunk {chunk.index} (empty spans): expected "
                                        f"masked to (0, -inf), got the backend's unmasked scratch")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def accumulation_copies_once_then_merges(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Each token of a context-ful request is copied once, first, then merged once per further covering chunk."""
    md = case.metadata(variant)
    if md is not None:
        check_accumulation_schedule(case.context_lens, case.query_start_loc, md.chunks, mla_accumulation_schedule(md))


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunk_count_meets_lower_bound(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Chunks >= sum over runs of context-ful requests of cdiv(run rows, W); equal when A == 1 without DCP.

    The bound is per run because a context-free prefill ends a per-request chunk
    (`[64, 0, 64]` takes 2 chunks); the uniform plan's columns span runs, so it is held to
    the global `cdiv(sum ctx, W)`.
    """
    md = case.metadata(variant)
    count = 0 if md is None else len(md.chunks)
    per_run = variant.per_request_plan
    w = case.workspace(variant)
    bound = chunk_count_lower_bound(case.context_lens, w, per_run)
    if count < bound:
        raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {w}: expected >= {bound}, got {count}")
    if per_run and case.split_alignment == 1 and case.dcp is None and count != bound:
        raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {w} and alignment 1: expected exactly "
                                f"{bound}, got {count}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PLAN_EXAMPLES, sometimes=BATCH_SOMETIMES)
def chunk_count_within_alignment_slack(case: MlaChunkCase, variant: MlaVariant) -> None:
    """Cost: chunks <= the per-run bound that lets each chunk leave < (virtual + A - 2) / world rows unused.

    Every chunk is an attention launch over its requests; the uniform plan's
    `cdiv(max ctx, round_down(W / n_ctx, block))` columns exceed it (`[960, 16x7]`: 8 vs 2).
    """
    md = case.metadata(variant)
    count = 0 if md is None else len(md.chunks)
    w = case.workspace(variant)
    bound = chunk_count_upper_bound(case.context_lens, w, case.split_alignment, case.dcp)
    if bound is not None and count > bound:
        raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {w}, alignment {case.split_alignment}: "
                                f"expected <= {bound}, got {count}")


@kv_property(model=MODEL, strategy="WORKSPACE_CASES", examples=PLAN_EXAMPLES)
def workspace_size_is_aligned(case: MlaChunkCase, variant: MlaVariant) -> None:
    """The workspace is the smallest multiple of the alignment A that is >= the request and >= A; idempotent.

    What upstream guarantees (vllm >= 0.28.0, `round_up(max(W, A), A)`): `round_down(W', A) > 0`, the one
    thing the per-request planner needs, and under DCP `W' % world == 0`; never a whole alignment more than
    that, so the 64 Ki cap of the requested size is exceeded by less than A. b38e111d's extra
    `max_num_seqs * A` floor (dropped by vllm#51733) breaks the last clause.
    """
    w = case.workspace(variant)
    alignment = mla_chunk_alignment(case.block_size, case.dcp)
    if w % alignment:
        raise PropertyViolation(f"workspace for request {case.workspace_size}: expected a multiple of {alignment}, "
                                f"got {w}")
    if w < case.workspace_size:
        raise PropertyViolation(f"workspace: expected >= the requested {case.workspace_size}, got {w}")
    if w < alignment:
        raise PropertyViolation(f"workspace: expected >= alignment {alignment} (round_down(W, A) > 0), got {w}")
    floor = max(case.workspace_size, alignment)
    if w >= floor + alignment:
        raise PropertyViolation(f"workspace for request {case.workspace_size} (max_num_seqs {case.max_num_seqs}): "
                                f"expected < max(W, A) + A = {floor + alignment} (the smallest multiple of "
                                f"{alignment} that fits), got {w}")
    again = MlaChunkCase(case.context_lens, case.query_lens, case.block_size, w, case.max_num_seqs,
                         case.dcp_world_size, case.dcp_interleave).workspace(variant)
    if again != w:
        raise PropertyViolation(f"workspace of the workspace: expected {w} (idempotent), got {again}")
