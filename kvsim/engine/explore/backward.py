"""`explore`'s liveness pass in one process: the states from which no alive state (done, cut by a bound, or a
violation) can be reached, found by following the transitions backwards from the alive ones.

`cannot_finish` walks the graph in Python, over one compressed array of predecessors. `hung_states` takes a
store's successor arrays (`successor_arrays`: the targets of state i's transitions are
`targets[starts[i]:starts[i + 1]]`) and, from `BULK` transitions up to `MOST`, marks the states with numpy a
level at a time: the predecessors of the states marked last that are not marked yet are the next level.
`SMALL` levels in a row of fewer than `FEW` states hand the rest of the pass to the walk (a graph that is one
long chain would otherwise take a level per state; the levels from a few done states soon widen). The answer
is a set, whichever way it is found. Below `BULK` the walk is quick (and numpy need not be imported); above
`MOST` the levels' arrays (16 bytes a transition for a moment, where the walk holds 4) would weigh more than
the speed is worth. The partitioned search has its own pass (`kvsim.engine.explore.hangs`); its workers' first
rounds index and mark with `predecessors` and `gather` here.
"""

from __future__ import annotations

from array import array
from itertools import chain, repeat
from typing import Any, Callable, Iterable, Sequence

BULK = 1 << 16  # transitions from which the levels run in numpy
MOST = 1 << 26  # transitions up to which they do
FEW = 64  # SMALL levels in a row of fewer states than this end the levels: the walk finishes the pass
SMALL = 8


def cannot_finish(n: int, edges: Callable[[], Iterable[tuple[int, int]]], alive: bytearray) -> list[int]:
    """The states 0..n-1 from which no `alive` state (done, cut by a bound, or a violation) can be reached.

    `edges()` yields every transition (source, target) afresh (it is read twice); predecessors are kept as
    one compressed array, not a list per state (fingerprint runs hold millions). `alive` is extended in place.
    """
    count = array("I", bytes(4 * (n + 1)))
    for _, tid in edges():
        count[tid + 1] += 1
    for i in range(n):
        count[i + 1] += count[i]
    fill = array("I", count)
    preds = array("i", bytes(4 * count[n]))
    for sid, tid in edges():
        preds[fill[tid]] = sid
        fill[tid] += 1
    _walk([s for s in range(n) if alive[s]], count, preds, alive)
    return [s for s in range(n) if not alive[s]]


def _walk(stack: list[int], count: Sequence[int], preds: Sequence[int], alive: Any) -> None:
    """Marks in `alive` every state that reaches one of `stack` (themselves marked already), depth first."""
    while stack:
        s = stack.pop()
        for k in range(count[s], count[s + 1]):
            p = preds[k]
            if not alive[p]:
                alive[p] = 1
                stack.append(p)


def hung_states(n: int, starts: Sequence[int], targets: array, alive: bytearray) -> list[int]:
    """`cannot_finish` over a store's successor arrays (module doc): numpy levels from `BULK` transitions."""
    if not BULK <= len(targets) <= MOST:
        def edges() -> Iterable[tuple[int, int]]:
            return zip(chain.from_iterable(repeat(s, starts[s + 1] - starts[s]) for s in range(n)), targets)

        return cannot_finish(n, edges, alive)

    import numpy as np

    dst = np.frombuffer(targets, dtype=np.int32)
    first, preds = predecessors(n, np.repeat(np.arange(n, dtype=np.int32), np.diff(np.asarray(starts, np.int64))), dst)
    marked = np.frombuffer(alive, dtype=np.uint8)  # the caller's bytearray, marked in place
    level, small = np.flatnonzero(marked), 0
    while len(level) and small < SMALL:
        small = small + 1 if len(level) < FEW else 0
        found = gather(first, preds, level)
        level = np.unique(found[marked[found] == 0])
        marked[level] = 1
    if len(level):  # (the walk marks through the bytearray: `marked` is a view of it)
        _walk(level.tolist(), array("q", first.tobytes()), array("i", preds.tobytes()), alive)
    return np.flatnonzero(marked == 0).tolist()


def predecessors(n: int, sources: Any, targets: Any) -> tuple[Any, Any]:
    """(first, preds), numpy arrays: the predecessors of state i (of 0..n-1) are `preds[first[i]:first[i + 1]]`,
    in the order of the transitions (`sources[k]` -> `targets[k]`, numpy arrays of one length)."""
    import numpy as np

    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(targets, minlength=n), out=first[1:])
    return first, sources[np.argsort(targets, kind="stable")]


def gather(first: Any, preds: Any, level: Any) -> Any:
    """The predecessors (`predecessors`) of the states of `level` (a numpy array, not empty), one after another."""
    import numpy as np

    lo, sizes = first[level], first[level + 1] - first[level]
    ends = np.cumsum(sizes)
    return preds[np.repeat(lo - (ends - sizes), sizes) + np.arange(int(ends[-1]))]
