"""The symmetries of the pd-staging transition system: interchangeable rooms, and a dead prefill.

Rooms. Every room has the same geometry, and nothing in a step orders rooms by id except two loops
that conclude several rooms in id order: the heartbeat failure (the prefill is dead) and the
registration of an unaligned decode prefix (the initial state). Relabelling the rooms by a
permutation p, consistently in every place a room id is held (`batches`, the prefill rooms of each
writer, the queued chunks, the decode rooms, the owners of ring allocations, every message on a
channel, and the KV cells, whose value names the room, `data.value`), maps each transition
to a transition, each invariant's verdict and `done` to themselves, except where those loops run:
the heartbeat failure writes its WATERMARKs and ABORTs on the decode -> prefill channels in room
order, and that is what the dead prefill's quotient below forgets. The initial state must be
invariant under p: it is checked (`room_symmetry` returns None when it is not, e.g. an unaligned
prefix, where the initial ABORTs are queued in room order to a live prefill).

A dead prefill. Once the prefill node died no prefill step runs (batches, the transfer worker,
clear, receiving a decode message: `enabled` offers none), `done` does not read the prefill side,
and the invariants that do read it (`no_early_teardown`, `no_room_state_after_teardown`) hold
whatever it holds (the queues are empty, the second stops at `dead`). The decode -> prefill
channels are never delivered again; a message on them matters only to the drop and duplicate
faults of its kind while fault budget is left, and then only by its kind. So two dead states that
agree on the decode side, the prefill -> decode channels, the ring, the budget and, per channel,
the kinds of the messages a fault may still take, are bisimilar: `quiet` maps a dead state to one
of its class (prefill side reset, each decode -> prefill channel replaced by sorted kind
placeholders, or emptied when no fault can take them).

`canonical(state)` is the least, by `repr`, of the quieted relabellings of `state` that put the
rooms in the order of their own fields (`signature`; most states have one, and then no `repr` is
taken): one representative per orbit (`kvsim.engine.symmetry.Relabellings`), and a state bisimilar
to the given one, so the explorer's violations, shortest counterexample lengths and liveness
verdict are those of the full search (`tests/engine/test_explore_scale.py` compares them).
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

from kvsim.engine.symmetry import Relabellings

from . import data
from .actions import DOWN
from .state import Chunk, DecodeRoom, PrefillRoom, StagingState

_ROOM_FIELD_KINDS = frozenset(("REQ", "RSP", "READY", "STATUS", "ABORT", "ACK"))  # messages whose field 1 is a room
_STRIDE = data.TOKENS * data.HEAD_SLICES  # a room's span of KV cell values
_ROWS = DecodeRoom._fields.index("rows")


class RoomSymmetry:
    """`canonical(state)` for one `PdStaging` system (see the module's documentation)."""

    def __init__(self, system: Any) -> None:
        cfg = system.cfg
        self.rooms, self.writers = cfg.rooms, cfg.writers
        self.perms = [p for p in permutations(range(cfg.rooms)) if p != tuple(range(cfg.rooms))]
        # message kinds a fault can still take off (or copy on) a decode -> prefill channel
        self.down_faults = frozenset(f.split("_", 1)[1].upper() for f in cfg.fault_kinds
                                     if f.startswith(("drop_", "dup_")))
        self.idle_prefill = (PrefillRoom(None, 0, False, (None,) * system.k, None),) * cfg.rooms
        self.order = Relabellings(cfg.rooms, lambda s, p: self.quiet(relabel(s, p)), signature)

    def canonical(self, s: StagingState) -> StagingState:
        return self.order.canonical(self.quiet(s))

    def quiet(self, s: StagingState) -> StagingState:
        """A dead state's representative of its bisimulation class (see the module); any other state as is."""
        if not s.dead:
            return s
        keep = self.down_faults if s.faults_left else frozenset()
        down = tuple(tuple(sorted((_placeholder(m) for m in chan if m[0] in keep), key=repr))
                     for chan in s.chans[DOWN])
        chans = tuple(down if side == DOWN else s.chans[side] for side in range(len(s.chans)))
        return s._replace(batches=(0,) * self.rooms, prefill=(self.idle_prefill,) * self.writers,
                          watermarks=((0, 0),) * self.writers, chans=chans)


def _placeholder(m: tuple) -> tuple:
    """A message of the same kind with every field zero: all a dead prefill's channel still tells."""
    return tuple.__new__(type(m), (m[0],) + (0,) * (len(m) - 1))


def signature(s: StagingState, r: int) -> tuple:
    """Room r's own fields, none of which names a room (the decode rows, whose cells do, are left out), as
    comparable values: `Relabellings` orders the rooms by it (a relabelling moves it with the room)."""
    d = s.decode[r]
    prefill = tuple((-1 if p.status is None else int(p.status), p.outstanding, p.infos,
                     -1 if p.outcome is None else int(p.outcome), p.ack, sum(o is not None for o in p.offsets))
                    for p in (rooms[r] for rooms in s.prefill))
    return s.batches[r], prefill, d[:_ROWS], d[_ROWS + 1:]


def _cells(cells: tuple[int, ...], shift: tuple[int, ...]) -> tuple[int, ...]:
    """KV cells with the room each names relabelled (`shift[r + 1]` added to a cell of room r)."""
    return tuple(c + shift[(c - 1) // _STRIDE] if c > 0 else c for c in cells)


def relabel(s: StagingState, p: tuple[int, ...]) -> StagingState:
    """`s` with room r renamed p[r] everywhere a room id is held."""
    n = len(p)
    q = [0] * n
    for old, new in enumerate(p):
        q[new] = old  # the room that lands at each index
    shift = (0,) + tuple((p[r] - r) * _STRIDE for r in range(n))

    def msg(m: tuple) -> tuple:
        if m[0] in _ROOM_FIELD_KINDS:
            return tuple.__new__(type(m), (m[0], p[m[1]]) + m[2:])
        return m

    def chunk(c: Chunk) -> Chunk:
        return tuple.__new__(Chunk, (p[c[0]],) + c[1:])

    def droom(d: DecodeRoom) -> DecodeRoom:
        return d._replace(rows=_cells(d.rows, shift))

    return StagingState(
        tuple(s.batches[q[i]] for i in range(n)),
        tuple(tuple(rooms[q[i]] for i in range(n)) for rooms in s.prefill),
        tuple(tuple(chunk(c) for c in queue) for queue in s.queues),
        s.watermarks,
        tuple(droom(s.decode[q[i]]) for i in range(n)),
        s.ring,
        _cells(s.memory, shift),
        tuple((aid, p[r]) for aid, r in s.owners),
        _cells(s.prefix, shift),
        tuple(tuple(tuple(msg(m) for m in chan) for chan in side) for side in s.chans),
        s.dead, s.faults_left, s.flags)


def room_symmetry(system: Any) -> RoomSymmetry | None:
    """The symmetry of `system` where its rooms are interchangeable (two or more, an initial state every
    relabelling fixes, per-room tuples rather than the timed simulation's `Rooms`); else None."""
    if system.cfg.rooms < 2 or system.cfg.rooms > 3 or system.cfg.timed:
        return None
    sym = RoomSymmetry(system)
    for s in system.initial_states():
        if type(s.decode) is not tuple or any(relabel(s, p) != s for p in sym.perms):
            return None
    return sym
