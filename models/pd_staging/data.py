"""Configuration and KV data of the pd-staging transition system: who holds which (request, token, head).

Follows sglang 05c7ebf (PR #30545) as read in ../shared/research/sglang.md,
sections 2.3 ("Decode scatter", "Layout of one slot") and 2.5. The bytes are
tracked, not inferred from flags, so overwrite and loss are seen on data:

- A KV cell is an int. Prefill token ``t`` of room ``r``, head slice ``w``
  (the slice writer ``w`` owns) is ``value(r, t, w) > 0``; a row of the shared
  decode radix prefix holds ``prefix_value(t, w) < 0``; a staging ring byte
  never written since the process started is ``GARBAGE``; a decode suffix row
  never scattered is ``UNWRITTEN``.
- The staging ring is one flat tuple of cells. A ring unit is one page of one
  writer's head slice, ``page_size`` cells; a slot of ``chunk_pages`` pages is
  ``chunk_pages * W`` units, writer ``w`` at ``w * chunk_pages`` units from its
  start (writers back to back, as in `compute_staging_layout`).
- The decode rows of a room are its own suffix pages ``[D, D + N*ps)``; the
  prefix rows ``[0, D)`` are shared radix pages, one copy for all rooms.

Head slicing itself is checked in `pd_staging_layout`; here each of the W
writers owns one head slice of the decode rank (W = P_tp / D_tp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import repeat
from operator import add

from kvsim.engine.errors import ConfigError, check_int
from kvsim.engine.params import param

from .plan import (SendCall, StagingPlanConfig, early_send, initial_cursor, prefetch_plan, prefill_batch_ends,
                   send_batch, snapshot_early_send_prefix_end)
from .variants import StagingVariant

GARBAGE = -(10 ** 6)
UNWRITTEN = 0
HEAD_SLICES = 8  # head slices one KV cell value can name: the most writers any configuration may have
TOKENS = 4096  # tokens one room's cell values can name: prompts are shorter
MAX_PROMPT_LEN = TOKENS - 1

FAULT_KINDS = ("drop_req", "drop_rsp", "drop_ready", "drop_status", "drop_wm", "drop_abort",
               "dup_req", "dup_ready", "reorder", "abort", "peer_death",
               # after 05c7ebf's model: a sibling destination defers (the worker re-enqueues the whole chunk;
               # needs dsts >= 2), a lost ABORT_ACK, the deferred release's 30 s timeout passing
               "defer_dst", "drop_ack", "release_timeout")
DEFAULT_FAULTS = "drop_ready,abort,peer_death"


def value(room: int, token: int, writer: int) -> int:
    """The prefill's KV for (request, token, head slice)."""
    return ((room + 1) * TOKENS + token) * HEAD_SLICES + writer + 1


def values(room: int, token: int, writer: int, count: int) -> range:
    """`value(room, token + j, writer)` for j in [0, count): consecutive tokens step by `HEAD_SLICES`."""
    first = value(room, token, writer)
    return range(first, first + count * HEAD_SLICES, HEAD_SLICES)


def prefix_value(token: int, writer: int) -> int:
    """What a shared radix-prefix row holds: the cached KV of that prompt token (not a request's suffix)."""
    return -(token * HEAD_SLICES + writer + 1)


