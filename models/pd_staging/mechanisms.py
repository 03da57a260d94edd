"""The failure mechanisms a timed run of pd-staging can show, each named from the run's own evidence.

`kvsim simulate pd-staging` checks the invariants on the final state; an invariant names the first room it
finds. This module goes further for the data invariants: every room whose rows break them, and for each the
mechanism the run's evidence shows (`Evidence`, recorded by the simulation as it applies faults and timers):

- `stale_write_after_release`: the room's rows hold another room's KV, and that room had failed (waiting
  timeout, abort) with its slots freed at once (`release_room`, no deferred release): its queued chunk wrote
  the freed slot after the ring gave it to this room.
- `stale_write_after_release_timeout`: the same, where the variant holds a failed room's slots for its
  ABORT_ACKs (#35049) and the release timeout freed them.
- `staging_req_lost_or_late`: the room reported Success with rows never written, and a STAGING_REQ of the room
  was dropped, or delayed behind the STAGING_REQs of later chunks: decode saw no allocated slot left and
  concluded (its completion rule counts allocated slots, not chunk indices), while that chunk waited for an
  offset. The simulation's delay fault lets a message fall behind later ones on its channel. The same chunk
  keeps its prefill room Transferring with its pages held (the run's end-of-run check "prefill rooms never
  cleared").
- `duplicated_chunk_ready`: a scatter before all writers wrote (the flagged `scatter_after_all_writers`, or
  stale ring bytes in the rows: never written, or another room's KV that no stale write explains, as the ring's
  last holder left them), and a CHUNK_READY of the room was duplicated: the fan-in counted one writer twice.

A violation whose evidence fits none is named `None` ("no catalogued mechanism"): a candidate new finding.
The catalog says which report each mechanism is (`mechanism` in properties/pd_staging/bugs.toml); the
simulate command prints the report ids beside the rooms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import data
from ..pd_common.status import KVPoll

HELD = "prefill rooms never cleared"  # the run's end-of-run check (pages held), not an invariant of the system
MECHANISMS = ("stale_write_after_release", "stale_write_after_release_timeout", "staging_req_lost_or_late",
              "duplicated_chunk_ready")


@dataclass
class Evidence:
    """What a run did to each room that a mechanism reads: faults on its messages, how it concluded, how its
    slots were freed, and the room of a transition flag when it was first raised."""

    dropped: dict[int, set[str]] = field(default_factory=dict)  # room -> message tags dropped
    duplicated: dict[int, set[str]] = field(default_factory=dict)  # room -> message tags duplicated
    delayed: dict[int, set[str]] = field(default_factory=dict)  # room -> message tags delayed or reordered
    failed: dict[int, str] = field(default_factory=dict)  # room -> why it concluded Failed
    released_by_timeout: set[int] = field(default_factory=set)  # rooms whose held slots the release timeout freed
    flagged: dict[str, int] = field(default_factory=dict)  # flagged invariant -> the room of the step raising it

    def fault(self, kind: str, msg: tuple) -> None:
        room = getattr(msg, "room", None)
        if room is not None:
            into = {"drop": self.dropped, "duplicate": self.duplicated, "delay": self.delayed,
                    "reorder": self.delayed}.get(kind)
            if into is not None:
                into.setdefault(room, set()).add(msg[0])


def _stale_write(source: int, evidence: Evidence, deferred_release: bool) -> tuple[str | None, str]:
    why = evidence.failed.get(source)
    if why is None:
        return None, f"room {source} did not fail"
    if source in evidence.released_by_timeout:
        return "stale_write_after_release_timeout", f"room {source} failed ({why}); the release timeout freed its slots"
    if not deferred_release:
        return "stale_write_after_release", f"room {source} failed ({why}); release_room freed its slots at once"
    return None, f"room {source} failed ({why}); its slots were held until its ABORT_ACKs"


def _room(r: int, rows: tuple[int, ...], success: bool, cfg: Any, evidence: Evidence,
          deferred_release: bool) -> dict[str, Any] | None:
    bad = data.row_mismatches(rows, cfg, r, allow_unwritten=not success)
    if not bad:
        return None
    sources = sorted({room for _, _, c in bad if (room := data.cell_room(c)) is not None and room != r})
    written_wrong = sources or any(c == data.GARBAGE for _, _, c in bad)
    invariant = "suffix_rows_match_prefill" if written_wrong else "success_commits_prefill_kv"
    mechanism, why = None, ""
    if sources:
        mechanism, why = _stale_write(sources[0], evidence, deferred_release)
        why = f"rows hold room {sources[0]}'s KV; {why}"
        if mechanism is None and "READY" in evidence.duplicated.get(r, ()):  # the ring's bytes as that room left them
            mechanism, why = "duplicated_chunk_ready", f"{why}; a CHUNK_READY of the room was duplicated"
    elif any(c == data.GARBAGE for _, _, c in bad):
        dup = "READY" in evidence.duplicated.get(r, ())
        mechanism = "duplicated_chunk_ready" if dup else None
        why = "rows scattered from stale ring bytes" + ("; a CHUNK_READY of the room was duplicated" if dup else "")
    else:
        how = _req_lost_or_late(r, evidence)
        mechanism = "staging_req_lost_or_late" if how else None
        why = "reported Success with rows never written" + (
            f"; a STAGING_REQ of the room was {' and '.join(how)}" if how else "")
    return {"room": r, "invariant": invariant, "mechanism": mechanism, "evidence": why}


def _req_lost_or_late(r: int, evidence: Evidence) -> list[str]:
    """How the room's STAGING_REQs went wrong: "dropped", "delayed", both, or neither."""
    return [how for how, faults in (("dropped", evidence.dropped), ("delayed", evidence.delayed))
            if "REQ" in faults.get(r, ())]


def _held(r: int, state: Any, evidence: Evidence) -> dict[str, Any]:
    how = _req_lost_or_late(r, evidence)
    lost = ", ".join(f"{tag} dropped" for tag in sorted(evidence.dropped.get(r, ())))
    if state.decode[r].status == KVPoll.Success and how:
        return {"room": r, "invariant": HELD, "mechanism": "staging_req_lost_or_late",
                "evidence": f"decode reported Success; a STAGING_REQ of the room was {' and '.join(how)}"}
    decode = (f"decode failed ({evidence.failed[r]})" if r in evidence.failed else
              f"decode {getattr(state.decode[r].status, 'name', 'open')}")
    return {"room": r, "invariant": HELD, "mechanism": None, "evidence": decode + (f"; {lost}" if lost else "")}





def named(state: Any, cfg: Any, evidence: Evidence, deferred_release: bool,
          held: list[int] = ()) -> list[dict[str, Any]]:
    """Every room breaking a data invariant, raising a transition flag or (`held`) left with its prefill room
    never cleared, with its mechanism (or None)."""
    out = [_held(r, state, evidence) for r in held]
    for r, d in enumerate(state.decode):
        if d.status != KVPoll.Failed:
            entry = _room(r, d.rows, d.status == KVPoll.Success, cfg, evidence, deferred_release)
            if entry is not None:
                out.append(entry)
    r = evidence.flagged.get("scatter_after_all_writers")
    if r is not None:
        dup = "READY" in evidence.duplicated.get(r, ())
        out.append({"room": r, "invariant": "scatter_after_all_writers",
                    "mechanism": "duplicated_chunk_ready" if dup else None,
                    "evidence": "scatter submitted before every writer's CHUNK_READY" +
                                ("; a CHUNK_READY of the room was duplicated" if dup else "")})
    return sorted(out, key=lambda e: (e["room"], e["invariant"]))
