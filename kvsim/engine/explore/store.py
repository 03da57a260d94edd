"""The explorer's visited-state stores: full states, or 64-bit fingerprints in flat arrays.

Both give the breadth-first search of `explore` the same operations: `key` (the function that gives what
identifies a state, its fingerprint, computed once per reached state; None where the state itself is its key),
`find` (a key's id, or None),
`add` a new state (with its key, its parent, the action that reached it and its index among the
parent's enabled actions, its depth), `expand` (record a state's successor ids), the `done`/`bad` flags,
and `path` / `state` to report a violation. The search order, and so every result, is the same
with either store as long as no two reached states share a fingerprint.

`FullStore` keeps every state as the Python object it is (the state graph can be exported). Both keep the
successor ids in one compressed array (`Successors`: states are expanded in id order).
`FingerprintStore` is TLC's approach: the visited set holds a 64-bit fingerprint of each state's
fields (`kvsim.engine.explore.fingerprint`: BLAKE2b of its fields' codes, or of the system's own
`encode_state`), and parents,
action indices, depths, flags and the successor lists live in `array` buffers (no object per
state); a state wanted for a report is rebuilt by replaying its actions from the initial state.
Two different states with one fingerprint would make the search skip the second: the run
reports the chance of that, as TLC does (`collision_probability`). `Recent` maps the successors met
lately to their ids by value, so most transitions to a known state need no fingerprint at all (on
swa-budget and pd-protocol's mori backend, every one: a fingerprint is taken once per new state).
"""

from __future__ import annotations

from array import array
from itertools import compress
from operator import is_not
from typing import Any, Callable, Iterator, Sequence

from ..canon import canonical_json, to_jsonable
from ..statetext import FieldCaches



class Successors:
    """The successor lists of a breadth-first search, as one compressed array: the states are expanded in id
    order, so state i's successors' ids are `succ_targets[succ_start[i]:succ_start[i + 1]]` (a state skipped
    before a later one was expanded, a violation or one cut by the depth bound, gets an empty list; the states
    after the last expanded one have none kept). 4 bytes a transition, no object per state."""

    def __init__(self) -> None:
        self.succ_start = array("I", [0])  # 32-bit offsets: up to 2**32 transitions
        self.succ_targets = array("i")  # 32-bit ids: 2**31 states is beyond any run of one machine

    def record(self, sid: int, tids: list[int]) -> None:
        """State `sid`'s successors' ids, in the order of its enabled actions."""
        start, targets = self.succ_start, self.succ_targets
        if len(start) <= sid:  # states skipped before this one (violations, cut by depth) have no list
            start.extend([len(targets)] * (sid + 1 - len(start)))
        targets.extend(tids)
        start.append(len(targets))

    def targets(self, sid: int) -> array:
        """State `sid`'s successors' ids (of an expanded state: the caller asks `expanded` first)."""
        return self.succ_targets[self.succ_start[sid]:self.succ_start[sid + 1]]

    def successor_arrays(self, n: int) -> tuple[array, array]:
        """(starts, targets) of `n` states: state i's successors' ids are `targets[starts[i]:starts[i + 1]]`, the
        states after the last expanded one given empty lists."""
        starts, targets = self.succ_start, self.succ_targets
        return starts + array("I", [len(targets)]) * (n + 1 - len(starts)), targets


