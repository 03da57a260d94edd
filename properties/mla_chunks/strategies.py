"""Hypothesis strategies of the `mla-chunks` properties (imported only when a property runs).

Strategies keep the numbers small where the property is numeric and shrink towards no
DCP, block 1 and short batches, so Hypothesis finds and shrinks a bug in well under a second.
The functions are public so other checks (the GPU oracle) draw the same batches; the
upper-case names are the strategies the properties name (`strategy="PLAN_CASES"`).
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import strategies as st

from .cases import MlaChunkCase, MlaChunkCasePair

DCP_LAYOUTS = ((2, 1), (2, 2), (4, 1), (2, 4), (4, 2))  # (world, interleave)
BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)


@st.composite
def layouts(draw, blocks, dcp: bool | None):
    """(block, world, interleave): no DCP shrinks first; under DCP the block is a multiple of both."""
    use_dcp = draw(st.booleans()) if dcp is None else dcp
    if not use_dcp:
        return draw(st.sampled_from(blocks)), 1, 1
    world, interleave = draw(st.sampled_from(DCP_LAYOUTS))
    block = draw(st.sampled_from([b for b in blocks if b % world == 0 and b % interleave == 0] or [world * interleave]))
    return block, world, interleave


# The strategies `mla_cases` draws from, built (and validated) once per argument set, not per example: the same
# strategies, so the same draws.

@functools.lru_cache(maxsize=None)
def _context_lists(max_context: int, max_requests: int) -> st.SearchStrategy[list[int]]:
    # about one prefill in four has no context (negative draws clamp to 0; shrinking still ends at 0)
    context = st.integers(-(max_context // 3), max_context).map(lambda c: max(c, 0))
    return st.lists(context, min_size=1, max_size=max_requests)


@functools.lru_cache(maxsize=None)
def _query_lists(max_query: int, size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max_query), min_size=size, max_size=size)


@functools.lru_cache(maxsize=None)
def _layouts(blocks, dcp: bool | None) -> st.SearchStrategy[tuple[int, int, int]]:
    return layouts(blocks, dcp)


@st.composite
def mla_cases(draw, *, max_requests: int = 6, max_context: int = 3000, max_query: int = 8,
              blocks=BLOCKS, max_workspace: int = 4096, dcp: bool | None = None,
              context_first: bool = False) -> MlaChunkCase:
    """Batches with context-free prefills anywhere (or only after the context-ful ones)."""
    ctx = draw(_context_lists(max_context, max_requests))
    if context_first:
        ctx = sorted(ctx, key=lambda c: c == 0)
    q = draw(_query_lists(max_query, len(ctx)))
    block, world, interleave = draw(_layouts(tuple(blocks), dcp))
    return MlaChunkCase(context_lens=tuple(ctx), query_lens=tuple(q), block_size=block,
                        workspace_size=draw(st.integers(1, max_workspace)),
                        max_num_seqs=len(ctx) + draw(st.integers(0, 4)), dcp_world_size=world,
                        dcp_interleave=interleave, align_chunk_to_block=world > 1 or not draw(st.booleans()),
                        seed=draw(st.integers(0, 2 ** 16)))


def plan_cases() -> st.SearchStrategy[MlaChunkCase]:
    """Planner-sized batches: up to 6 prefills of up to 3000 context rows, any block, DCP or not."""
    return mla_cases()


def dcp_cases() -> st.SearchStrategy[MlaChunkCase]:
    """Always DCP (world 2 or 4, interleave 1-4), contexts up to 600 rows, so the reorg checks stay cheap."""
    return mla_cases(max_context=600, blocks=(2, 4, 8, 16, 32, 64), max_workspace=1024, dcp=True)


@functools.lru_cache(maxsize=None)  # one strategy per argument set (`numeric_case_pairs` draws it per example)
def numeric_cases(*, dcp: bool | None = None, context_first: bool = False) -> st.SearchStrategy[MlaChunkCase]:
    """Small batches for the float64 path: up to 4 prefills, 40 context rows, blocks up to 16."""
    return mla_cases(max_requests=4, max_context=40, max_query=3, blocks=(1, 2, 4, 8, 16), max_workspace=64,
                     dcp=dcp, context_first=context_first)


@st.composite
def numeric_case_pairs(draw) -> MlaChunkCasePair:
    """One batch, two (workspace, block, alignment) configurations with the same DCP layout."""
    first = draw(numeric_cases())
    blocks = [b for b in (1, 2, 4, 8, 16) if b % first.dcp_world_size == 0 and b % first.dcp_interleave == 0]
    second = replace(first, block_size=draw(st.sampled_from(blocks)), workspace_size=draw(st.integers(1, 64)),
                     align_chunk_to_block=first.dcp_world_size > 1 or not draw(st.booleans()))
    return MlaChunkCasePair(first, second)


PLAN_CASES = plan_cases()
DCP_CASES = dcp_cases()
WORKSPACE_CASES = mla_cases(max_workspace=70_000, max_context=10)  # workspace_size_is_aligned: big W, tiny batches
NUMERIC_CASES = numeric_cases()
CONTEXT_FIRST_CASES = numeric_cases(dcp=False, context_first=True)  # where the uniform plan is sound
NUMERIC_CASE_PAIRS = numeric_case_pairs()