def parse_faults(text: str) -> tuple[str, ...]:
    """`drop_ready,abort` -> ("drop_ready", "abort"); "" and "none" are no faults."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip() and k.strip() != "none")
    for k in kinds:
        if k not in FAULT_KINDS:
            raise ConfigError("param faults", f"a comma-separated subset of {', '.join(FAULT_KINDS)}", text)
    return kinds


@dataclass(frozen=True)
class StagingSystemConfig:
    """One decode rank, W prefill writer ranks, `rooms` requests of the same geometry.

    The `param()` fields are `kvsim explore pd-staging --param`, their bounds what explore finishes; the
    timed simulation builds this config from its own `SimConfig` (many rooms, more writers), so
    `__post_init__` checks only what the model itself needs (the cell encoding, a consistent geometry).
    """

    rooms: int = param(1, "requests sharing the decode rank and its staging ring", minimum=1, maximum=2)
    writers: int = param(1, "W = P_tp / D_tp prefill writer ranks per decode rank", minimum=1, maximum=2)
    page_size: int = param(1, "tokens per KV page", minimum=1, maximum=16)
    chunked_prefill_size: int = param(1, "prefill batch tokens; the grid is its whole pages", minimum=1, maximum=512)
    prompt_len: int = param(2, "L: prompt tokens", minimum=1, maximum=MAX_PROMPT_LEN)
    decode_prefix_len: int = param(0, "D: tokens the decode radix cache already holds", minimum=0,
                                   maximum=MAX_PROMPT_LEN - 1)
    prefill_hit: int = param(0, "tokens the prefill radix cache already holds", minimum=0, maximum=MAX_PROMPT_LEN - 1)
    ring_units: int = param(0, "staging ring size in pages of one writer's heads (0: every slot fits)", minimum=0,
                            maximum=64)
    faults: str = param(DEFAULT_FAULTS, "comma-separated fault kinds: " + ", ".join(FAULT_KINDS))
    fault_budget: int = param(1, "fault actions allowed on one path", minimum=0, maximum=3)
    timeouts: bool = param(True, "1: the decode waiting timeout and (fixed) the completion deadline may pass")
    dsts: int = param(1, "destinations per prefill writer rank (D_tp / P_tp when prefill TP < decode TP): the "
                         "modelled decode rank and dsts - 1 sibling ranks the transfer worker also writes; "
                         "W >= 2 with dsts >= 2 needs PP prefill writers (0.5.23)", minimum=1, maximum=2)
    deferred_release: bool = param(True, "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE (variants with the "
                                         "mechanism, 0.5.21+): 1 holds a failed room's slots until every ABORT_ACK")
    # The timed simulation's network (not a --param): any message in flight may arrive next, and the fault
    # plan, not a budget, drops and duplicates messages and kills the prefill.
    timed: bool = False
    fault_kinds: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.rooms, "rooms", minimum=1)
        check_int(self.writers, "writers", minimum=1, maximum=HEAD_SLICES)
        check_int(self.prompt_len, "prompt_len", minimum=1, maximum=MAX_PROMPT_LEN)
        check_int(self.prefill_hit, "prefill_hit", minimum=0, maximum=self.prompt_len - 1)
        check_int(self.fault_budget, "fault_budget", minimum=0)
        check_int(self.ring_units, "ring_units", minimum=0)
        object.__setattr__(self, "fault_kinds", parse_faults(self.faults))
        self.plan  # validates page size, prefix and chunked-prefill size

    # derived once per config (frozen): a step asks for them on every write and scatter
    @cached_property
    def plan(self) -> StagingPlanConfig:
        return StagingPlanConfig(self.prompt_len, self.decode_prefix_len, self.page_size, self.chunked_prefill_size)

    @cached_property
    def slot_pages(self) -> tuple[int, ...]:
        """Pages of slot k, as the prefetch asks for them (`min(F, N - k*F)`)."""
        p = self.plan
        return tuple(r.chunk_pages for r in prefetch_plan(p.suffix_pages, p.full_chunk_pages))

    @property
    def total_units(self) -> int:
        return self.ring_units or self.rooms * self.writers * sum(self.slot_pages)

    @cached_property
    def buffer_pages(self) -> int:
        """Pages of one writer's slice the prefill-local staging buffer holds (#31217: one grid slot).

        W > 1 means P_tp > D_tp: a writer sends all its heads, so F pages fit.
        W = 1 is modelled as P_tp = D_tp / 4 (step 1's `STAGED_A_UP`, prefill TP 1 -> decode TP 4): the
        writer sends a quarter of its heads, so 4F pages fit.
        """
        f = self.plan.full_chunk_pages
        return f if self.writers > 1 else 4 * f


def writers_are_stages(cfg: StagingSystemConfig, variant: StagingVariant, check: bool = True) -> bool:
    """The W writers are PP prefill stages (each with `dsts` destinations), not TP writers of one stage.

    `num_writers_for` is `tp_writers * pp_writers` since PP staging (`variant.pp_prefill_writers`); before
    it, a prefill rank with several destinations (prefill TP < decode TP) meant exactly one writer:
    ConfigError there (`check`; the system checks when it starts, so its invariants can still be listed).
    """
    if cfg.dsts == 1:
        return False
    if cfg.writers > 1 and not variant.pp_prefill_writers and check:
        raise ConfigError("param writers", f"1 when dsts={cfg.dsts} on variant {variant.name} (prefill TP < "
                                             "decode TP means one writer without PP prefill writers)", cfg.writers)
    return cfg.writers > 1


def send_groups(cfg: StagingSystemConfig, variant: StagingVariant) -> tuple[tuple[SendCall, ...], ...]:
    """The `send` calls of each prefill batch of a room, the early send (fixed only) folded into the first."""
    p = cfg.plan
    cursor = initial_cursor(p)
    early: tuple[SendCall, ...] = ()
    if cfg.prefill_hit:
        cursor = snapshot_early_send_prefix_end(cursor, cfg.prefill_hit)
        cursor, early = early_send(p, cursor, True, variant)  # () on pre_05c7ebf: disabled under staging
    groups = []
    for i, end in enumerate(prefill_batch_ends(p, cfg.prefill_hit)):
        cursor, calls = send_batch(p, cursor, end, end == p.prompt_len, variant)
        groups.append((early + calls) if i == 0 else calls)
    return tuple(groups)


def write_cells(memory: tuple[int, ...], cfg: StagingSystemConfig, room: int, writer: int, offset: int,
                alloc_pages: int, page_start: int, num_pages: int) -> tuple[int, ...]:
    """A writer's bulk RDMA of suffix pages `[page_start, +num_pages)` into the slot at ring unit `offset`.

    The bytes go where the slot layout puts this writer, however many pages
    were sent: an oversized send runs on into the next writer or allocation
    (clipped at the ring's end, where the pre-fix check refused the write).
    """
    ps, d = cfg.page_size, cfg.decode_prefix_len
    base = (offset + writer * alloc_pages) * ps
    if base < 0:  # (no ring offset is negative) cell by cell, as Python's negative indices take them
        mem = list(memory)
        for j in range(num_pages * ps):
            if base + j < len(mem):
                mem[base + j] = value(room, d + page_start * ps + j, writer)
        return tuple(mem)
    end = min(base + num_pages * ps, len(memory))  # the run clipped at the ring's end
    if end <= base:
        return memory
    return memory[:base] + tuple(values(room, d + page_start * ps, writer, end - base)) + memory[end:]


def scatter_cells(memory: tuple[int, ...], cfg: StagingSystemConfig, offset: int, alloc_pages: int,
                  token_start: int, num_pages: int) -> list[tuple[int, int, int]]:
    """(row token, head slice, cell) a scatter of `num_pages` pages from the slot at `offset` writes."""
    ps = cfg.page_size
    out = []
    for w in range(cfg.writers):
        base = (offset + w * alloc_pages) * ps
        for j in range(num_pages * ps):
            cell = memory[base + j] if base + j < len(memory) else GARBAGE
            out.append((token_start + j, w, cell))
    return out


def scatter_into(rows: list[int], prefix: list[int], memory: tuple[int, ...], cfg: StagingSystemConfig, offset: int,
                 alloc_pages: int, token_start: int, num_pages: int) -> None:
    """Write the cells `scatter_cells` gives into a room's rows [D, D + N*ps) x W and the shared prefix rows [0, D) x W
    (token by token, head slice by head slice; a token past the room's rows is not written).

    A head slice's cells are a run of the slot, and its rows every W-th of the rows: written as one strided slice
    for the prefix part and one for the room's part, the writes the cell-by-cell loop makes. A token or a ring
    offset below zero (Python's negative indices) or rows of another length take that loop."""
    w_count, lo = cfg.writers, cfg.decode_prefix_len
    top = lo + own_rows(cfg)
    n = num_pages * cfg.page_size
    if token_start < 0 or offset < 0 or alloc_pages < 0 or len(prefix) != lo * w_count \
            or len(rows) != (top - lo) * w_count:
        for t, h, cell in scatter_cells(memory, cfg, offset, alloc_pages, token_start, num_pages):
            if t < lo:
                prefix[t * w_count + h] = cell
            elif t < top:
                rows[(t - lo) * w_count + h] = cell
        return
    j1 = min(max(lo - token_start, 0), n)  # cells [0, j1): prefix tokens; [j1, j2): the room's; past j2: none
    j2 = min(max(top - token_start, 0), n)
    for h in range(w_count):
        base = (offset + h * alloc_pages) * cfg.page_size
        cells = memory[base:base + n]
        if len(cells) < n:  # past the ring's end: stale bytes
            cells += (GARBAGE,) * (n - len(cells))
        if j1:
            prefix[token_start * w_count + h:(token_start + j1) * w_count + h:w_count] = cells[:j1]
        if j2 > j1:
            rows[(token_start + j1 - lo) * w_count + h:(token_start + j2 - lo) * w_count + h:w_count] = cells[j1:j2]


def own_rows(cfg: StagingSystemConfig) -> int:
    """Tokens of a room's own suffix pages `[D, D + N*ps)`."""
    return cfg.plan.suffix_pages * cfg.page_size


def initial_prefix(cfg: StagingSystemConfig) -> tuple[int, ...]:
    w = cfg.writers
    return tuple(prefix_value(t, h) for t in range(cfg.decode_prefix_len) for h in range(w))


@lru_cache(maxsize=16)
def blank_rows(cells: int) -> tuple[int, ...]:
    """A decode room's rows before any write: one tuple of each size, which every room starts with."""
    return (UNWRITTEN,) * cells


def row_mismatches(rows: tuple[int, ...], cfg: StagingSystemConfig, room: int,
                   allow_unwritten: bool) -> list[tuple[int, int, int]]:
    """(token, head, cell) of the rows [D, L) that do not hold the prefill's KV."""
    if allow_unwritten and (rows is blank_rows(len(rows)) or rows.count(UNWRITTEN) == len(rows)):
        return []  # none written yet (a room not begun): the rows every room starts with at once, others counted in C
    d, w = cfg.decode_prefix_len, cfg.writers
    expected = _expected_rows(d, cfg.prompt_len, w, room)
    if rows[:len(expected)] == expected:  # every row holds the prefill's KV (compared in one pass)
        return []
    bad = []
    for i, want in enumerate(expected):  # row i is token d + i // w, head i % w (`value(room, t, h)` is `want`)
        cell = rows[i]
        if cell != want and not (allow_unwritten and cell == UNWRITTEN):
            bad.append((d + i // w, i % w, cell))
    return bad


def _expected_rows(d: int, prompt_len: int, w: int, room: int) -> tuple[int, ...]:
    """The prefill's KV of room `room`'s rows [d, prompt_len) x w, in the rows' order (token, then head)."""
    template = _row_template(d, prompt_len, w)  # room -1's: a room's cells are these plus a room offset
    return tuple(map(add, template, repeat((room + 1) * TOKENS * HEAD_SLICES, len(template))))


@lru_cache(maxsize=64)
def _row_template(d: int, prompt_len: int, w: int) -> tuple[int, ...]:
    return tuple(value(-1, t, h) for t in range(d, prompt_len) for h in range(w))


def cell_room(cell: int) -> int | None:
    """The room whose prefill KV the cell holds (None: stale ring bytes, never written, or a prefix row)."""
    return (cell - 1) // (TOKENS * HEAD_SLICES) - 1 if cell > 0 else None


def describe_cell(cell: int) -> str:
    if cell == GARBAGE:
        return "stale ring bytes"
    if cell == UNWRITTEN:
        return "never written"
    if cell < 0:
        t, h = divmod(-cell - 1, HEAD_SLICES)
        return f"prefix token {t} head {h}"
    t, h = divmod((cell - 1) % (TOKENS * HEAD_SLICES), HEAD_SLICES)
    return f"room {cell_room(cell)} token {t} head {h}"
