"""A state's text (its `repr`), written from cached field texts, and the caches of field values met lately.

A symmetry compares texts (`kvsim.engine.symmetry`): it takes them from a `RecordText`, which writes a named
tuple's `repr` from the `repr`s of field values it has met before. `FieldCaches` is the shared part: the
per-field caches, which a search's `Interner` also uses to keep one object for equal field values, and its
fingerprint (`kvsim.engine.explore.fingerprint`) to keep each field value's code.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any


_NAMED_TUPLE_REPR = namedtuple("_Probe", "x").__repr__.__code__  # every named tuple's own `repr` runs this code


class FieldCaches:
    """Values met lately, by equal value: per named-tuple type, one dict per field position, in two generations
    of at most `capacity` entries together (`RecordText`, `kvsim.engine.explore.store.Interner`)."""

    __slots__ = ("young", "old", "size", "capacity")

    def __init__(self, capacity: int) -> None:
        self.young: dict[type, list[dict[Any, Any]]] = {}
        self.old: dict[type, list[dict[Any, Any]]] = {}
        self.size, self.capacity = 0, capacity

    def _fields(self, kind: type, count: int) -> None:
        """Empty caches for the `count` fields of `kind`."""
        self.young[kind] = [{} for _ in range(count)]
        self.old[kind] = [{} for _ in range(count)]

    def _age(self) -> None:
        """The young generation, full, becomes the old one; the old one is dropped."""
        self.old, self.size = self.young, 0
        self.young = {k: [{} for _ in v] for k, v in self.old.items()}


class RecordText(FieldCaches):
    """`repr(state)` for a state that is a named tuple, each field's `repr` kept by value for the states to come.

    Most fields of a state equal the same field of states met just before, so their `repr`s are looked up,
    not written again. One cache per field position, two generations of at most
    `capacity` entries together. A value stands for every value equal to it: states that compare
    equal are one state to the explorer (the full store and its cache of recent successors already
    hold them so), and the models' tests check that equal fields have one `repr`. Anything that is not
    a named tuple gets its `repr`. The cache keeps the first of equal field values it met: `held` gives
    the state last written made of those (what a search keeps, `kvsim.engine.explore.store.Interner`).
    """

    __slots__ = ("formats", "last", "last_held")

    def __init__(self, capacity: int = 1 << 14) -> None:
        super().__init__(capacity)  # entries: (the value's `repr`, the value)
        self.formats: dict[type, str | None] = {}
        self.last: Any = None  # the state last written, and that state made of the field values held here
        self.last_held: Any = None

    def held(self, state: Any) -> Any:
        """`state` made of the equal field values this cache holds, if it is the state last written; else None."""
        return self.last_held if state is self.last else None

    def __call__(self, state: Any) -> str:
        kind = type(state)
        form = self.formats.get(kind, "")
        if form == "":
            form = self._learn(kind)
        if form is None:
            return repr(state)
        young, old = self.young[kind], self.old[kind]
        texts, fields = [], None
        for i, value in enumerate(state):
            entry = young[i].get(value)
            if entry is None:
                entry = old[i].get(value)
                if entry is None:
                    entry = (repr(value), value)
                young[i][entry[1]] = entry
                self.size += 1
            texts.append(entry[0])
            if entry[1] is not value:
                if fields is None:
                    fields = list(state)
                fields[i] = entry[1]
        if self.size >= self.capacity:
            self._age()
        self.last, self.last_held = state, state if fields is None else tuple.__new__(kind, fields)
        return form % tuple(texts)

    def _learn(self, kind: type) -> str | None:
        """The format of a named tuple's `repr` (`Name(field=%s, ...)`), or None for any other type."""
        fields = getattr(kind, "_fields", None)
        if not issubclass(kind, tuple) or getattr(kind.__repr__, "__code__", None) is not _NAMED_TUPLE_REPR:
            self.formats[kind] = None
            return None
        form = self.formats[kind] = kind.__name__ + "(" + ", ".join(f"{f}=%s" for f in fields) + ")"
        self._fields(kind, len(fields))
        return form
