"""Prefill send plan of the SGLang PD staging path: grid, flooring, segments, prefetch, early send.

Follows sglang 05c7ebf (PR #30545, "[Disagg][StagingBuffer][2/2] Support
radix cache") and its parent: the prefill `send_kv_chunk` path under
`python/sglang/srt/disaggregation/` (grid flooring, `compute_grid_segments`,
the early send of the cached prefix) and the `STAGING_REQ` prefetch of the
Mooncake/NIXL prefill managers, as read in the research note
../shared/research/sglang.md, sections 2.2, 2.3, 2.5 and 2.9 (the note
does not record which helper module each function lives in).

The decode side allocates one staging slot per grid cell of the suffix:
slot ``k`` holds suffix pages ``[k*F, k*F + min(F, N - k*F))`` where
``F = full_chunk_pages`` and ``N`` the suffix pages. A prefill send is named
by ``chunk_idx = page_start // F`` and written into that one slot.

Variants differ only where 05c7ebf changed the code (`variants.StagingVariant`, one flag each):

- ``fixed``: a non-last send is floored to a page and then to the grid
  (relative to the decode prefix ``D``), split at grid lines, one `send` per
  segment; the early send of the cached prefix runs under staging; the
  scatter adds ``D`` to its row offset; a non-page-aligned ``D`` fails the room.
- ``pre_05c7ebf``: non-last sends are only page-floored and sent whole (one
  `send` per call, possibly spanning several slots after a radix hit); no
  early send under staging; the scatter ignores ``D``; any ``D`` accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsim.engine.errors import ConfigError, check_int, require

from .variants import FIXED, StagingVariant

DEFAULT_CHUNKED_PREFILL_SIZE = 8192  # upstream `chunked_prefill_size or 8192`


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_tokens(chunked_prefill_size: int | None, page_size: int) -> int:
    """Tokens per staging slot: whole pages, at least one.

    ``None`` or 0 falls back to 8192. Chunking disabled (-1) gives ``-1 // ps = -1``,
    so one page per slot: correct, at the price of one STAGING_REQ per page.
    """
    check_int(page_size, "page_size", minimum=1)
    cps = chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
    check_int(cps, "chunked_prefill_size")
    return max(1, cps // page_size) * page_size


def full_chunk_pages(grid: int, page_size: int) -> int:
    """F: pages per full slot."""
    return grid // page_size


def floor_page(tokens: int, page_size: int) -> int:
    return (tokens // page_size) * page_size


@dataclass(frozen=True)
class StagingPlanConfig:
    """One room: prompt length L, decode prefix D (the grid base), page size, chunked-prefill size."""

    prompt_len: int
    decode_prefix_len: int
    page_size: int
    chunked_prefill_size: int | None = DEFAULT_CHUNKED_PREFILL_SIZE

    def __post_init__(self) -> None:
        check_int(self.prompt_len, "prompt_len", minimum=1)
        check_int(self.page_size, "page_size", minimum=1)
        # the decode side must still receive at least the last token's KV
        check_int(self.decode_prefix_len, "decode_prefix_len", minimum=0, maximum=self.prompt_len - 1)
        cps = self.chunked_prefill_size
        if cps is not None and (isinstance(cps, bool) or not isinstance(cps, int) or (cps < 1 and cps != -1)):
            raise ConfigError("chunked_prefill_size", "None, -1 (disabled) or an integer >= 1", cps)

    @property
    def grid(self) -> int:
        return grid_tokens(self.chunked_prefill_size, self.page_size)

    @property
    def full_chunk_pages(self) -> int:
        return full_chunk_pages(self.grid, self.page_size)

    @property
    def suffix_pages(self) -> int:
        """N: decode suffix pages, `len(dst_kv_indices)`."""
        return cdiv(self.prompt_len - self.decode_prefix_len, self.page_size)

    @property
    def num_chunks(self) -> int:
        """K: staging slots the room needs."""
        return cdiv(self.suffix_pages, self.full_chunk_pages)

    @property
    def batch_tokens(self) -> int:
        """Tokens per prefill forward batch; chunking disabled means the whole prompt at once."""
        cps = self.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
        return self.prompt_len if cps == -1 else cps

    def slot_token_range(self, k: int) -> tuple[int, int]:
        """Absolute tokens slot k covers (the last slot is cut at L)."""
        d, g = self.decode_prefix_len, self.grid
        return d + k * g, min(self.prompt_len, d + (k + 1) * g)


@dataclass(frozen=True)
class StagingReq:
    """`STAGING_REQ(room, chunk_idx, chunk_pages, session)`, the prefetch of one slot."""

    chunk_idx: int
    chunk_pages: int


def prefetch_plan(total_pages: int, full_pages: int) -> tuple[StagingReq, ...]:
    """One STAGING_REQ per slot k: `min(F, total_pages - k*F)` pages, `ceil(total_pages / F)` slots."""
    check_int(total_pages, "total_pages", minimum=0)
    check_int(full_pages, "full_chunk_pages", minimum=1)
    return tuple(StagingReq(k, min(full_pages, total_pages - k * full_pages))
                 for k in range(cdiv(total_pages, full_pages)))


def floor_non_last_end(end: int, decode_prefix_len: int, page_size: int, grid: int,
                       variant: StagingVariant = FIXED) -> int:
    """Where a non-last send stops; the remainder rides with the next send."""
    end = floor_page(end, page_size)
    if variant.grid_floored_sends:
        # 05c7ebf: floor to the grid too, so a non-last send never ends inside a slot
        end = decode_prefix_len + ((end - decode_prefix_len) // grid) * grid
    return end


def compute_grid_segments(start: int, end: int, decode_prefix_len: int, grid: int) -> tuple[tuple[int, int], ...]:
    """Split `[start, end)` at the grid lines `D + k*grid`.

    An empty range yields one empty segment: a metadata-only last chunk must still be sent.
    """
    require(start >= decode_prefix_len, "start", f"a token index >= the decode prefix {decode_prefix_len}", start)
    check_int(grid, "grid", minimum=1)
    if end <= start:
        return ((start, start),)
    segments = []
    a = start
    while a < end:
        b = min(end, decode_prefix_len + ((a - decode_prefix_len) // grid + 1) * grid)
        segments.append((a, b))
        a = b
    return tuple(segments)


@dataclass(frozen=True)
class SendCall:
    """One `sender.send(pages)`: `index_slice = [page_start, page_start + num_pages)` in suffix pages."""

    token_start: int
    token_end: int
    page_start: int
    num_pages: int
    chunk_idx: int
    is_last: bool  # `is_last_chunk`: curr_idx reached num_kv_indices; aux and state ride on it
    early: bool = False  # part of the early send of the cached prefix

    @property
    def page_end(self) -> int:
        return self.page_start + self.num_pages


@dataclass(frozen=True)
class SendCursor:
    """Prefill-side send state of one request: `start_send_idx`, sender `curr_idx`, the early-send snapshot."""

    start_send_idx: int
    curr_idx: int = 0
    early_send_prefix_end: int | None = None


def initial_cursor(cfg: StagingPlanConfig) -> SendCursor:
    """The cursor starts at the decode prefix; `curr_idx` counts pages from the first suffix page."""
    return SendCursor(cfg.decode_prefix_len)


def send_pages(cfg: StagingPlanConfig, start: int, end: int) -> int:
    """Pages of `[start, end)`: one per `page_size` tokens from `start` (upstream's `req_to_token[start:end][::ps]`).

    The model used to count from D (`cdiv(end - D, ps) - (start - D) // ps`), one page too many on every send
    after the first when D is not page-aligned; `kvsim conform sglang` against 0.5.13-0.5.17 found it. With
    an aligned D (the only kind 05c7ebf admits) the two counts agree.
    """
    return cdiv(end - start, cfg.page_size)


def send_batch(cfg: StagingPlanConfig, cursor: SendCursor, end: int, last: bool,
               variant: StagingVariant = FIXED, early: bool = False) -> tuple[SendCursor, tuple[SendCall, ...]]:
    """`send_kv_chunk` after a prefill batch that computed up to `end` (steps 2-6 of section 2.3)."""
    start = cursor.start_send_idx
    if not last:
        end = floor_non_last_end(end, cfg.decode_prefix_len, cfg.page_size, cfg.grid, variant)
    if end < start:
        return cursor, ()
    if variant.grid_segmented_sends:
        segments = compute_grid_segments(start, end, cfg.decode_prefix_len, cfg.grid)
    else:
        segments = ((start, end),)  # pre-05c7ebf: one send per call, whatever slots it spans
    calls = []
    curr = cursor.curr_idx
    for i, (a, b) in enumerate(segments):
        n = send_pages(cfg, a, b)
        final = last and i == len(segments) - 1
        if n <= 0 and not final:
            continue
        calls.append(SendCall(a, b, curr, n, curr // cfg.full_chunk_pages,
                              is_last=curr + n == cfg.suffix_pages, early=early))
        curr += n
    return replace(cursor, start_send_idx=end, curr_idx=curr), tuple(calls)


def snapshot_early_send_prefix_end(cursor: SendCursor, prefix_len: int, host_hit_length: int = 0) -> SendCursor:
    """First batch only: `early_send_prefix_end = max(0, len(prefix_indices) - host_hit_length)`.

    A snapshot, written once: `prefix_indices` keeps growing under the overlap
    scheduler, and a later, larger value would send pages not computed yet.
    """
    if cursor.early_send_prefix_end is not None:
        return cursor
    return replace(cursor, early_send_prefix_end=max(0, prefix_len - host_hit_length))


def early_send(cfg: StagingPlanConfig, cursor: SendCursor, bootstrap_done: bool = True,
               variant: StagingVariant = FIXED) -> tuple[SendCursor, tuple[SendCall, ...]]:
    """Ship `[start_send_idx, early_send_prefix_end)` as a non-last send, when allowed."""
    limit = cursor.early_send_prefix_end
    if not variant.early_send_under_staging or limit is None or not bootstrap_done:
        return cursor, ()  # pre-05c7ebf: early send disabled whenever staging is on
    if limit % cfg.page_size != 0 or limit <= cursor.start_send_idx:
        return cursor, ()
    return send_batch(cfg, cursor, limit, last=False, variant=variant, early=True)


def prefill_batch_ends(cfg: StagingPlanConfig, prefill_hit: int) -> tuple[int, ...]:
    """Ends of the prefill forward batches: the radix hit is not recomputed, then `cps` tokens each."""
    check_int(prefill_hit, "prefill_hit", minimum=0, maximum=cfg.prompt_len - 1)
    ends, pos = [], prefill_hit
    while pos < cfg.prompt_len:
        pos = min(cfg.prompt_len, pos + cfg.batch_tokens)
        ends.append(pos)
    return tuple(ends)


@dataclass(frozen=True)
class RoomPlan:
    sends: tuple[SendCall, ...]
    cursors: tuple[SendCursor, ...]  # the cursor after each send_kv_chunk call, early send included
    batch_ends: tuple[int, ...]
    prefetch: tuple[StagingReq, ...]


def plan_room_sends(cfg: StagingPlanConfig, prefill_hit: int = 0, host_hit_length: int = 0,
                    early_send_enabled: bool = True, variant: StagingVariant = FIXED) -> RoomPlan:
    """Every `send` of one room in order: the optional early send, then one call per prefill batch.

    Assumes bootstrap is done before the first batch (the early send is
    otherwise skipped, which only moves its pages into the first batch send).
    """
    cursor = initial_cursor(cfg)
    cursors, sends = [cursor], []
    if early_send_enabled:
        cursor = snapshot_early_send_prefix_end(cursor, prefill_hit, host_hit_length)
        cursor, calls = early_send(cfg, cursor, True, variant)
        cursors.append(cursor)
        sends.extend(calls)
    ends = prefill_batch_ends(cfg, prefill_hit)
    for end in ends:
        cursor, calls = send_batch(cfg, cursor, end, end == cfg.prompt_len, variant)
        cursors.append(cursor)
        sends.extend(calls)
    return RoomPlan(tuple(sends), tuple(cursors), ends, prefetch_plan(cfg.suffix_pages, cfg.full_chunk_pages))


def staging_prefix_accepted(decode_prefix_len: int, page_size: int, variant: StagingVariant = FIXED) -> bool:
    """`register_decode_req`: 05c7ebf fails the room (`_staging_failed`) when D is not page-aligned."""
    return not variant.aligned_prefix_check or decode_prefix_len % page_size == 0


def scatter_token_range(page_start: int, num_pages: int, decode_prefix_len: int, page_size: int,
                        variant: StagingVariant = FIXED) -> tuple[int, int]:
    """Rows of `req_to_token` a scatter of suffix pages `[page_start, +num_pages)` writes.

    Before 05c7ebf the decode prefix was left out, so with a decode radix hit
    the suffix landed on the cached (shared) prefix rows.
    """
    base = decode_prefix_len if variant.scatter_adds_decode_prefix else 0
    start = base + page_start * page_size
    return start, start + num_pages * page_size


def prefill_write_accepted(end_in_slot: int, nbytes: int, slot_bytes: int, slot_offset: int, ring_total: int,
                           buffer_bytes: int, variant: StagingVariant = FIXED) -> bool:
    """Does the prefill worker go ahead with a staged write (else it fails the room)?

    The writer's `nbytes` end at `end_in_slot` bytes from the slot's start.
    The prefill-local staging buffer (one grid slot of this rank's full KV
    since #31217) must hold them. Then the decode-size check: 05c7ebf compares
    against the slot; before it, against the rest of the ring
    (`total_size - offset`), so a multi-slot send passed and overran the
    following ring allocations.
    """
    if nbytes > buffer_bytes:
        return False
    if variant.slot_size_write_check:
        return end_in_slot <= slot_bytes
    return slot_offset + end_in_slot <= ring_total
