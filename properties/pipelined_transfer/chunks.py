"""Properties of the chunk coordinates (research note sections 1.4 and 1.9, S4): coverage, overlap, masking,
SWA groups and the projection of the receiver's block list onto each chunk."""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pipelined_transfer.chunks import (MASKED, cdiv, positional_blocks, project_blocks_to_global_chunk,
                                                    swa_window_blocks)
from kvsim.models.pipelined_transfer.variants import PipelinedVariant

from .cases import CHUNK_SOMETIMES, PINNED, ChunkCase

MODEL = "pipelined-transfer"


@kv_property(model=MODEL, strategy="CHUNK_CASES", examples=PINNED, sometimes=CHUNK_SOMETIMES)
def slices_cover_every_block(case: ChunkCase, variant: PipelinedVariant) -> None:
    """S4: the emitted spans cover every prompt block (less the prefix under `prefix_sent`); in revision A each
    block exactly once, in B adjacent spans overlap in at most one block; ids 0..n-1, one final slice, last. With
    no pipelined layer group the final slice is the only one."""
    slices = case.slices()
    spans = case.spans()
    ids = [s.slice_id for s in slices]
    if ids != list(range(len(slices))):
        raise PropertyViolation(f"slice ids: expected 0..{len(slices) - 1}, got {ids}")
    lasts = [s.slice_id for s in slices if s.is_last]
    if lasts != [len(slices) - 1]:
        raise PropertyViolation(f"slices with is_last: expected exactly the final one [{len(slices) - 1}], "
                                f"got {lasts} (spans {spans})")
    if not any(case.pipelined()):
        if len(slices) != 1:
            raise PropertyViolation(f"no pipelined layer group: expected the final slice only, got spans {spans}")
        return
    first = case.prefix_hit // case.tokens_per_block if case.prefix_sent else 0
    covered: dict[int, int] = {}
    for lo, hi in spans:
        for b in range(lo, hi):
            covered[b] = covered.get(b, 0) + 1
    want = set(range(first, case.total_blocks))
    if set(covered) != want:
        raise PropertyViolation(f"blocks covered by spans {spans}: expected [{first}, {case.total_blocks}), got "
                                f"{sorted(covered)}")
    for (lo0, hi0), (lo1, hi1) in zip(spans, spans[1:]):
        overlap = max(0, min(hi0, hi1) - max(lo0, lo1))
        gap = lo1 > hi0
        limit = 0 if case.boundary == "A" else 1
        if gap or overlap > limit:
            raise PropertyViolation(f"adjacent spans [{lo0},{hi0}) and [{lo1},{hi1}) in revision {case.boundary}: "
                                    f"expected contiguous with at most {limit} shared block, got overlap {overlap}")


@kv_property(model=MODEL, strategy="CHUNK_CASES", examples=PINNED, sometimes=CHUNK_SOMETIMES)
def token_ranges_follow_blocks(case: ChunkCase, variant: PipelinedVariant) -> None:
    """The token range reported is the block span in tokens (clipped at the prompt for the final slice); a
    non-final slice is never empty, and the final one is always emitted."""
    slices = case.slices()
    tpb = case.tokens_per_block
    if not slices or not slices[-1].is_last:
        raise PropertyViolation(f"final slice: expected one, got {len(slices)} slices, none final")
    for s in slices:
        e = s.extent
        end = min(e.block_end * tpb, case.prompt_len) if e.is_last else e.block_end * tpb
        if (e.token_range.start, e.token_range.end) != (e.block_start * tpb, end):
            raise PropertyViolation(f"slice {s.slice_id} token range: expected [{e.block_start * tpb}, {end}), got "
                                    f"[{e.token_range.start}, {e.token_range.end})")
        if not e.is_last and e.block_end <= e.block_start:
            raise PropertyViolation(f"slice {s.slice_id}: a non-final slice with no block was emitted")


@kv_property(model=MODEL, strategy="CHUNK_CASES", examples=PINNED, sometimes=CHUNK_SOMETIMES)
def receiver_blocks_projected(case: ChunkCase, variant: PipelinedVariant) -> None:
    """Per group, every slice carries at its global positions exactly the receiver's ids for the blocks it covers
    and holds; the receiver-cached prefix is -1; a window group shorter than the prompt is not pipelined: -1 in
    every non-final slice, its final active window in the final slice."""
    tpb, total = case.tokens_per_block, case.total_blocks
    for gi, spec in enumerate(case.all_groups()):
        g = spec.group(gi)
        first_resident = max(0, g.resident_block_end - len(g.block_ids))
        windowed = spec.window is not None and spec.window < case.prompt_len
        for s in case.slices():
            got = s.block_ids_per_layer_groups[gi]
            if windowed:
                span = swa_window_blocks(case.prompt_len, tpb, spec.window) if s.is_last else range(0)
            else:
                span = s.extent.blocks
            want = tuple(g.block_ids[p - first_resident]
                         if p in span and first_resident <= p < g.resident_block_end and p >= case.rx_cached_blocks
                         else MASKED for p in range(total))
            if got != want:
                raise PropertyViolation(f"group {gi} ({spec}) in slice {s.slice_id} (blocks "
                                        f"[{s.extent.block_start},{s.extent.block_end}), last {s.is_last}): "
                                        f"expected {list(want)}, got {list(got)}")


@kv_property(model=MODEL, strategy="CHUNK_CASES", examples=PINNED, sometimes=CHUNK_SOMETIMES)
def deferred_chunks_emit_no_slice(case: ChunkCase, variant: PipelinedVariant) -> None:
    """A non-final chunk emits a slice only when the sender holds an id for it: it covers a block and some layer
    group is pipelined (upstream `_build_prefill_extent` returns None when every group's ids are -1, so no slice
    id and no result frame); the receiver's cached prefix does not count (the check runs on the sender's ids);
    the final chunk always emits."""
    tpb, pipelined = case.tokens_per_block, any(case.pipelined())
    want = []
    for i, (start, end) in enumerate(case.chunks):
        last = end == case.prompt_len
        lo = 0 if start == case.prefix_hit and not case.prefix_sent else start // tpb
        hi = cdiv(end, tpb) if case.boundary == "B" else end // tpb
        if last or (pipelined and hi > lo):
            want.append(i)
    got = [i for i, s in enumerate(case.per_chunk()) if s is not None]
    if got != want:
        raise PropertyViolation(f"chunks {list(case.chunks)} with groups {list(case.all_groups())}: expected slices "
                                f"from chunks {want}, got {got}")


@kv_property(model=MODEL, strategy="PROJECTIONS")
def projection_is_the_overlap(case: tuple[int, int, int, int, int], variant: PipelinedVariant) -> None:
    """`project_blocks_to_global_chunk` returns the resident ids whose global positions lie in the chunk, in
    order, and the positional form puts each at its position (short groups and chunks past the range: nothing)."""
    held, end, offset, count, total = case
    ids = tuple(7 + i for i in range(held))
    start = max(0, end - held)
    positions = [p for p in range(offset, offset + max(count, 0)) if start <= p < end]
    want = tuple(ids[p - start] for p in positions) if held else ()
    got = project_blocks_to_global_chunk(ids, offset, count, end)
    if got != want:
        raise PropertyViolation(f"projection of {held} ids resident up to {end} onto [{offset}, {offset + count}): "
                                f"expected {list(want)}, got {list(got)}")
    positional = positional_blocks(ids, offset, count, end, total)
    want_pos = tuple(ids[p - start] if p in positions else MASKED for p in range(total))
    if positional != want_pos:
        raise PropertyViolation(f"positional projection: expected {list(want_pos)}, got {list(positional)}")
