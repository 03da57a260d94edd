"""A persistent per-room sequence shared by the PD models' states (pd-staging, pd-protocol).

A timed simulation holds thousands of rooms in one state; `Rooms` lets a step
replace one room in O(log32 rooms) instead of copying every room.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Iterator


def put(t: tuple, i: int, v) -> tuple:
    """`t` with element `i` replaced (a tuple or a `Rooms`); `t` itself where element `i` is `v` already."""
    if type(t) is Rooms:
        return t.set(i, v)
    if t[i] is v:
        return t
    items = list(t)  # one copy (slicing around `i` made three)
    items[i] = v
    return tuple(items)


class Rooms:
    """An immutable per-room sequence that a step updates in O(log32 rooms), not O(rooms).

    The timed simulation holds thousands of rooms in one state; a tuple indexed
    by room costs a copy of every room per step. Here the rooms are the leaves
    of a 32-way tree of tuples: `set` copies one path from the root, untouched
    subtrees stay shared. Equality and hash are by value (the tree shape
    depends only on the length). `of` keeps a plain tuple up to `B` rooms, so
    the small states of explore and Hypothesis are exactly what they were.
    """

    __slots__ = ("root", "n", "shift")
    B, BITS, MASK = 32, 5, 31

    def __init__(self, root: tuple, n: int, shift: int) -> None:
        self.root, self.n, self.shift = root, n, shift

    @classmethod
    def of(cls, items) -> "tuple | Rooms":
        items = tuple(items)
        if len(items) <= cls.B:
            return items
        nodes, shift = items, 0
        while len(nodes) > cls.B:
            nodes = tuple(nodes[i:i + cls.B] for i in range(0, len(nodes), cls.B))
            shift += cls.BITS
        return cls(nodes, len(items), shift)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if type(i) is int and 0 <= i < self.n and self.shift == 5:  # up to 1,024 rooms: two levels, read here
            return self.root[i >> 5][i & 31]
        if type(i) is not int:
            return tuple(self)[i]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"room {i} of {self.n}")
        node, shift = self.root, self.shift
        while shift:
            node = node[(i >> shift) & 31]
            shift -= 5
        return node[i & 31]

    def __iter__(self) -> Iterator[Any]:
        it: Any = iter(self.root)
        for _ in range(self.shift // self.BITS):
            it = chain.from_iterable(it)
        return it

    def set(self, i: int, v: Any) -> "Rooms":
        if not 0 <= i < self.n:
            raise IndexError(f"room {i} of {self.n}")
        if self.shift == 5:  # up to 1,024 rooms: the two levels copied here (a call per level fewer)
            root, j = self.root, i >> 5
            leaf = root[j]
            if leaf[i & 31] is v:
                return self
            items = list(leaf)
            items[i & 31] = v
            nodes = list(root)
            nodes[j] = tuple(items)
            rooms = _object_new(Rooms)  # `_rooms(tuple(nodes), self.n, 5)` in this frame
            rooms.root = tuple(nodes)
            rooms.n = self.n
            rooms.shift = 5
            return rooms
        root = _set_path(self.root, self.shift, i, v)
        return self if root is self.root else _rooms(root, self.n, self.shift)

    def __eq__(self, other: object) -> bool:
        if type(other) is Rooms:
            return self.n == other.n and self.root == other.root
        return NotImplemented

    def __hash__(self) -> int:
        return hash((Rooms, self.n, self.root))

    def __repr__(self) -> str:
        return f"Rooms({list(self)!r})"

    def tolist(self) -> list:  # `kvsim.canon.to_jsonable` writes it as the list of rooms
        return list(self)


def _rooms(root: tuple, n: int, shift: int) -> Rooms:
    """`Rooms(root, n, shift)` without the call of `__init__` (a step sets a room or two)."""
    rooms = _object_new(Rooms)
    rooms.root = root
    rooms.n = n
    rooms.shift = shift
    return rooms


_object_new = object.__new__


def _set_path(node: tuple, shift: int, i: int, v: Any) -> tuple:
    j = (i >> shift) & 31
    if shift:
        v = _set_path(node[j], shift - 5, i, v)
    if node[j] is v:  # the same room put back: keep the node
        return node
    items = list(node)  # a copy through a list: one copy fewer than slicing around the room
    items[j] = v
    return tuple(items)