class FullStore:
    """Parallel lists indexed by state id; the states themselves are the keys."""

    kind = "full"

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.states: list[Any] = []
        self.parent: list[int] = []
        self.via: list[Any] = []
        self.depth: list[int] = []
        self.actions: list[Sequence[Any] | None] = []  # an expanded state's enabled actions; None: not expanded
        self.succ = Successors()  # the successors' ids, in the order of `actions`
        self.done: list[bool] = []
        self.bad: list[bool] = []

    def __len__(self) -> int:
        return len(self.states)

    key = None  # the state is its own key: no function to call

    @property
    def find(self) -> Callable[[Any], int | None]:
        """key -> its id, or None: the dict's own `get` (a call in C, none of this store's)."""
        return self.ids.get

    def add(self, key: Any, state: Any, parent: int, action: Any, index: int, depth: int) -> int:
        sid = len(self.states)
        self.ids[key] = sid
        self.states.append(state)
        self.parent.append(parent)
        self.via.append(action)
        self.depth.append(depth)
        self.actions.append(None)
        self.done.append(False)
        self.bad.append(False)
        return sid

    def expand(self, sid: int, tids: list[int], actions: Sequence[Any]) -> None:
        self.succ.record(sid, tids)
        self.actions[sid] = actions

    def successors(self, sid: int) -> Iterator[int]:
        return iter(self.succ.targets(sid) if self.actions[sid] is not None else ())

    def successor_arrays(self) -> tuple[array, array]:
        """(starts, targets): state i's successors' ids are `targets[starts[i]:starts[i + 1]]`."""
        return self.succ.successor_arrays(len(self))

    def ends(self) -> bytearray:
        """1 for each state where the liveness pass starts (done, a violation, or not expanded), else 0."""
        return bytearray(done or bad or acts is None for done, bad, acts in zip(self.done, self.bad, self.actions))

    def expanded(self, sid: int) -> bool:
        return self.actions[sid] is not None

    def path(self, sid: int) -> list[Any]:
        actions = []
        while self.parent[sid] >= 0:
            actions.append(self.via[sid])
            sid = self.parent[sid]
        return [to_jsonable(a) for a in reversed(actions)]

    def state(self, sid: int) -> Any:
        return self.states[sid]

    def bytes_per_state(self) -> None:
        return None  # Python objects: not a flat figure

    def adopt(self, saved: "FullStore") -> "FullStore":
        """A store of the same search saved by a checkpoint, to go on with: it needs nothing of this run's."""
        return saved

    def to_graph(self) -> Any:
        import networkx as nx

        g = nx.MultiDiGraph()  # two actions may lead to the same successor
        for sid, state in enumerate(self.states):
            g.add_node(sid, state=canonical_json(state), depth=self.depth[sid], done=self.done[sid],
                       violation=self.bad[sid], expanded=self.actions[sid] is not None)
        for sid, actions in enumerate(self.actions):
            for tid, action in zip(self.succ.targets(sid), actions) if actions is not None else ():
                g.add_edge(sid, tid, action=canonical_json(action))
        return g


