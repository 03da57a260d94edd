"""Decode context parallel (DCP) for MLA chunked context: the rank model and `reorg_kvcache`.

Follows vLLM commit b38e111d (PR #50613), the MLA attention module (`mla_attention.py`:
`reorg_kvcache`, `_context_parallel_compute_prefill_context`) and `get_dcp_local_seq_lens`;
research note `vllm.md` sections 1.2 (old DCP branch), 1.3 (new reorg) and 1.4 invariant 11.

Under DCP every rank holds a slice of each request's KV cache. Global position `p` lives
on rank `(p // interleave) % world` at local index `(p // virtual) * interleave + p % interleave`
with `virtual = world * interleave`: positions are dealt to ranks `interleave` at a time.

A chunk gathers, on every rank, a *padded* run of local rows (the same length on all ranks,
so the all-gather is regular), all-gathers them, then `reorg_kvcache` drops the padding and
concatenates each request's rows rank-major. The only line the fix changed is where a
request's local rows start: `local_starts[k]` (new) or `chunk_idx * chunk_size` (old).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kvsim.engine.errors import ConfigError, PropertyViolation, check_int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class DcpConfig:
    """DCP world size and `cp_kv_cache_interleave_size` (rows dealt to a rank at a time)."""

    world_size: int
    interleave: int = 1

    def __post_init__(self) -> None:
        check_int(self.world_size, "dcp_world_size", minimum=1)
        check_int(self.interleave, "cp_kv_cache_interleave_size", minimum=1)

    @property
    def virtual_block(self) -> int:
        """Global rows in one round of dealing: `world * interleave`."""
        return self.world_size * self.interleave

    def padded_rows(self, rows: int) -> int:
        """Local rows each rank gathers to cover global rows `[0, rows)`: `cdiv(rows, virtual) * interleave`.

        It is the largest local length over the ranks (rank 0's), so it is the regular
        per-rank length the all-gather needs.
        """
        return -(-rows // (self.world_size * self.interleave)) * self.interleave  # the planner's cost: inline


def dcp_rank_of(position: int, dcp: DcpConfig) -> int:
    """The rank holding global context position `position`."""
    return (position // dcp.interleave) % dcp.world_size


def dcp_local_index(position: int, dcp: DcpConfig) -> int:
    """Index of global position `position` in its rank's local sequence."""
    return (position // dcp.virtual_block) * dcp.interleave + position % dcp.interleave


def dcp_global_position(rank: int, local_index: int, dcp: DcpConfig) -> int:
    """Inverse of (`dcp_rank_of`, `dcp_local_index`)."""
    return (local_index // dcp.interleave) * dcp.virtual_block + rank * dcp.interleave + local_index % dcp.interleave


def get_dcp_local_seq_lens(seq_len: int, dcp: DcpConfig) -> tuple[int, ...]:
    """Number of rows of a `seq_len`-row sequence held by each rank (rank order)."""
    check_int(seq_len, "seq_len", minimum=0)
    full, rest = divmod(seq_len, dcp.virtual_block)
    return tuple(full * dcp.interleave + min(max(rest - rank * dcp.interleave, 0), dcp.interleave)
                 for rank in range(dcp.world_size))


def dcp_local_positions(seq_len: int, rank: int, dcp: DcpConfig) -> np.ndarray:
    """Global positions of rank `rank`'s local rows of a `seq_len`-row sequence, in local order."""
    local = get_dcp_local_seq_lens(seq_len, dcp)[rank]
    idx = np.arange(local, dtype=np.int64)
    return (idx // dcp.interleave) * dcp.virtual_block + rank * dcp.interleave + idx % dcp.interleave


@dataclass(frozen=True)
class ReorgPlan:
    """Which all-gathered rows `reorg_kvcache` keeps, and how many per request."""

    source_rows: tuple[int, ...]  # index into the all-gathered buffer, output order
    seq_lens: tuple[int, ...]  # rows kept per request of the chunk


def reorg_source_rows(padded_local_chunk_seq_lens: Sequence[int],
                      local_context_lens_allranks: Sequence[Sequence[int]],
                      local_starts: Sequence[int], toks: int) -> ReorgPlan:
    """The index arithmetic of `reorg_kvcache`, without the tensors.

    Rank `r`'s gathered rows sit at `r * toks + j` in the all-gathered buffer. For each
    request `k` and rank `r` it keeps `min(max(0, L[k][r] - local_starts[k]), padded[k])`
    rows starting at the request's offset `src`, then advances `src` by the padded length.
    """
    n = len(padded_local_chunk_seq_lens)
    if len(local_context_lens_allranks) != n or len(local_starts) != n:
        raise ConfigError("reorg_kvcache inputs", f"{n} entries each (one per request of the chunk)",
                          (len(local_context_lens_allranks), len(local_starts)))
    check_int(toks, "toks", minimum=0)
    rows: list[int] = []
    seq_lens: list[int] = []
    src = 0
    for k in range(n):
        padded = padded_local_chunk_seq_lens[k]
        kept = 0
        for rank, local_ctx in enumerate(local_context_lens_allranks[k]):
            # The line b38e111d changed: the request's own local start, not chunk_idx * chunk_size.
            take = min(max(0, local_ctx - local_starts[k]), padded)
            rows.extend(range(rank * toks + src, rank * toks + src + take))
            kept += take
        seq_lens.append(kept)
        src += padded
    return ReorgPlan(source_rows=tuple(rows), seq_lens=tuple(seq_lens))


def reorg_kvcache(allgathered_kv_c_normed: np.ndarray, allgathered_k_pe: np.ndarray | None,
                  padded_local_chunk_seq_lens_lst: Sequence[int],
                  local_context_lens_allranks: Sequence[Sequence[int]], local_starts: Sequence[int],
                  sum_seq_len: int, max_seq_len: int, toks: int,
                  *, strict: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Drop the DCP padding from all-gathered rows; each request's rows come out rank-major.

    With `strict` (upstream's behaviour) the two upstream asserts are checked: the total
    equals `sum_seq_len` (the chunk's `cu_seq_lens[-1]`) and the longest request equals
    `max_seq_len`; a mismatch raises PropertyViolation naming both numbers.
    """
    plan = reorg_source_rows(padded_local_chunk_seq_lens_lst, local_context_lens_allranks, local_starts, toks)
    if strict:
        total = len(plan.source_rows)
        if total != sum_seq_len:
            raise PropertyViolation(f"reorg_kvcache total rows: expected {sum_seq_len} (cu_seq_lens[-1]), "
                                    f"got {total} (kept per request {list(plan.seq_lens)})")
        longest = max(plan.seq_lens, default=0)
        if longest != max_seq_len:
            raise PropertyViolation(f"reorg_kvcache longest request: expected {max_seq_len} (max_seq_len), "
                                    f"got {longest}")
    index = np.asarray(plan.source_rows, dtype=np.int64)
    kv_c = allgathered_kv_c_normed[index]
    k_pe = None if allgathered_k_pe is None else allgathered_k_pe[index]
    return kv_c, k_pe


def reorg_kvcache_by_chunk_index(allgathered_kv_c_normed: np.ndarray, allgathered_k_pe: np.ndarray | None,
                                 padded_local_chunk_seq_lens_lst: Sequence[int],
                                 local_context_lens_allranks: Sequence[Sequence[int]],
                                 sum_seq_len: int, max_seq_len: int, chunk_size: int, chunk_idx: int, toks: int,
                                 *, strict: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """The pre-b38e111d form: every request's local rows start at `chunk_idx * chunk_size`.

    That is right only for the uniform plan, where chunk `i` covers local rows
    `[i*P, (i+1)*P)` of every request; it is a thin call into `reorg_kvcache` so the two
    forms differ exactly at the offset.
    """
    offset = chunk_idx * chunk_size
    starts = [offset] * len(padded_local_chunk_seq_lens_lst)
    return reorg_kvcache(allgathered_kv_c_normed, allgathered_k_pe, padded_local_chunk_seq_lens_lst,
                         local_context_lens_allranks, starts, sum_seq_len, max_seq_len, toks, strict=strict)
