"""The transition-system contract every control-plane model implements.

A state is hashable and immutable; `enabled` lists actions in a deterministic
order (faults are actions too); `step` is a pure function. A system may also
offer `transition(state, action) -> (state, effects)`: the same step, plus a
tuple of what it did (messages sent, work queued, rooms concluded), so a
driver such as a timed simulation learns that from the system instead of
diffing two states. `step` stays the explorer's entry point. Invariants are
named checks that return None when they hold and a message when they do not:
the explorer calls them on every reached state, so they stay exception-free
in the common case.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from itertools import product
from typing import Any, Callable, Generic, Hashable, Iterable, Protocol, Sequence, TypeVar

S = TypeVar("S", bound=Hashable)
A = TypeVar("A", bound=Hashable)


@dataclass(frozen=True)
class Invariant(Generic[S]):
    name: str
    check: Callable[[S], str | None]
    doc: str = ""


class TransitionSystem(Protocol[S, A]):
    name: str
    variant: str
    invariants: Sequence[Invariant[S]]

    def initial_states(self) -> Iterable[S]: ...

    def enabled(self, state: S) -> Sequence[A]: ...

    def step(self, state: S, action: A) -> S: ...

    def done(self, state: S) -> bool: ...


def flag(state: Any, name: str, message: str) -> Any:
    """`state` (a NamedTuple with a sorted `flags` tuple) with the invariant `name` marked violated, once.

    A transition that sees a violation it cannot express as a check over the state records it here;
    `flagged(name)` is the matching invariant."""
    if any(f[0] == name for f in state.flags):
        return state
    return state._replace(flags=tuple(sorted(state.flags + ((name, message),))))


def flagged(name: str) -> Callable[[Any], str | None]:
    """The invariant check of a `flag`: the recorded message, or None."""
    def check(state: Any) -> str | None:
        for f in state.flags:
            if f[0] == name:
                return f[1]
        return None
    return check


class Relabellings:
    """The canonical form of a symmetry that permutes `n` interchangeable components (rooms, requests).

    `relabel(state, p)` renames component c to p[c] everywhere; `signature(state, c)` is a comparable
    summary of component c that a relabelling carries along with it
    (`signature(relabel(s, p), p[c]) == signature(s, c)`), cheap next to a `repr` of the state.
    `canonical(state)` is the least by `repr` of the relabellings that put the components in
    signature order: that set of relabellings depends only on the orbit, so the result is one
    representative per orbit, as `least_by_repr` over every relabelling would give, but the `repr`s
    are only taken where signatures tie (and the relabelling only where the order is not already
    the signature order). `text` returns the `repr` of the form it last chose where it took one.

    `twin(state, c)`, where given, is a hashable value such that two components with one signature and
    one twin value are identical: exchanging them leaves the state as it is. Of the orders of such
    components only one is tried (the others give the same forms), so a state whose components are
    all alike costs one relabelling, not n! of them.
    """

    def __init__(self, n: int, relabel: Callable[[Any, tuple[int, ...]], Any],
                 signature: Callable[[Any, int], Any], twin: Callable[[Any, int], Hashable] | None = None) -> None:
        self.identity = tuple(range(n))
        self.relabel, self.signature, self.twin = relabel, signature, twin
        self.last: tuple[Any, str] | None = None
        self.texts = RecordText()

    def canonical(self, state: Any) -> Any:
        ordered = self.ordered(state)
        forms = (state if p == self.identity else self.relabel(state, p) for p in ordered)
        if len(ordered) == 1:
            return next(forms)
        best, text = least_by_repr(next(forms), forms, self.texts)
        self.last = (best, text)
        return best

    def ordered(self, state: Any) -> list[tuple[int, ...]]:
        """The relabellings of `state` that put its components in signature order, one per order of twins."""
        sigs = [self.signature(state, c) for c in self.identity]
        order = sorted(self.identity, key=sigs.__getitem__)  # position i holds component order[i]
        groups = [[order[0]]]
        for c in order[1:]:
            if sigs[c] == sigs[groups[-1][0]]:
                groups[-1].append(c)
            else:
                groups.append([c])
        if len(groups) == len(order):
            return [_inverse(order)]
        arrangements = [_arrangements(self._twins(state, g)) for g in groups]
        return [_inverse([c for part in parts for c in part]) for parts in product(*arrangements)]

    def _twins(self, state: Any, group: list[int]) -> list[list[int]]:
        """The components of `group` in classes of identical ones (each its own class without `twin`)."""
        if self.twin is None or len(group) == 1:
            return [[c] for c in group]
        classes: dict[Hashable, list[int]] = {}
        for c in group:
            classes.setdefault(self.twin(state, c), []).append(c)
        return list(classes.values())

    def text(self, state: Any) -> str:
        """`repr(state)`, taken again only if `state` is not the form `canonical` last chose by `repr`."""
        last = self.last
        return last[1] if last is not None and last[0] is state else self.texts(state)


def _inverse(order: Sequence[int]) -> tuple[int, ...]:
    """The relabelling that puts component order[i] at position i."""
    p = [0] * len(order)
    for i, c in enumerate(order):
        p[c] = i
    return tuple(p)


def _arrangements(classes: list[list[int]]) -> list[tuple[int, ...]]:
    """Every sequence of all the components of `classes` in which each class keeps its members' order: the
    orders that differ other than by exchanging members of one class."""
    found: list[tuple[int, ...]] = []
    _extend(classes, [0] * len(classes), [], sum(map(len, classes)), found)
    return found


def _extend(classes: list[list[int]], taken: list[int], out: list[int], total: int,
            found: list[tuple[int, ...]]) -> None:
    # a function of the module, not a closure calling itself: that would be a reference cycle a call, and a
    # search collects cycles every few thousand states once it meets one (`memory.YoungCollections`)
    if len(out) == total:
        found.append(tuple(out))
        return
    for i, members in enumerate(classes):
        if taken[i] < len(members):
            out.append(members[taken[i]])
            taken[i] += 1
            _extend(classes, taken, out, total, found)
            taken[i] -= 1
            out.pop()


def least_by_repr(state: Any, others: Iterable[Any], text_of: Callable[[Any], str] = repr) -> tuple[Any, str]:
    """`(form, repr(form))` of the least `repr` among `state` and `others`: the canonical form of a symmetry whose
    relabellings of `state` are `others` (one representative per orbit, the same whichever member is given).
    `text_of` gives the `repr` (a `RecordText` gives it faster)."""
    best, text = state, text_of(state)
    for other in others:
        other_text = text_of(other)
        if other_text < text:
            best, text = other, other_text
    return best, text


_NAMED_TUPLE_REPR = namedtuple("_Probe", "x").__repr__.__code__  # every named tuple's own `repr` runs this code


class FieldCaches:
    """Values met lately, by equal value: per named-tuple type, one dict per field position, in two generations
    of at most `capacity` entries together (`RecordText`, `kvsim.engine.store.Interner`)."""

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

    A search writes the text of every state it reaches (the fingerprint is taken of it); most fields of a
    state equal the same field of states met just before, so their `repr`s are looked up, not written
    again (pd-staging: a search 1.3x as fast). One cache per field position, two generations of at most
    `capacity` entries together. A value stands for every value equal to it: states that compare
    equal are one state to the explorer (the full store and its cache of recent successors already
    hold them so), and the models' tests check that equal fields have one `repr`. Anything that is not
    a named tuple gets its `repr`. The cache keeps the first of equal field values it met: `held` gives
    the state last written made of those (what a search keeps, `kvsim.engine.store.Interner`).
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


def transition(system: Any, state: Any, action: Any) -> tuple[Any, tuple[Any, ...]]:
    """`system.transition(state, action)` where the system has one; else its `step` with no effects."""
    fn = getattr(system, "transition", None)
    if fn is None:
        return system.step(state, action), ()
    return fn(state, action)


def first_violation(system: TransitionSystem[Any, Any], state: Any) -> tuple[str, str] | None:
    """(invariant name, message) of the first invariant that fails on `state`."""
    for inv in system.invariants:
        message = inv.check(state)
        if message is not None:
            return inv.name, message
    return None


def run_actions(system: TransitionSystem[Any, Any], actions: Sequence[Any], initial: Any = None) -> list[Any]:
    """Apply `actions` from the first initial state; each must be enabled. Returns the visited states."""
    state = next(iter(system.initial_states())) if initial is None else initial
    states = [state]
    for i, action in enumerate(actions):
        if action not in system.enabled(state):
            raise ValueError(f"action {i} {action!r} is not enabled in state {state!r}")
        state = system.step(state, action)
        states.append(state)
    return states
