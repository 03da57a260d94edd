"""Chunk coordinates of the pipelined KV send (TensorRT-LLM #15727), as pure functions.

Research note ../shared/research/trtllm_flashinfer.md, sections 1.3 and 1.4
(the sender's `_build_prefill_extent` and the test revision's `ChunkCoords`).
Inputs per forward step: the prefill chunk `(chunk_start_pos, chunk_end_pos)` in
tokens, `prepopulated_prompt_len` (the context side's reuse hit),
`context_remaining_length` and `tokens_per_block` (tpb).

- first chunk: `chunk_start_pos == prepopulated_prompt_len`; last chunk:
  `context_remaining_length == 0`;
- block start: 0 for the first chunk (the reused prefix travels with slice 0),
  else `floor(start / tpb)`; with `prefix_sent` (early reuse, revision B) slice
  0 starts at its own block;
- block end: `ceil(end / tpb)` for the last chunk; for a non-final chunk revision
  A floors it (the partial block goes with the next chunk), revision B rounds up
  (the partial block is sent stale and again, complete, by the next chunk);
- a non-final chunk covering no block is not emitted; the final chunk always is;
- nor is a non-final chunk in which no layer group is pipelined (every group a
  window shorter than the prompt): the sender's ids for it are all -1, and
  `_build_prefill_extent` returns None, so no slice id and no result frame;
- token range: `[bs * tpb, min(be * tpb, prompt_len))` for the last chunk, else
  `[bs * tpb, be * tpb)`;
- a sliding-window group with `window < prompt_len` is not pipelined: non-final
  slices carry nothing for it, the final slice its whole final window;
- the receiver's own cached prefix is masked with -1 (the sender skips it);
- `project_blocks_to_global_chunk`: the receiver's resident block list of a
  group (the suffix of `[0, resident_block_end)`) cut to a chunk by overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvsim.engine.errors import ConfigError, check_int

BOUNDARIES = ("A", "B")  # A: floor a non-final chunk's end; B: round it up (one-block overlap)
MASKED = -1  # "nothing here / not in this chunk"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TokenRange:
    """Half-open `[start, end)`, non-negative, `start <= end` (an empty range is valid)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ConfigError("TokenRange", "0 <= start <= end", (self.start, self.end))


@dataclass(frozen=True)
class ChunkExtent:
    """What one emitted slice covers: its block span, the token range reported and `is_last`."""

    block_start: int
    block_end: int
    token_range: TokenRange
    is_last: bool

    @property
    def blocks(self) -> range:
        return range(self.block_start, self.block_end)


def prefill_chunks(prompt_len: int, prepopulated_prompt_len: int, chunk_tokens: int) -> tuple[tuple[int, int], ...]:
    """The scheduler's prefill chunks `(chunk_start_pos, chunk_end_pos)` after a reuse hit of `prepopulated`."""
    check_int(prompt_len, "prompt_len", minimum=1)
    check_int(prepopulated_prompt_len, "prepopulated_prompt_len", minimum=0, maximum=prompt_len - 1)
    check_int(chunk_tokens, "chunk_tokens", minimum=1)
    out, pos = [], prepopulated_prompt_len
    while pos < prompt_len:
        end = min(pos + chunk_tokens, prompt_len)
        out.append((pos, end))
        pos = end
    return tuple(out)


def is_first_chunk(chunk_start_pos: int, prepopulated_prompt_len: int) -> bool:
    return chunk_start_pos == prepopulated_prompt_len


def is_last_chunk(context_remaining_length: int) -> bool:
    return context_remaining_length == 0


def chunk_extent(chunk_start_pos: int, chunk_end_pos: int, *, prepopulated_prompt_len: int,
                 context_remaining_length: int, tokens_per_block: int, prompt_len: int, boundary: str = "A",
                 prefix_sent: bool = False) -> ChunkExtent | None:
    """The extent of the slice a forward step emits, or None for a non-final chunk covering no block."""
    if boundary not in BOUNDARIES:
        raise ConfigError("boundary", f"one of {', '.join(BOUNDARIES)}", boundary)
    tpb = tokens_per_block
    first = is_first_chunk(chunk_start_pos, prepopulated_prompt_len)
    last = is_last_chunk(context_remaining_length)
    block_start = 0 if first and not prefix_sent else chunk_start_pos // tpb
    if last or boundary == "B":
        block_end = cdiv(chunk_end_pos, tpb)
    else:
        block_end = chunk_end_pos // tpb
    if block_end <= block_start and not last:
        return None  # covers no block: not emitted, consumes no slice id
    block_end = max(block_end, block_start)
    end_tok = min(block_end * tpb, prompt_len) if last else block_end * tpb
    return ChunkExtent(block_start, block_end, TokenRange(block_start * tpb, end_tok), last)


def extents_of(chunks: Sequence[tuple[int, int]], prompt_len: int, tokens_per_block: int,
               prepopulated_prompt_len: int = 0, boundary: str = "A",
               prefix_sent: bool = False) -> tuple[tuple[int, ChunkExtent | None], ...]:
    """Per prefill chunk, in order: (chunk index, its extent or None); `chunks` contiguous, from the reuse hit to
    the prompt's end."""
    out = []
    for i, (start, end) in enumerate(chunks):
        ext = chunk_extent(start, end, prepopulated_prompt_len=prepopulated_prompt_len,
                           context_remaining_length=prompt_len - end, tokens_per_block=tokens_per_block,
                           prompt_len=prompt_len, boundary=boundary, prefix_sent=prefix_sent)
        out.append((i, ext))
    return tuple(out)


