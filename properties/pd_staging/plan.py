"""pd-staging: properties of the prefill send plan (S1-S5, S7, S10, S13); the slot-overrun bug breaks them.

Research note: ../shared/research/sglang.md, section 2 (SGLang 05c7ebf, PR
#30545). The plan properties and the staged-bytes properties (plan + head
slicing + slot layout + ring offsets: S7 in bytes, and no spurious room
failure). The head slicing, slot layout and ring properties live in `ring`,
the `KVPoll` status-rule properties in `status` (same model, `pd-staging`:
the status rule is a field of the case, not a variant), the transition
system's stateful property in `system`, the bug reports in `bugs.toml`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging import plan
from kvsim.models.pd_staging.plan import cdiv
from kvsim.models.pd_staging.ring import StagingAllocator
from kvsim.models.pd_staging.variants import StagingVariant

from .cases import (PINNED, PLAN_SOMETIMES, SCENARIO_A_EARLY, SCENARIO_B, SCENARIO_D, STAGED_A_DOWN, STAGED_A_UP,
                    PlanCase, StagedCase)

MODEL = "pd-staging"


def _describe(send: plan.SendCall) -> str:
    return (f"tokens [{send.token_start}, {send.token_end}), suffix pages [{send.page_start}, {send.page_end}), "
            f"chunk_idx {send.chunk_idx}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def grid_is_whole_pages(case: PlanCase, variant: StagingVariant) -> None:
    """The grid is a positive whole number of pages, no larger than the chunked-prefill size when that holds a page."""
    cfg = case.cfg
    g, ps, cps = cfg.grid, cfg.page_size, cfg.chunked_prefill_size
    if g < ps or g % ps != 0 or cfg.full_chunk_pages * ps != g:
        raise PropertyViolation(f"grid tokens: expected a positive multiple of page size {ps}, got {g}")
    if cps is not None and cps >= ps and g > cps:
        raise PropertyViolation(f"grid tokens: expected <= chunked_prefill_size {cps}, got {g}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def prefetch_covers_suffix(case: PlanCase, variant: StagingVariant) -> None:
    """The prefetch asks slots 0..K-1 once each, full-size but the last, summing to the N suffix pages."""
    cfg = case.cfg
    reqs = plan.prefetch_plan(cfg.suffix_pages, cfg.full_chunk_pages)
    f, n = cfg.full_chunk_pages, cfg.suffix_pages
    if [r.chunk_idx for r in reqs] != list(range(cdiv(n, f))):
        raise PropertyViolation(f"STAGING_REQ chunk indices: expected 0..{cdiv(n, f) - 1}, "
                                f"got {[r.chunk_idx for r in reqs]}")
    sizes = [r.chunk_pages for r in reqs]
    if sum(sizes) != n or any(s != f for s in sizes[:-1]) or not all(1 <= s <= f for s in sizes):
        raise PropertyViolation(f"STAGING_REQ page counts: expected {f} each (the last {n - (len(sizes) - 1) * f}) "
                                f"summing to {n}, got {sizes}")


@kv_property(model=MODEL, strategy="SEGMENT_RANGES")
def grid_segments_tile_range(case: tuple[int, int, int, int], variant: StagingVariant) -> None:
    """`compute_grid_segments` tiles [start, end) in order, cutting only at grid lines D + k*grid."""
    start, end, prefix, grid = case
    segs = plan.compute_grid_segments(start, end, prefix, grid)
    if end <= start:
        if segs != ((start, start),):
            raise PropertyViolation(f"segments of empty range [{start}, {end}): expected one empty, got {segs}")
        return
    joined = [segs[0][0]] + [b for _, b in segs]
    if joined[0] != start or joined[-1] != end or any(a != b for (_, a), (b, _) in zip(segs, segs[1:])):
        raise PropertyViolation(f"segments of [{start}, {end}): expected a gapless tiling, got {segs}")
    for a, b in segs:
        if not a < b or (a - prefix) // grid != (b - 1 - prefix) // grid:
            cells = f"{(a - prefix) // grid}..{(b - 1 - prefix) // grid}"
            raise PropertyViolation(f"segment [{a}, {b}) with D={prefix}, grid={grid}: expected non-empty and "
                                    f"inside one grid cell, got cells {cells}")
    for (_, b), _next in zip(segs, segs[1:]):
        if (b - prefix) % grid != 0:
            raise PropertyViolation(f"segment cut at {b}: expected a grid line D + k*{grid} (D={prefix})")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def non_last_sends_end_on_grid(case: PlanCase, variant: StagingVariant) -> None:
    """S1: every send but the last ends on a grid line D + k*G, and no send crosses one."""
    cfg = case.cfg
    d, g = cfg.decode_prefix_len, cfg.grid
    for i, s in enumerate(case.plan(variant).sends):
        if not s.is_last and (s.token_end - d) % g != 0:
            raise PropertyViolation(f"end of non-last send {i} ({_describe(s)}): expected a grid line D + k*{g} "
                                    f"(D={d}), got {s.token_end}")
        if s.token_end > s.token_start and (s.token_start - d) // g != (s.token_end - 1 - d) // g:
            raise PropertyViolation(f"grid cells of send {i} ({_describe(s)}): expected one, got "
                                    f"{(s.token_start - d) // g}..{(s.token_end - 1 - d) // g}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def each_send_fits_one_slot(case: PlanCase, variant: StagingVariant) -> None:
    """S7 (plan level): every send's pages lie inside the one prefetched slot its chunk_idx names.

    Before 05c7ebf a prefill radix hit made the first send span several slots;
    the prefill then wrote all of it at slot chunk_idx's offset, overrunning
    the following ring allocations.
    """
    cfg = case.cfg
    f = cfg.full_chunk_pages
    slots = {r.chunk_idx: r.chunk_pages for r in plan.prefetch_plan(cfg.suffix_pages, f)}
    for i, s in enumerate(case.plan(variant).sends):
        if s.num_pages == 0:
            continue
        k = s.chunk_idx
        lo, hi = k * f, k * f + slots.get(k, 0)
        if not (lo <= s.page_start and s.page_end <= hi):
            last_slot = (s.page_end - 1) // f
            raise PropertyViolation(
                f"pages of send {i} ({_describe(s)}): expected within slot {k}'s pages [{lo}, {hi}) "
                f"({hi - lo} pages allocated), got {s.num_pages} pages spanning slots {s.page_start // f}..{last_slot}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def sends_partition_suffix(case: PlanCase, variant: StagingVariant) -> None:
    """S2: the sends tile tokens [D, L) and pages [0, N); slot k is sent exactly once with its prefetched size."""
    cfg = case.cfg
    sends = [s for s in case.plan(variant).sends if s.num_pages > 0]
    pos, page = cfg.decode_prefix_len, 0
    for i, s in enumerate(sends):
        if s.token_start != pos or s.page_start != page:
            raise PropertyViolation(f"start of send {i} ({_describe(s)}): expected token {pos}, page {page} "
                                    f"(no gap, no overlap)")
        pos, page = s.token_end, s.page_end
    if pos != cfg.prompt_len or page != cfg.suffix_pages:
        raise PropertyViolation(f"end of the sends: expected token {cfg.prompt_len}, page {cfg.suffix_pages}, "
                                f"got token {pos}, page {page}")
    got = sorted((s.chunk_idx, s.num_pages) for s in sends)
    want = sorted((r.chunk_idx, r.chunk_pages) for r in plan.prefetch_plan(cfg.suffix_pages, cfg.full_chunk_pages))
    if got != want:
        raise PropertyViolation(f"(chunk_idx, pages) of the sends: expected the prefetch plan {want}, got {got}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def exactly_one_last_send(case: PlanCase, variant: StagingVariant) -> None:
    """S3: exactly one send has is_last_chunk (it carries aux and state), and it is the final send."""
    sends = case.plan(variant).sends
    last = [i for i, s in enumerate(sends) if s.is_last]
    if last != [len(sends) - 1]:
        raise PropertyViolation(f"sends with is_last_chunk: expected only the final one ({len(sends) - 1}), "
                                f"got {last}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=PINNED, sometimes=PLAN_SOMETIMES)
def send_cursor_monotone(case: PlanCase, variant: StagingVariant) -> None:
    """S4: start_send_idx never decreases, never falls below D, and curr_idx counts the pages sent before it."""
    cfg = case.cfg
    d = cfg.decode_prefix_len
    prev = d
    for n, c in enumerate(case.plan(variant).cursors):
        if c.start_send_idx < prev or c.start_send_idx < d:
            raise PropertyViolation(f"start_send_idx after call {n}: expected >= {max(prev, d)}, "
                                    f"got {c.start_send_idx}")
        if c.curr_idx != cdiv(c.start_send_idx - d, cfg.page_size):
            raise PropertyViolation(f"curr_idx after call {n}: expected {cdiv(c.start_send_idx - d, cfg.page_size)} "
                                    f"(pages before start_send_idx {c.start_send_idx}), got {c.curr_idx}")
        prev = c.start_send_idx


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=(SCENARIO_A_EARLY,), sometimes=PLAN_SOMETIMES)
def early_send_within_snapshot(case: PlanCase, variant: StagingVariant) -> None:
    """S5: early_send_prefix_end is snapshotted once; the early send stays within it and needs a page-aligned end."""
    cfg = case.cfg
    cursor = plan.snapshot_early_send_prefix_end(plan.initial_cursor(cfg), case.prefill_hit, case.host_hit_length)
    snap = cursor.early_send_prefix_end
    if snap != max(0, case.prefill_hit - case.host_hit_length):
        raise PropertyViolation(f"early_send_prefix_end: expected max(0, {case.prefill_hit} - "
                                f"{case.host_hit_length}), got {snap}")
    grown = plan.snapshot_early_send_prefix_end(cursor, case.prompt_len, 0)  # prefix_indices grew
    if grown.early_send_prefix_end != snap:
        raise PropertyViolation(f"early_send_prefix_end after a second snapshot: expected {snap} (written once), "
                                f"got {grown.early_send_prefix_end}")
    early = [s for s in case.plan(variant).sends if s.early]
    if early and (snap % cfg.page_size != 0 or max(s.token_end for s in early) > snap):
        raise PropertyViolation(f"early sends: expected page-aligned snapshot {snap} and ends <= it, got ends "
                                f"{[s.token_end for s in early]}")


@kv_property(model=MODEL, strategy="PLAN_CASES", examples=(SCENARIO_B,), sometimes=PLAN_SOMETIMES)
def scatter_rows_stay_in_suffix(case: PlanCase, variant: StagingVariant) -> None:
    """S10: a scatter writes only the request's own suffix rows [D, D + N*ps), never the cached prefix rows [0, D)."""
    cfg = case.cfg
    d, ps = cfg.decode_prefix_len, cfg.page_size
    if not plan.staging_prefix_accepted(d, ps, variant):
        return  # the room fails at registration: nothing is scattered
    top = d + cfg.suffix_pages * ps
    for i, s in enumerate(case.plan(variant).sends):
        a, b = plan.scatter_token_range(s.page_start, s.num_pages, d, ps, variant)
        if s.num_pages and (a < d or b > top):
            raise PropertyViolation(f"req_to_token rows scattered for send {i} ({_describe(s)}): expected within "
                                    f"[{d}, {top}), got [{a}, {b})" + (" (the cached prefix rows)" if a < d else ""))


