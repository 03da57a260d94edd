"""MLA chunked context: the chunk planners and the workspace size (catalog model `mla-chunks`).

Follows vLLM commit b38e111d (PR #50613, "Per-request scheduling for MLA chunked context",
RFC #50497): `plan_mla_context_chunks` / `_ContextChunkPlan` and
`align_mla_chunked_context_workspace_size` in the MLA attention module (`mla_attention.py`),
and, for the pre-fix variants, the uniform "batch-column" plan it replaced. Research note
`vllm.md` sections 1.1-1.3.

Variants (one behaviour flag per line the upstream changes touched, the record `MlaVariant`):

* `fixed`: per-request plan, aligned workspace, no empty spans, no cut-off; the workspace lower
  bound without b38e111d's `max_num_seqs * alignment` term, which vllm#51733 dropped (every
  release with the per-request plan, 0.28.0 on, ships it without: today's upstream).
* `pre_b38e111d`: uniform plan with `mask_empty_context` (#49294) and the
  `prefill_tokens_with_context` cut-off at the final merge.
* `uniform_unmasked`: the uniform plan before #49294: no masking of empty spans. The notes
  saw the cut-off only in the last pre-b38e111d mirror, so this variant does not have it.

The planners here are pure and work on host integers; `.metadata` turns their
output into the per-chunk metadata, `.prefill` runs the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from kvsim.engine.errors import ConfigError, check_int

from .dcp import DcpConfig, cdiv
from .variants import FIXED, MlaVariant


def round_down(x: int, multiple: int) -> int:
    return (x // multiple) * multiple


def round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple


_INT = frozenset({int})  # the one type a count may have (not bool)


def check_counts(values: Sequence[int], field: str) -> tuple[int, ...]:
    """A sequence of non-negative integers (row or token counts) as a tuple; ConfigError names the bad entry."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ConfigError(field, "a sequence of integers", values)
    counts = tuple(values)
    if {*map(type, counts)} <= _INT and (not counts or min(counts) >= 0):
        return counts  # the common case, checked at once; anything else goes entry by entry below
    return tuple(check_int(v, f"{field}[{i}]", minimum=0) for i, v in enumerate(counts))


# -- workspace ------------------------------------------------------------------------------

def determine_chunked_prefill_workspace_size(max_model_len: int, max_num_seqs: int, block_size: int) -> int:
    """The core workspace size before any lower bound: `min(max(8*max_model_len, 4*max_num_seqs*block), 64Ki)`."""
    check_int(max_model_len, "max_model_len", minimum=1)
    check_int(max_num_seqs, "max_num_seqs", minimum=1)
    check_int(block_size, "block_size", minimum=1)
    return min(max(8 * max_model_len, 4 * max_num_seqs * block_size), 64 * 1024)


def mla_chunk_alignment(block_size: int, dcp: DcpConfig | None = None) -> int:
    """`block_size`, or `lcm(block_size, world * interleave)` under DCP.

    Every split start must be block-aligned (older gathers offset the block index by
    `start / block_size`) and, under DCP, a multiple of the virtual block so that
    `padded_rows(start)` is a rank's exact local start.
    """
    check_int(block_size, "block_size", minimum=1)
    return block_size if dcp is None else math.lcm(block_size, dcp.virtual_block)


def align_mla_chunked_context_workspace_size(workspace_size: int, max_num_seqs: int, block_size: int,
                                             dcp: DcpConfig | None = None, variant: MlaVariant = FIXED) -> int:
    """`round_up(max(W, alignment), alignment)` (vllm#51733, releases >= 0.28.0).

    The per-request planner needs only `round_down(W, alignment) > 0`, and under DCP the builder
    asserts `W % world == 0`; both follow from this. b38e111d's bound was
    `round_up(max(W, max_num_seqs * alignment), alignment)` (`variant.workspace_seq_term`): the extra
    term only enlarges the workspace, past the 64 Ki cap of `determine_chunked_prefill_workspace_size`
    once `max_num_seqs * alignment` exceeds it; no released engine has it.
    """
    check_int(workspace_size, "workspace_size", minimum=1)
    check_int(max_num_seqs, "max_num_seqs", minimum=1)
    alignment = mla_chunk_alignment(block_size, dcp)
    floor = max_num_seqs * alignment if variant.workspace_seq_term else alignment
    return round_up(max(workspace_size, floor), alignment)


