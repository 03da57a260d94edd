"""Invariants of the pd-staging transition system (research note section 2.6), checked on data where possible.

Data invariants read the tracked KV cells: every scattered suffix row holds
the prefill's KV for that (request, token, head), the shared radix-prefix
rows never change, and a request committed on decode holds all of its KV.
Transition invariants (a write past its slot, a scatter before all writers,
a scatter for an unaligned prefix, a negative count) are recorded as flags by
the step that does them, since the state after cannot tell.
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.system import Invariant, Sometimes, flag, flagged

from . import data
from ..pd_common.status import KVPoll

FLAGGED = ("slot_writes_within_size", "scatter_after_all_writers", "unaligned_prefix_fails_room",
           "outstanding_never_negative")


def _cells(bad: list[tuple[int, int, int]]) -> str:
    return ", ".join(f"token {t} head {h}: {data.describe_cell(c)}" for t, h, c in bad[:3]) + (
        f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")


def reachable() -> tuple[Sometimes, ...]:
    """What some path must reach, or the invariants hold vacuously: a room concludes either way, a chunk is staged."""
    return (
        Sometimes("a_room_succeeds", lambda s: any(d.status == KVPoll.Success for d in s.decode),
                  "a decode room concludes Success: every chunk staged, scattered and acknowledged"),
        Sometimes("a_room_fails", lambda s: any(d.status == KVPoll.Failed for d in s.decode),
                  "a decode room concludes Failed (a fault, an abort or a timeout)"),
        Sometimes("a_chunk_is_staged", lambda s: bool(s.owners),
                  "the staging ring holds a live allocation for a room's chunk"),
    )


def invariants(system: Any) -> tuple[Invariant, ...]:
    cfg = system.cfg
    prefix0 = data.initial_prefix(cfg)

    def prefix_unchanged(s: Any) -> str | None:
        if s.prefix == prefix0:
            return None
        bad = [(i // cfg.writers, i % cfg.writers, c) for i, (c, c0) in enumerate(zip(s.prefix, prefix0)) if c != c0]
        return f"shared radix-prefix rows: expected unchanged, got {_cells(bad)}"

    def suffix_rows(s: Any) -> str | None:
        for r, d in enumerate(s.decode):
            if d.status == KVPoll.Failed:
                continue  # released pages: their contents no longer matter
            bad = data.row_mismatches(d.rows, cfg, r, allow_unwritten=True)
            if bad:
                return f"room {r} decode rows: expected the prefill's KV (or not yet written), got {_cells(bad)}"
        return None

    def committed(s: Any) -> str | None:
        for r, d in enumerate(s.decode):
            if d.status == KVPoll.Success:
                bad = data.row_mismatches(d.rows, cfg, r, allow_unwritten=False)
                if bad:
                    return f"room {r} reported Success on decode: expected every suffix row written, got {_cells(bad)}"
        return None

    def no_early_teardown(s: Any) -> str | None:
        for w, rooms in enumerate(s.prefill):
            for r, p in enumerate(rooms):
                failed = KVPoll.Failed in (p.status, p.outcome)
                if p.infos or failed:
                    continue
                queued = [c for c in s.queues[w] if c.room == r]
                if queued:
                    return (f"writer {w} room {r}: transfer state torn down ({_name(p)}) with chunk(s) "
                            f"{[c.chunk_idx for c in queued]} still queued: expected teardown only when "
                            f"_staging_outstanding is 0; the queued chunk is dropped and its slot never written")
        return None

    def no_state_after_teardown(s: Any) -> str | None:
        for r, d in enumerate(s.decode):
            if not d.registered:
                owned = [a for a, room in s.owners if room == r]
                if owned or d.events or any(d.counts):
                    return (f"room {r} unregistered on decode: expected no live slot, event or arrival, got "
                            f"slots {owned}, events {list(d.events)}")
        if s.dead:
            return None  # the prefill process is gone with its maps
        for w, rooms in enumerate(s.prefill):
            for r, p in enumerate(rooms):
                if p.status is None and not any(c.room == r for c in s.queues[w]):
                    if p.outstanding or any(o is not None for o in p.offsets):
                        return (f"writer {w} room {r} cleared: expected no outstanding count or offsets, got "
                                f"outstanding {p.outstanding}")
        return None

    # transition flags that explain a data violation come first: explore reports one invariant per state
    return (
        Invariant("unaligned_prefix_fails_room", flagged("unaligned_prefix_fails_room"),
                  "S13: a decode prefix that is not page-aligned fails the room; nothing is scattered"),
        Invariant("slot_writes_within_size", flagged("slot_writes_within_size"),
                  "S7: no writer writes past its region of the slot allocated for the chunk"),
        Invariant("shared_prefix_rows_unchanged", prefix_unchanged,
                  "S10: no scatter writes a shared radix-prefix row [0, D)"),
        Invariant("suffix_rows_match_prefill", suffix_rows,
                  "S10/S11 on data: every scattered suffix row holds the prefill's KV for its (request, token, head)"),
        Invariant("success_commits_prefill_kv", committed,
                  "S15 on data: decode reports Success only when every suffix row holds the prefill's KV"),
        Invariant("scatter_after_all_writers", flagged("scatter_after_all_writers"),
                  "S11: a slot is scattered only after W distinct writers reported"),
        Invariant("no_early_teardown", no_early_teardown,
                  "S14: prefill transfer state is torn down only when no chunk of the room is outstanding"),
        Invariant("outstanding_never_negative", flagged("outstanding_never_negative"),
                  "S17: _staging_outstanding[room] >= 0"),
        Invariant("no_room_state_after_teardown", no_state_after_teardown,
                  "S9/L4: after teardown no slot, event, arrival, count or offset of the room is left"),
    )


def _name(p: Any) -> str:
    return "cleared" if p.status is None else p.status.name
