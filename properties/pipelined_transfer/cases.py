"""Inputs of the pipelined-transfer chunk properties, and the pinned upstream cases (no Hypothesis).

The pinned cases are the research note's (section 1.4 and 1.11): revision B's
boundary example (tpb 4, 8 blocks, token chunks (0,6), (6,12), (12,32) -> block
spans [0,2), [1,3), [3,8)), revision A's worked example (prompt 32, reuse hit 12
tokens, chunks 12..24 and 24..32 -> [0,6), [6,8) with is_last), `prefix_sent`,
a single chunk after a reuse hit degenerating to one monolithic slice, and a request whose only layer group is a
window shorter than the prompt (`ALL_SWA`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.system import Sometimes
from kvsim.models.pipelined_transfer.chunks import Group, Slice, cdiv, chunk_slices


@dataclass(frozen=True)
class GroupSpec:
    """A receiver layer group: `held` resident blocks, the suffix of `[0, resident_end)`; a window or None."""

    held: int
    resident_end: int
    window: int | None = None

    def group(self, index: int) -> Group:
        base = 1000 * (index + 1)  # destination ids distinct across groups and never -1
        return Group(tuple(base + i for i in range(self.held)), self.resident_end, self.window)


@dataclass(frozen=True)
class ChunkCase:
    prompt_len: int
    tokens_per_block: int
    chunks: tuple[tuple[int, int], ...]  # contiguous prefill chunks from prefix_hit to prompt_len
    prefix_hit: int = 0
    boundary: str = "A"
    prefix_sent: bool = False
    rx_cached_blocks: int = 0
    groups: tuple[GroupSpec, ...] = ()

    @property
    def total_blocks(self) -> int:
        return cdiv(self.prompt_len, self.tokens_per_block)

    def all_groups(self) -> tuple[GroupSpec, ...]:
        return self.groups or (GroupSpec(self.total_blocks, self.total_blocks),)

    def per_chunk(self) -> tuple[Slice | None, ...]:
        """Per prefill chunk, the slice it emits or None."""
        return chunk_slices(self.chunks, self.prompt_len, self.tokens_per_block,
                            [g.group(i) for i, g in enumerate(self.all_groups())], self.prefix_hit,
                            self.rx_cached_blocks, self.boundary, self.prefix_sent)

    def slices(self) -> tuple[Slice, ...]:
        return tuple(s for s in self.per_chunk() if s is not None)

    def pipelined(self) -> tuple[bool, ...]:
        """Per layer group: pipelined (no window, or a window covering the prompt), else sent whole at the end."""
        return tuple(g.window is None or g.window >= self.prompt_len for g in self.all_groups())

    def spans(self) -> list[tuple[int, int]]:
        return [(s.extent.block_start, s.extent.block_end) for s in self.slices()]


B_BOUNDARY = ChunkCase(32, 4, ((0, 6), (6, 12), (12, 32)), boundary="B")
B_BOUNDARY_SPANS = [(0, 2), (1, 3), (3, 8)]
A_WORKED = ChunkCase(32, 4, ((12, 24), (24, 32)), prefix_hit=12)
A_WORKED_SPANS = [(0, 6), (6, 8)]
B_PREFIX_SENT = ChunkCase(32, 4, ((12, 24), (24, 32)), prefix_hit=12, boundary="B", prefix_sent=True)
B_PREFIX_SENT_SPANS = [(3, 6), (6, 8)]
MONOLITHIC = ChunkCase(32, 4, ((12, 32),), prefix_hit=12, boundary="B")
MONOLITHIC_SPANS = [(0, 8)]
SHORT_AND_SWA = ChunkCase(10, 2, ((0, 3), (3, 7), (7, 10)), rx_cached_blocks=1,
                          groups=(GroupSpec(5, 5), GroupSpec(2, 4), GroupSpec(5, 5, window=4)))

# every group a window shorter than the prompt (issue 30): chunk 0 holds no id on the sender, so only the final
# chunk emits a slice (slice id 0)
ALL_SWA = ChunkCase(6, 2, ((0, 3), (3, 6)), groups=(GroupSpec(3, 3, window=2),))

PINNED = (B_BOUNDARY, A_WORKED, B_PREFIX_SENT, MONOLITHIC, SHORT_AND_SWA, ALL_SWA)


# -- what some drawn request must be (`sometimes`: a strategy that never draws these corners checks nothing there) ----

def _cut_inside_a_block(case: ChunkCase) -> bool:
    return any(end % case.tokens_per_block for _, end in case.chunks[:-1])


def _reuse_hit(case: ChunkCase) -> bool:
    return case.prefix_hit > 0


def _windowed(case: ChunkCase) -> bool:
    return not all(case.pipelined())


def _several_slices(case: ChunkCase) -> bool:
    return len(case.slices()) > 1


# the strategy of the chunk properties (`CHUNK_CASES`): revision B's boundary, revision A's reuse hit, a window
CHUNK_SOMETIMES = (
    Sometimes("a_chunk_ends_inside_a_block", _cut_inside_a_block,
              "a prefill chunk ends mid-block (the boundary block the two revisions send differently)"),
    Sometimes("a_reuse_hit", _reuse_hit, "the request reuses a cached prefix (revision A's worked example)"),
    Sometimes("a_window_shorter_than_the_prompt", _windowed, "a layer group sent whole at the end, not pipelined"),
    Sometimes("several_slices", _several_slices, "the request is sent in two or more slices"),
)
