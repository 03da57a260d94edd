"""toyengine's MLA chunked-context planner, in the shape kvsim's conform target
`vllm:plan_mla_context_chunks` expects (the parameters and the plan fields of vLLM's
`plan_mla_context_chunks`; written for this example, not taken from vLLM).

Requests' context rows are packed greedily, in request order, into chunks of at most `row_budget`
workspace rows (`padded_rows(r)` is the cost of rows [0, r)); a request that does not fit is split
at the widest multiple of `split_alignment` that fits and continues in the next chunk.

`ENGINE_CI_PLANTED_BUG=budget` plants an off-by-one in the fit test (a request that exactly fills the
budget is split instead), for the example's test of the test.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field


@dataclass
class ContextChunk:
    request_start: int
    request_end: int = 0
    starts: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    is_continuation: bool = False

    def take(self, start: int, rows: int) -> None:
        if not self.starts:
            self.is_continuation = start > 0
        self.starts.append(start)
        self.seq_lens.append(rows)
        self.request_end = self.request_start + len(self.starts)


def fits(used: int, cost: int, row_budget: int) -> bool:
    if os.environ.get("ENGINE_CI_PLANTED_BUG") == "budget":
        return used + cost < row_budget
    return used + cost <= row_budget


def widest_split(start: int, remaining: int, room: int, max_context_chunk: int, alignment: int,
                 padded_rows) -> int:
    """The widest aligned piece of [start, start + remaining - 1) costing at most `room` rows (0: none)."""
    units = min(max_context_chunk, (remaining - 1) // alignment * alignment) // alignment
    base = padded_rows(start)
    low, high = 0, units  # invariant: `low` units fit; more than `high` do not
    while low < high:
        probe = high - (high - low) // 2
        if padded_rows(start + probe * alignment) - base <= room:
            low = probe
        else:
            high = probe - 1
    return low * alignment


def plan_mla_context_chunks(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows):
    assert row_budget >= 1 and split_alignment >= 1, "row budget and alignment must be positive"
    assert max_context_chunk >= split_alignment and max_context_chunk % split_alignment == 0, \
        "max_context_chunk must be a positive multiple of the alignment"
    chunks: list[ContextChunk] = []
    request, offset = 0, 0
    while request < len(context_lens):
        if context_lens[request] == 0:
            request += 1
            continue
        chunk, used = ContextChunk(request), 0
        while request < len(context_lens) and context_lens[request] > 0:
            remaining = context_lens[request] - offset
            cost = padded_rows(offset + remaining) - padded_rows(offset)
            if fits(used, cost, row_budget):
                chunk.take(offset, remaining)
                used += cost
                request, offset = request + 1, 0
                continue
            piece = widest_split(offset, remaining, row_budget - used, max_context_chunk, split_alignment,
                                 padded_rows)
            if piece:
                chunk.take(offset, piece)
                offset += piece
            break
        assert chunk.starts, f"row budget {row_budget} has no room for request {request}"
        chunks.append(chunk)
    return chunks


def align_mla_chunked_context_workspace_size(vllm_config, workspace_size):
    """The workspace rounded up to the split alignment (the block, or lcm(block, world * interleave))."""
    block = vllm_config.cache_config.block_size
    world = vllm_config.parallel_config.decode_context_parallel_size
    interleave = vllm_config.parallel_config.cp_kv_cache_interleave_size
    alignment = block if world == 1 else math.lcm(block, world * interleave)
    return -(-max(workspace_size, alignment) // alignment) * alignment
