"""The rooms of the pd-protocol transition system are interchangeable.

Every room starts alike (`NEW_PREFILL_ROOM`, Bootstrapping on the decode side) and no step orders
rooms by id: a step reads and writes one room (`enqueue`, `clear`, `bootstrap_timeout`, `decode_init`,
`decode_abort`, a delivered TINFO, ABORT or STATUS, the worker's head item), the heartbeat failure
fails every unfinished decode room at once, and the messages in flight are sorted bags, so the order
in which a step adds them leaves no trace. Relabelling the rooms by a permutation p, consistently in
every place a room id is held (the per-room tuples `prefill`, `sent` and `decode`, the worker queue's
items, and the room field of TINFO, ABORT and STATUS on either channel), maps each transition to a
transition (the action relabelled the same way), and keeps `done` and every invariant's verdict.
`tests/engine/test_explore_scale.py` checks that on every reachable state of small configurations.

`canonical(state)` is the least relabelling by `repr` among those that put the rooms in the order of
their own fields (`signature`; usually one, and then no `repr` is taken; rooms <= 3: at most 6
permutations), so the explorer stores one representative per orbit; its violations, shortest
counterexample lengths and liveness verdict are those of the full search (also tested).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from kvsim.engine.symmetry import Relabellings

from .actions import WorkItem

ROOM_MESSAGES = frozenset(("TINFO", "ABORT", "STATUS"))  # messages whose field 1 is a room
ROOM_ACTIONS = frozenset(("enqueue", "clear", "bootstrap_timeout", "decode_init", "decode_abort"))
MAX_ROOMS = 3  # the explore bound of `rooms`: beyond it the states are `Rooms` trees (the timed simulation)


def relabel_message(m: tuple, p: Sequence[int]) -> tuple:
    return type(m)(p[m[1]], *m[2:]) if m[0] in ROOM_MESSAGES else m


def relabel_action(a: tuple, p: Sequence[int]) -> tuple:
    kind = a[0]
    if kind in ROOM_ACTIONS:
        return type(a)(p[a[1]])
    if kind in ("deliver_prefill", "deliver_decode"):
        return type(a)(relabel_message(a[1], p))
    if kind in ("drop", "duplicate"):
        return type(a)(a[1], relabel_message(a[2], p))
    return a


def _moved(rooms: Sequence[Any], p: Sequence[int]) -> tuple:
    out: list[Any] = [None] * len(rooms)
    for r, room in enumerate(rooms):
        out[p[r]] = room
    return tuple(out)


def relabel(s: Any, p: Sequence[int]) -> Any:
    """`s` with room r renamed p[r] everywhere."""
    return s._replace(prefill=_moved(s.prefill, p), sent=_moved(s.sent, p), decode=_moved(s.decode, p),
                      queue=tuple(WorkItem(p[w.room], w.chunk) for w in s.queue),
                      to_prefill=tuple(sorted(relabel_message(m, p) for m in s.to_prefill)),
                      to_decode=tuple(sorted(relabel_message(m, p) for m in s.to_decode)))


def signature(s: Any, r: int) -> tuple:
    """Room r's own fields as comparable values (none names a room): `Relabellings` orders the rooms by it."""
    p = s.prefill[r]
    return (-1 if p.status is None else int(p.status), p[1:], s.sent[r], int(s.decode[r]),
            sum(w.room == r for w in s.queue))


def room_symmetry(rooms: int) -> Callable[[Any], Any] | None:
    """`canonical` for `rooms` interchangeable rooms; None where there is nothing to reduce or the state
    is not the explorer's tuple form."""
    if not 1 < rooms <= MAX_ROOMS:
        return None
    return Relabellings(rooms, relabel, signature).canonical