def project_blocks_to_global_chunk(block_ids: Sequence[int], chunk_block_offset: int, chunk_block_count: int,
                                   resident_block_end: int) -> tuple[int, ...]:
    """The entries of `block_ids` (the resident suffix of `[0, resident_block_end)`) that overlap the chunk
    `[chunk_block_offset, chunk_block_offset + chunk_block_count)`; empty when they do not overlap."""
    held = len(block_ids)
    if chunk_block_count <= 0 or held == 0:
        return ()
    first_resident = max(0, resident_block_end - held)
    lo = max(chunk_block_offset, first_resident)
    hi = min(chunk_block_offset + chunk_block_count, resident_block_end)
    if lo >= hi:
        return ()
    return tuple(block_ids[lo - first_resident:hi - first_resident])


def positional_blocks(block_ids: Sequence[int], chunk_block_offset: int, chunk_block_count: int,
                      resident_block_end: int, total_blocks: int) -> tuple[int, ...]:
    """The newer revisions' positional form: `total_blocks` entries, the chunk's projected ids at their global
    positions and -1 everywhere else (outside the chunk, or outside the group's resident range)."""
    out = [MASKED] * total_blocks
    first_resident = max(0, resident_block_end - len(block_ids))
    lo = max(chunk_block_offset, first_resident)
    for i, bid in enumerate(project_blocks_to_global_chunk(block_ids, chunk_block_offset, chunk_block_count,
                                                           resident_block_end)):
        if lo + i < total_blocks:
            out[lo + i] = bid
    return tuple(out)


def mask_receiver_cached(block_ids: Sequence[int], cached_blocks: int) -> tuple[int, ...]:
    """The receiver's whole-prompt destination list with its own cached prefix masked: the sender skips it."""
    return tuple(MASKED if i < cached_blocks else b for i, b in enumerate(block_ids))


def swa_window_blocks(prompt_len: int, tokens_per_block: int, sliding_window: int) -> range:
    """Blocks of a sliding-window group's final active window (tokens `[prompt_len - window, prompt_len)`)."""
    first = max(0, prompt_len - sliding_window) // tokens_per_block
    return range(first, cdiv(prompt_len, tokens_per_block))


def is_pipelined_group(prompt_len: int, sliding_window: int | None) -> bool:
    """A full-attention group is pipelined; a window group only when its window covers the whole prompt."""
    return sliding_window is None or sliding_window >= prompt_len


@dataclass(frozen=True)
class Slice:
    """One emitted slice: sender `slice_id`, its extent, and per layer group the positional destination ids."""

    slice_id: int
    extent: ChunkExtent
    block_ids_per_layer_groups: tuple[tuple[int, ...], ...]

    @property
    def is_last(self) -> bool:
        return self.extent.is_last


@dataclass(frozen=True)
class Group:
    """A receiver layer group: its resident destination ids (suffix of `[0, resident_block_end)`), its window."""

    block_ids: tuple[int, ...]
    resident_block_end: int
    sliding_window: int | None = None


def all_deferred(prompt_len: int, groups: Sequence[Group]) -> bool:
    """No layer group is pipelined: the sender's ids of every group are -1 in every non-final chunk."""
    return not any(is_pipelined_group(prompt_len, g.sliding_window) for g in groups)


def chunk_slices(chunks: Sequence[tuple[int, int]], prompt_len: int, tokens_per_block: int, groups: Sequence[Group],
                 prepopulated_prompt_len: int = 0, receiver_cached_blocks: int = 0, boundary: str = "A",
                 prefix_sent: bool = False) -> tuple[Slice | None, ...]:
    """Per prefill chunk, in order, the slice its forward step emits or None; slice ids 0, 1, ... over the emitted.

    A non-final chunk emits nothing when it covers no block, or when every group is deferred (`all_deferred`):
    upstream's check that some group holds an id (>= 0) runs on the sender's own ids, before the receiver's cached
    prefix is masked, so a chunk the receiver already holds is still emitted."""
    total = cdiv(prompt_len, tokens_per_block)
    deferred = all_deferred(prompt_len, groups)
    out: list[Slice | None] = []
    emitted = 0
    for _, ext in extents_of(chunks, prompt_len, tokens_per_block, prepopulated_prompt_len, boundary, prefix_sent):
        if ext is None or (deferred and not ext.is_last):
            out.append(None)
            continue
        per_group = []
        for g in groups:
            if is_pipelined_group(prompt_len, g.sliding_window):
                lo, count = ext.block_start, ext.block_end - ext.block_start
            elif ext.is_last:  # not pipelined: the final slice carries the whole final window
                window = swa_window_blocks(prompt_len, tokens_per_block, g.sliding_window)  # type: ignore[arg-type]
                lo, count = window.start, len(window)
            else:
                lo, count = 0, 0
            ids = positional_blocks(g.block_ids, lo, count, g.resident_block_end, total)
            per_group.append(mask_receiver_cached(ids, receiver_cached_blocks))
        out.append(Slice(emitted, ext, tuple(per_group)))
        emitted += 1
    return tuple(out)


def build_slices(chunks: Sequence[tuple[int, int]], prompt_len: int, tokens_per_block: int, groups: Sequence[Group],
                 prepopulated_prompt_len: int = 0, receiver_cached_blocks: int = 0, boundary: str = "A",
                 prefix_sent: bool = False) -> tuple[Slice, ...]:
    """Every slice the sender emits for one request's prefill `chunks`, slice ids 0, 1, ... in submission order."""
    return tuple(s for s in chunk_slices(chunks, prompt_len, tokens_per_block, groups, prepopulated_prompt_len,
                                         receiver_cached_blocks, boundary, prefix_sent) if s is not None)