def chunked_context_workspace_size(workspace_size: int, max_num_seqs: int, block_size: int,
                                   dcp: DcpConfig | None = None, variant: MlaVariant = FIXED) -> int:
    """The workspace rows a variant runs with, from the requested `chunked_prefill_workspace_size`."""
    check_int(workspace_size, "workspace_size", minimum=1)
    check_int(max_num_seqs, "max_num_seqs", minimum=1)
    check_int(block_size, "block_size", minimum=1)
    if variant.aligned_workspace:
        return align_mla_chunked_context_workspace_size(workspace_size, max_num_seqs, block_size, dcp, variant)
    return max(workspace_size, max_num_seqs * block_size)  # the pre-b38e111d lower bound


# -- per-request plan (b38e111d) -----------------------------------------------------------

@dataclass(frozen=True)
class ContextChunkPlan:
    """Upstream `_ContextChunkPlan`: a contiguous run of requests and each one's `(start, len)` piece.

    `is_continuation` is set by the planner (upstream: `starts[0] > 0`); it is a field, not
    derived, so the property that checks it can fail.
    """

    request_start: int
    request_end: int
    starts: tuple[int, ...]
    seq_lens: tuple[int, ...]
    is_continuation: bool

    def __post_init__(self) -> None:
        check_int(self.request_start, "request_start", minimum=0)
        check_int(self.request_end, "request_end", minimum=self.request_start + 1)
        n = self.request_end - self.request_start
        if len(self.starts) != n or len(self.seq_lens) != n:
            raise ConfigError("starts/seq_lens", f"{n} entries each (request_end - request_start)",
                              (len(self.starts), len(self.seq_lens)))
        check_counts(self.starts, "starts")
        check_counts(self.seq_lens, "seq_lens")

    @classmethod
    def planned(cls, request_start: int, starts: tuple[int, ...], seq_lens: tuple[int, ...]) -> "ContextChunkPlan":
        """A plan as `plan_mla_context_chunks` builds it, without the checks of `__post_init__`: the planner's
        requests are in range, its tuples as long as the run and its counts non-negative by construction
        (a plan built elsewhere, a conform adapter's or a test's, goes through the checks)."""
        plan = object.__new__(cls)
        plan.__dict__.update(request_start=request_start, request_end=request_start + len(seq_lens), starts=starts,
                             seq_lens=seq_lens, is_continuation=starts[0] > 0)
        return plan