@kv_property(model=MODEL, strategy="ANY_PREFIX_PLAN_CASES", examples=(SCENARIO_D,))
def misaligned_decode_prefix_fails_room(case: PlanCase, variant: StagingVariant) -> None:
    """S13: a decode prefix that is not page-aligned fails the room at registration."""
    d, ps = case.decode_prefix_len, case.page_size
    if d % ps != 0 and plan.staging_prefix_accepted(d, ps, variant):
        raise PropertyViolation(f"registration of a room with decode prefix {d} at page size {ps}: expected "
                                f"_staging_failed (not page-aligned), got accepted")


@dataclass(frozen=True)
class StagedWrite:
    send: int
    writer: int
    slot: int
    end_in_slot: int
    slot_bytes: int
    accepted: bool


def staged_writes(case: StagedCase, variant: StagingVariant) -> list[StagedWrite]:
    """Every writer's write of every send: where it ends in its slot, and whether the prefill worker lets it go.

    Slots are allocated in order from a ring exactly as large as all of them,
    so slot k's neighbours are the live allocations of slots k+1.. .
    """
    cfg, res = case.room.cfg, case.reshard
    ps, nl, hb = cfg.page_size, case.num_layers, case.head_bytes

    def slot_layout(tokens: int) -> layout.StagingLayout:
        return layout.compute_staging_layout(res, 0, tokens, nl, hb)

    slots = [slot_layout(r.chunk_pages * ps) for r in plan.prefetch_plan(cfg.suffix_pages, cfg.full_chunk_pages)]
    slot_bytes = [lay.total_bytes for lay in slots]
    ring = StagingAllocator(sum(slot_bytes))
    offsets = []
    for size in slot_bytes:
        alloc, ring = ring.assign(size)
        assert alloc is not None
        offsets.append(alloc.offset)
    buffer = layout.prefill_buffer_bytes(res, cfg.full_chunk_pages, ps, nl, hb)
    writes = []
    for i, s in enumerate(case.room.plan(variant).sends):
        if s.num_pages == 0:
            continue
        k, sent = s.chunk_idx, slot_layout(s.num_pages * ps)
        for w in range(res.num_writers):
            nbytes = sent.writer_size(w)  # what the writer sends: all pages of the send
            end = slots[k].writer_offsets[w] + nbytes  # from its place in the slot it was named for
            ok = plan.prefill_write_accepted(end, nbytes, slot_bytes[k], offsets[k], ring.total, buffer, variant)
            writes.append(StagedWrite(i, w, k, end, slot_bytes[k], ok))
    return writes


@kv_property(model=MODEL, strategy="STAGED_CASES", examples=(STAGED_A_DOWN, STAGED_A_UP))
def staged_writes_stay_in_slot(case: StagedCase, variant: StagingVariant) -> None:
    """S7: bytes a writer is allowed to write into a slot end within that slot's allocation."""
    for w in staged_writes(case, variant):
        if w.accepted and w.end_in_slot > w.slot_bytes:
            raise PropertyViolation(
                f"bytes writer {w.writer} writes into slot {w.slot} for send {w.send}: expected <= "
                f"{w.slot_bytes} (the slot), got {w.end_in_slot}: overruns the next ring allocation")


@kv_property(model=MODEL, strategy="STAGED_CASES", examples=(STAGED_A_DOWN, STAGED_A_UP))
def staged_writes_accepted(case: StagedCase, variant: StagingVariant) -> None:
    """A room with a valid plan never fails at the prefill buffer or the slot-size check."""
    for w in staged_writes(case, variant):
        if not w.accepted:
            raise PropertyViolation(
                f"staged write of writer {w.writer} for send {w.send} (slot {w.slot}): expected accepted, got "
                f"refused ({w.end_in_slot} bytes past the slot start, slot {w.slot_bytes}): the room fails")
