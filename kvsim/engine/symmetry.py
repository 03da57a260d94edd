"""Canonical forms of a model's symmetries: one representative per orbit of its interchangeable components.

A system that defines `canonical(state)` is explored one representative per orbit (`kvsim.engine.explore`).
Where the symmetry permutes components (rooms, ranks, requests), `Relabellings` gives that form from a
relabelling and a signature per component; `least_by_repr` is the plain form (the least `repr` among every
relabelling) it must agree with.
"""

from __future__ import annotations

from itertools import product
from typing import Any, Callable, Hashable, Iterable, Sequence

from .statetext import RecordText


class Relabellings:
    """The canonical form of a symmetry that permutes `n` interchangeable components (rooms, requests).

    `relabel(state, p)` renames component c to p[c] everywhere; `signature(state, c)` is a comparable
    summary of component c that a relabelling carries along with it
    (`signature(relabel(s, p), p[c]) == signature(s, c)`), cheap next to a `repr` of the state.
    `canonical(state)` is the least by `repr` of the relabellings that put the components in
    signature order: that set of relabellings depends only on the orbit, so the result is one
    representative per orbit, as `least_by_repr` over every relabelling would give, but the `repr`s
    are only taken where signatures tie (and the relabelling only where the order is not already
    the signature order).

    `twin(state, c)`, where given, is a hashable value such that two components with one signature and
    one twin value are identical: exchanging them leaves the state as it is. Of the orders of such
    components only one is tried (the others give the same forms), so a state whose components are
    all alike costs one relabelling, not n! of them.
    """

    def __init__(self, n: int, relabel: Callable[[Any, tuple[int, ...]], Any],
                 signature: Callable[[Any, int], Any], twin: Callable[[Any, int], Hashable] | None = None) -> None:
        self.identity = tuple(range(n))
        self.relabel, self.signature, self.twin = relabel, signature, twin
        self.texts = RecordText()

    def canonical(self, state: Any) -> Any:
        ordered = self.ordered(state)
        forms = (state if p == self.identity else self.relabel(state, p) for p in ordered)
        if len(ordered) == 1:
            return next(forms)
        return least_by_repr(next(forms), forms, self.texts)[0]

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