def _largest_split(start: int, remainder: int, budget_left: int, max_context_chunk: int, alignment: int,
                   padded_rows: Callable[[int], int] | None) -> int:
    """Largest multiple of `alignment`, at most `min(max_context_chunk, round_down(remainder-1, alignment))`,
    whose padded cost fits in `budget_left`; 0 if none. `padded_rows` None: a row costs one.

    The `remainder - 1` keeps at least one row for the next chunk (a split never takes the
    whole remainder: that case is "fits" and is handled by the caller).
    """
    hi = min(max_context_chunk, round_down(remainder - 1, alignment)) // alignment
    if padded_rows is None:  # rows cost themselves: the last k with k * alignment <= budget_left, at once
        return max(0, min(hi, budget_left // alignment)) * alignment
    base = padded_rows(start)
    lo = 0
    while lo < hi:  # cost is monotone in the length: binary search for the last k that fits
        mid = (lo + hi + 1) // 2
        if padded_rows(start + mid * alignment) - base <= budget_left:
            lo = mid
        else:
            hi = mid - 1
    return lo * alignment


def plan_mla_context_chunks(context_lens: Sequence[int], row_budget: int, max_context_chunk: int,
                            split_alignment: int,
                            padded_rows: Callable[[int], int] | None = None) -> list[ContextChunkPlan]:
    """Greedy next-fit of whole request remainders into chunks of `row_budget` (padded) rows.

    A context-free request ends the current chunk (chunks only span runs of context-ful
    requests). When a remainder does not fit, the largest aligned split that fits is
    appended and the chunk closes; the next chunk continues that request.

    Preconditions are upstream's asserts, no more: `max_context_chunk > 0` and `split_alignment > 0`.
    A chunk cap that is no multiple of the alignment (or below it) caps the splits at
    `round_down(max_context_chunk, alignment)`, and a budget too small for any split is refused when a
    chunk would be empty (upstream's `assert seq_lens`); the builder only ever passes a positive
    multiple and a budget of at least one split (found by `kvsim conform vllm`: the model refused
    arguments upstream plans).
    """
    ctx = check_counts(context_lens, "context_lens")
    check_int(row_budget, "row_budget")
    check_int(max_context_chunk, "max_context_chunk", minimum=1)
    check_int(split_alignment, "split_alignment", minimum=1)
    pad = padded_rows
    plans: list[ContextChunkPlan] = []
    r, start, n = 0, 0, len(ctx)
    while r < n:
        if ctx[r] == 0:
            if start != 0:
                raise AssertionError(f"request {r} has no context but a cursor at {start}")
            r += 1
            continue
        first = r
        starts: list[int] = []
        lens: list[int] = []
        rows = 0
        while r < n and ctx[r] > 0:
            rem = ctx[r] - start
            need = rem if pad is None else pad(start + rem) - pad(start)
            if rows + need <= row_budget:
                starts.append(start)
                lens.append(rem)
                rows += need
                r, start = r + 1, 0
                continue
            piece = _largest_split(start, rem, row_budget - rows, max_context_chunk, split_alignment, pad)
            if piece > 0:
                starts.append(start)
                lens.append(piece)
                start += piece
            break
        if not lens:
            raise ConfigError("row_budget", f"room for one aligned split of {split_alignment} rows of request {r}",
                              row_budget)
        plans.append(ContextChunkPlan.planned(first, tuple(starts), tuple(lens)))
    return plans


# -- uniform plan (before b38e111d) --------------------------------------------------------

@dataclass(frozen=True)
class UniformContextPlan:
    """The old batch-column plan: chunk `i` covers rows `[i*mcc, min(ctx_p, (i+1)*mcc))` of every prefill.

    `seq_lens[i][p]` is clamped at 0, so spans can be empty. Under DCP, `local_chunk_size`
    is `P = cdiv(mcc, virtual) * interleave` and local chunk `i` covers local rows
    `[i*P, min(padded_local_ctx_p, (i+1)*P))`.
    """

    max_context_chunk: int
    num_chunks: int
    seq_lens: tuple[tuple[int, ...], ...]
    local_chunk_size: int | None = None

    def chunk_start(self, index: int) -> int:
        return index * self.max_context_chunk


def plan_uniform_context_chunks(context_lens: Sequence[int], workspace_size: int, block_size: int,
                                dcp: DcpConfig | None = None, *,
                                align_chunk_to_block: bool = True) -> UniformContextPlan | None:
    """The pre-b38e111d planner; None when no prefill has context.

    `mcc = W // n_ctx`, rounded down to the block when `align_chunk_to_block` (the dense builder
    always; sparse MLA only on CUDA). Raises ConfigError where upstream asserts: `mcc > 0` (too
    many context-ful prefills for the workspace, note 1.7.6) and, under DCP, `mcc % world == 0`.
    """
    ctx = check_counts(context_lens, "context_lens")
    check_int(workspace_size, "workspace_size", minimum=1)
    check_int(block_size, "block_size", minimum=1)
    n_ctx = sum(1 for c in ctx if c > 0)
    if n_ctx == 0:
        return None
    mcc = workspace_size // n_ctx
    if align_chunk_to_block:
        mcc = round_down(mcc, block_size)
    if mcc <= 0:
        raise ConfigError("max_context_chunk", f"> 0 (workspace {workspace_size} // {n_ctx} prefills with context, "
                          f"rounded down to block {block_size})", mcc)
    local_chunk = None
    if dcp is not None:
        if mcc % dcp.world_size:
            raise ConfigError("max_context_chunk", f"a multiple of dcp_world_size {dcp.world_size}", mcc)
        local_chunk = cdiv(mcc, dcp.virtual_block) * dcp.interleave
    num_chunks = cdiv(max(ctx), mcc)
    seq_lens = tuple(tuple([max(0, min(c - lo, mcc)) for c in ctx]) for lo in range(0, num_chunks * mcc, mcc))
    return UniformContextPlan(max_context_chunk=mcc, num_chunks=num_chunks, seq_lens=seq_lens,
                              local_chunk_size=local_chunk)
