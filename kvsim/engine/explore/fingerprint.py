"""A state's 64-bit fingerprint (the visited set of `kvsim.engine.explore.store.FingerprintStore`).

A state that is a named tuple (every model's) is fingerprinted from its fields, as Zobrist hashing does
(`FieldFingerprint`): a field value at position i has a 64-bit code, BLAKE2b of its `repr` salted with i,
and the state's fingerprint is its type's code XOR its fields' codes. Codes are kept by value in a cache
per field position (most fields equal those of states met just before). A successor is fingerprinted
against the state it was reached from (`expanding`, then `successor`): the fields it shares with that state
are the same objects (a step rebuilds only what it changes), so only its changed fields' codes are XORed
in, each in place of the parent's. No text of the state is written. Any other state (and a system's own
`encode_state(state) -> bytes`, where it has one) is fingerprinted as text (`TextFingerprint`): BLAKE2b of
its bytes, or of its `repr`.

Two different states differ at some position, where their two values have two codes, each as good as a
uniform random draw (BLAKE2b of two different salted texts): the XOR of the two fingerprints is then
uniform, and the two states share a fingerprint with probability 2**-64, as with a hash of the whole state,
so TLC's estimate over the states reached holds (`FingerprintStore.collision_probability`). It rests on
the contract `RecordText` states: equal field values are one value to the explorer (the models' tests
check that equal fields have one `repr`), so a field's code depends on its value and position only, and a
fingerprint is the same in every process and under any PYTHONHASHSEED (partitioned workers route and keep
states by it, taken from the parent's as here: `kvsim.engine.explore.partition`; checkpoints keep it).
"""

from __future__ import annotations

import hashlib
from itertools import compress
from operator import is_not
from typing import Any, Callable

from ..statetext import FieldCaches, RecordText

_blake2b = hashlib.blake2b


def fingerprint(text: bytes) -> int:
    """A 64-bit fingerprint, never 0 (0 marks an empty slot)."""
    return int.from_bytes(_blake2b(text, digest_size=8).digest(), "little") or 1


def fingerprint_function(system: Any) -> "TextFingerprint | FieldFingerprint":
    """The fingerprint a run uses: BLAKE2b of the system's `encode_state(state) -> bytes` where it has one, else
    from its fields' codes (`FieldFingerprint`; a state that is not a named tuple: BLAKE2b of its `repr`)."""
    encode = getattr(system, "encode_state", None)
    if encode is None:
        return FieldFingerprint()
    return TextFingerprint(encode, getattr(system, "state_text", None))


class TextFingerprint:
    """BLAKE2b of `encode(state)`: a system's own encoding (`encode_state`). `text`: the
    system's `state_text`, the `RecordText` that writes what `encode` encodes, where it has one (`held`)."""

    __slots__ = ("encode", "text")

    def __init__(self, encode: Callable[[Any], bytes], text: RecordText | None = None) -> None:
        self.encode, self.text = encode, text

    def held(self, state: Any) -> Any:
        """`state` made of the field values `text` holds, if it wrote `state` last; else None (`Interner`)."""
        return None if self.text is None else self.text.held(state)

    def __call__(self, state: Any) -> int:
        return fingerprint(self.encode(state))

    def expanding(self, state: Any, key: int) -> None:
        """Nothing to keep of the state whose successors come next."""

    successor = __call__