class FingerprintSet:
    """Open addressing over two flat arrays (fingerprint, id); linear probing; load kept at most 3/4."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._alloc(capacity)
        self.count = 0

    def _alloc(self, capacity: int) -> None:
        self.mask = capacity - 1
        self.keys = array("Q", bytes(8 * capacity))
        self.vals = array("i", bytes(4 * capacity))

    def get(self, fp: int) -> int | None:
        keys, mask = self.keys, self.mask
        h = fp & mask
        while True:
            k = keys[h]
            if k == fp:
                return self.vals[h]
            if k == 0:
                return None
            h = (h + 1) & mask

    def put(self, fp: int, value: int) -> None:
        if 4 * (self.count + 1) > 3 * (self.mask + 1):
            self._grow()
        keys, mask = self.keys, self.mask
        h = fp & mask
        while keys[h] != 0:
            h = (h + 1) & mask
        keys[h] = fp
        self.vals[h] = value
        self.count += 1

    def _grow(self) -> None:
        old_keys, old_vals = self.keys, self.vals
        self._alloc(2 * (self.mask + 1))
        keys, vals, mask = self.keys, self.vals, self.mask
        for k, v in zip(old_keys, old_vals):
            if k:
                h = k & mask
                while keys[h] != 0:
                    h = (h + 1) & mask
                keys[h] = k
                vals[h] = v

    def nbytes(self) -> int:
        return self.keys.itemsize * len(self.keys) + self.vals.itemsize * len(self.vals)


class Recent(dict):
    """state -> id for the states reached lately (a partitioned worker's: -> fingerprint), by value: a dict keyed
    by the state, emptied when it holds `capacity` (what a transition reaches lately is mostly what the next few
    expansions reach again).

    The search asks it with the dict's own `get` (a lookup in C: the state hashed once, and compared only with a
    state of the same hash), and `put`s a successor it missed: a hit is a state equal to the one asked, never
    another state of the same hash.
    """

    __slots__ = ("capacity",)

    def __init__(self, capacity: int = 1 << 17) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, state: Any, sid: int) -> None:
        if len(self) >= self.capacity:
            self.clear()
        self[state] = sid


class FingerprintStore:
    """Fingerprints and flat arrays; states are rebuilt by replay when a report needs one.

    `replay(indices)` must return the state reached from the initial state by taking, at each step,
    the enabled action at that index (the explorer passes the system's). The successor lists are one
    compressed array (`Successors`), as the full store's.
    """

    kind = "fingerprint"

    def __init__(self, key: Callable[[Any], int], replay: Callable[[Sequence[int], int], Any]) -> None:
        self.key = key  # state -> 64-bit fingerprint (never 0): `fingerprint_function(system)`
        self.replay = replay
        self.visited = FingerprintSet()
        self.parent = array("i")  # 32-bit ids: 2**31 states is beyond any run of one machine
        self.index = array("I")  # the action's position among the parent's enabled actions (root: initial index)
        self.depth = array("I")
        self.flags = bytearray()  # bit 0 done, bit 1 bad (a violation), bit 2 expanded
        self.succ = Successors()

    def __len__(self) -> int:
        return len(self.parent)

    def __getstate__(self) -> dict[str, Any]:  # a checkpoint saves the arrays, not this run's functions
        return {k: v for k, v in self.__dict__.items() if k not in ("key", "replay")}

    def adopt(self, saved: "FingerprintStore") -> "FingerprintStore":
        """A store of the same search saved by a checkpoint, with this run's fingerprint and replay functions."""
        saved.key, saved.replay = self.key, self.replay
        return saved

    @property
    def find(self) -> Callable[[int], int | None]:
        """key -> its id, or None."""
        return self.visited.get

    def add(self, key: int, state: Any, parent: int, action: Any, index: int, depth: int) -> int:
        sid = len(self.parent)
        self.visited.put(key, sid)
        self.parent.append(parent)
        self.index.append(index)
        self.depth.append(depth)
        self.flags.append(0)
        return sid

    @property
    def done(self) -> "_Flag":
        return _Flag(self.flags, 1)

    @property
    def bad(self) -> "_Flag":
        return _Flag(self.flags, 2)

    def expand(self, sid: int, tids: list[int], actions: Sequence[Any]) -> None:
        """State `sid`'s successors' ids, in the order of its enabled `actions` (not kept: replay finds them)."""
        self.succ.record(sid, tids)
        self.flags[sid] |= 4

    def expanded(self, sid: int) -> bool:
        return bool(self.flags[sid] & 4)

    def successors(self, sid: int) -> Iterator[int]:
        return iter(self.succ.targets(sid) if self.flags[sid] & 4 else ())

    def successor_arrays(self) -> tuple[array, array]:
        """(starts, targets), as `FullStore.successor_arrays`."""
        return self.succ.successor_arrays(len(self))

    def ends(self) -> bytearray:
        """As `FullStore.ends`, from the flags' bits (done 1, a violation 2, expanded 4), in one pass in C."""
        return self.flags.translate(ENDS)

    def indices(self, sid: int) -> tuple[int, list[int]]:
        """(the initial state's index, the enabled-action indices from it to `sid`)."""
        steps = []
        while self.parent[sid] >= 0:
            steps.append(self.index[sid])
            sid = self.parent[sid]
        return self.index[sid], steps[::-1]

    def path(self, sid: int) -> list[Any]:
        root, steps = self.indices(sid)
        return [to_jsonable(a) for a in self.replay(steps, root)[1]]

    def state(self, sid: int) -> Any:
        root, steps = self.indices(sid)
        return self.replay(steps, root)[0]

    def nbytes(self) -> int:
        arrays = (self.parent, self.index, self.depth, self.succ.succ_start, self.succ.succ_targets)
        return self.visited.nbytes() + len(self.flags) + sum(a.itemsize * len(a) for a in arrays)

    def bytes_per_state(self) -> float:
        return round(self.nbytes() / max(1, len(self)), 1)

    def collision_probability(self) -> float:
        """TLC's estimate: the chance that some two of the n reached states share a 64-bit fingerprint."""
        n = len(self)
        return n * (n - 1) / 2 / 2.0 ** 64


# where the liveness pass starts, by a state's flags (bit 0 done, 1 a violation, 2 expanded): `FingerprintStore.ends`,
# and a partitioned search's (`HangRounds`, whose flags have these bits)
ENDS = bytes(1 if flags & 3 or not flags & 4 else 0 for flags in range(256))


class _Flag:
    """`store.done[sid]` / `store.bad[sid] = True` over one bit of the flags bytearray."""

    __slots__ = ("flags", "bit")

    def __init__(self, flags: bytearray, bit: int) -> None:
        self.flags, self.bit = flags, bit

    def __getitem__(self, sid: int) -> bool:
        return bool(self.flags[sid] & self.bit)

    def __setitem__(self, sid: int, value: bool) -> None:
        if value:
            self.flags[sid] |= self.bit
        else:
            self.flags[sid] &= ~self.bit & 0xFF


class Interner(FieldCaches):
    """A state whose fields are the equal values met lately (two generations per field position), as one object
    each: the states a search holds (its frontier, the full store) then share their equal parts, instead of
    each successor holding its own copy of what its step rebuilt (pd-staging 2 x 2: a level of 354,054
    states takes 188 bytes a state where it took 879). Fields that are `like`'s own objects (a successor's
    unchanged fields are its parent's) are kept without a lookup, and a state that `text` (the search's
    `FieldFingerprint`, or a `RecordText`) took last is made of the values that cache holds, with no lookup at
    all. Rests on `RecordText`'s contract: equal field values are one value to the explorer. Anything but a named tuple
    is returned as it is."""

    __slots__ = ("kinds", "text")

    def __init__(self, capacity: int = 1 << 16, text: Any = None) -> None:
        super().__init__(capacity)  # entries: value -> the equal value held
        self.text = text  # its `held(state)`: the state it took last, made of the fields it holds (no lookup then)
        self.kinds: dict[type, range | None] = {}  # a named tuple's field positions; None for any other type

    def __call__(self, state: Any, like: Any = None) -> Any:
        held = None if self.text is None else self.text.held(state)
        if held is not None:
            return held
        kind = type(state)
        every = self.kinds.get(kind, False)
        if every is False:
            every = self._learn(kind)
        if every is None:
            return state
        young, old = self.young[kind], self.old[kind]
        fields = None
        for i in every if type(like) is not kind else compress(every, map(is_not, state, like)):
            value = state[i]
            held = young[i].get(value)
            if held is None:
                held = old[i].get(value, value)
                young[i][held] = held
                self.size += 1
            if held is not value:
                if fields is None:
                    fields = list(state)
                fields[i] = held
        if self.size >= self.capacity:
            self._age()
        return state if fields is None else tuple.__new__(kind, fields)

    def _learn(self, kind: type) -> range | None:
        if not (issubclass(kind, tuple) and hasattr(kind, "_fields")):
            self.kinds[kind] = None
            return None
        every = self.kinds[kind] = range(len(kind._fields))
        self._fields(kind, len(every))
        return every