class FieldFingerprint(FieldCaches):
    """A named tuple's type code XOR its fields' codes (a position's code of a value: BLAKE2b of its `repr`,
    salted with the position); BLAKE2b of the `repr` of any other state.

    Cache entries: a field value -> (its code, the first equal value met, which the search keeps: `held`);
    and, per position, id(a value held) -> (that value, its code), so that a field that is a held object
    (every field of a state the search holds) needs no hash (the entry holds the value: no other object has
    its id meanwhile). `expanding(state)` takes the codes of the state whose successors come next;
    `successor(nxt)` looks up only the fields of `nxt` that are not that state's own objects."""

    __slots__ = ("kinds", "by_id", "base", "base_print", "last", "last_fields")

    def __init__(self, capacity: int = 1 << 14) -> None:
        super().__init__(capacity)
        self.kinds: dict[type, tuple[int, range] | None] = {}  # a named tuple's (code, positions); None: other
        self.by_id: dict[type, list[dict[int, tuple[Any, int]]]] = {}
        self.base: Any = None  # the state whose successors are fingerprinted next, and its fingerprint
        self.base_print = 0
        self.last: Any = None  # the state last fingerprinted, and its fields held here where they differ (else None)
        self.last_fields: list[Any] | None = None

    def held(self, state: Any) -> Any:
        """`state` made of the equal field values this cache holds, if it is the state last fingerprinted; else
        None (`kvsim.engine.explore.store.Interner`). Its fields not looked up are its parent's (held)."""
        if state is not self.last:
            return None
        return state if self.last_fields is None else tuple.__new__(type(state), self.last_fields)

    def __call__(self, state: Any) -> int:
        form = self.kinds.get(type(state), False)
        if form is False:
            form = self._learn(type(state))
        if form is None:
            self.last = None
            return fingerprint(repr(state).encode("utf-8", "backslashreplace"))
        self.last = state
        return self._fold(state, form[1], form[0]) or 1

    def expanding(self, state: Any, key: int) -> None:
        """`state`, whose fingerprint is `key`, is the one whose successors are fingerprinted next (`successor`)."""
        form = self.kinds.get(type(state), False)
        if form is False:
            form = self._learn(type(state))
        # a fingerprint of 1 may be a XOR of 0 (`__call__`): its successors are then fingerprinted whole
        self.base, self.base_print = (None, 0) if form is None or key == 1 else (state, key)

    def successor(self, state: Any) -> int:
        """The fingerprint of a successor of the state last given to `expanding` (of any state: the same value):
        the base's, with the codes of the fields that are not the base's own objects put in place of the base's."""
        base = self.base
        if base is None or type(base) is not type(state):
            return self(state)
        self.last = state
        positions = compress(self.kinds[type(state)][1], map(is_not, state, base))
        return self._fold(state, positions, self.base_print, base) or 1

    def _fold(self, state: Any, positions: Any, out: int, base: Any = None) -> int:
        """`out` XOR the codes of `state`'s fields at `positions` (XOR the codes of `base`'s there, if given). A held
        value that is another object than the field goes into `last_fields`."""
        kind = type(state)
        young, by_id = self.young[kind], self.by_id[kind]
        fields = None
        for i in positions:
            if base is not None:
                mine = by_id[i].get(id(base[i]))  # the base's own field: held, as a rule
                out ^= mine[1] if mine is not None else self._code(kind, i, base[i])[0]
            value = state[i]
            mine = by_id[i].get(id(value))  # a value held here itself (a step can move a field to another)
            if mine is not None:
                out ^= mine[1]
                continue
            entry = young[i].get(value) or self._code(kind, i, value)
            out ^= entry[0]
            if entry[1] is not value:
                if fields is None:
                    fields = list(state)
                fields[i] = entry[1]
        self.last_fields = fields
        if self.size >= self.capacity:
            self._age()
        return out

    def _code(self, kind: type, i: int, value: Any) -> tuple[int, Any]:
        """(the code of `value` at position i, the equal value held), after the young generation missed it."""
        entry = self.old[kind][i].get(value)
        if entry is None:
            text = repr(value).encode("utf-8", "backslashreplace")
            entry = (int.from_bytes(_blake2b(text, digest_size=8, salt=i.to_bytes(4, "little")).digest(), "little"),
                     value)
        self.young[kind][i][entry[1]] = entry
        self.size += 1
        self.by_id[kind][i][id(entry[1])] = (entry[1], entry[0])
        return entry

    def _learn(self, kind: type) -> tuple[int, range] | None:
        fields = getattr(kind, "_fields", None)
        if not issubclass(kind, tuple) or fields is None:
            self.kinds[kind] = None
            return None
        name = f"{kind.__module__}.{kind.__qualname__}({','.join(fields)})"
        form = self.kinds[kind] = (fingerprint(name.encode()), range(len(fields)))
        self._fields(kind, len(fields))
        self.by_id[kind] = [{} for _ in fields]
        return form

    def _age(self) -> None:
        super()._age()
        for dicts in self.by_id.values():  # held again at their next lookup
            for d in dicts:
                d.clear()
