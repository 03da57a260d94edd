"""The liveness pass of the search in one process (`kvsim.engine.explore.backward`): numpy's levels and the walk
in Python find the same hung states, and the stores give the same successor arrays; a partitioned search's pass
(`kvsim.engine.explore.hangs`) finds the states one process finds, either way."""

import random
import time
from array import array

import pytest

from kvsim.engine.explore import ExploreOptions, backward, cannot_finish, explore, hangs
from kvsim.engine.explore.parallel import _search
from kvsim.engine.explore.partition import Partition
from test_explore_scale import Inline
from toys import Counter


def graphs():
    """(n, successor lists, alive): random graphs of several shapes, and ones whose levels shrink below `FEW`."""
    rng = random.Random(20261206)
    for _ in range(60):
        n = rng.randint(1, 300)
        degree = rng.choice((0, 1, 2, 5))
        succ = [[rng.randrange(n) for _ in range(rng.randint(0, degree))] for _ in range(n)]
        alive = [rng.random() < rng.choice((0.0, 0.01, 0.2)) for _ in range(n)]
        yield n, succ, alive
    # a wide fan into a long chain: some levels of hundreds of states, then levels of one (the walk's part)
    n = 1200
    succ = [[s + 1] for s in range(600)] + [[0] for _ in range(600)]
    succ[599] = [599, 600]  # the chain's end loops, or reaches state 600
    yield n, succ, [s == 600 for s in range(n)]
    yield n, succ, [s == 599 for s in range(n)]
    yield n, succ, [s > 600 for s in range(n)]  # a level of 599, then of one


@pytest.mark.parametrize("bulk, few, small", [(0, 1, 8), (0, 4, 1), (0, 64, 8), (0, 64, 1), (1 << 30, 64, 8)])
def test_the_levels_and_the_walk_find_the_same_hung_states(monkeypatch, bulk, few, small):
    """Levels to the end (a level is never under 1 state), the walk taking over sooner or later, the walk alone."""
    monkeypatch.setattr(backward, "BULK", bulk)
    monkeypatch.setattr(backward, "FEW", few)
    monkeypatch.setattr(backward, "SMALL", small)
    shapes = 0
    for n, succ, alive in graphs():
        starts = array("I", [0])
        for targets in succ:
            starts.append(starts[-1] + len(targets))
        targets = array("i", [t for ts in succ for t in ts])
        walked = bytearray(alive)
        expected = cannot_finish(n, lambda: ((s, t) for s in range(n) for t in succ[s]), walked)
        marked = bytearray(alive)
        assert backward.hung_states(n, starts, targets, marked) == expected
        assert marked == walked  # every state that can finish is marked, in place
        shapes += bool(expected) and len(expected) < n
    assert shapes > 10  # graphs where some states hang and some do not


@pytest.mark.parametrize("store", ["full", "fingerprint"])
def test_explore_reports_the_same_hangs_through_the_levels(monkeypatch, store):
    system = Counter(limit=10, bad=None, trap=True)
    walked = explore(system, ExploreOptions(store=store))
    monkeypatch.setattr(backward, "BULK", 0)
    monkeypatch.setattr(backward, "FEW", 1)
    levels = explore(system, ExploreOptions(store=store))
    assert levels.hang_states == walked.hang_states == 1
    assert [(v.kind, v.trace, v.message) for v in levels.violations] == \
        [(v.kind, v.trace, v.message) for v in walked.violations]


def test_both_stores_give_the_same_successor_arrays_and_ends():
    """The fingerprint store keeps no list for the states after the last one expanded (a bound cut them): they
    get empty ones, as the full store's. Where the pass starts (`ends`): the states done, violating (5) or not
    expanded, read from the full store's lists and from the fingerprint store's flags."""
    def search(store, states=9):
        return explore(Counter(limit=8, bad=5, trap=True),
                       ExploreOptions(max_states=states, check_liveness=False, store=store))

    full, kept = search("full"), search("fingerprint")
    assert kept._store.successor_arrays() == full._store.successor_arrays()
    starts, targets = full._store.successor_arrays()
    assert len(starts) == kept.states + 1 and starts[-1] == len(targets) > 0
    assert len(kept._store.succ.succ_start) < len(starts)  # the padding was needed
    for full, kept in ((full, kept), (search("full", 100), search("fingerprint", 100))):  # bounded, complete
        ends, store = full._store.ends(), full._store
        assert kept._store.ends() == ends and 0 < sum(ends) < len(ends) == kept.states
        assert list(ends) == [int(store.done[s] or store.bad[s] or not store.expanded(s)) for s in range(len(ends))]
    assert store.expanded(store.done.index(True))  # the done state of the complete search: expanded, an end


class Graph:
    """A transition system over the states 0..n-1 of a graph from `graphs` (state 0 initial), done where `alive`."""

    liveness = "finishes"

    def __init__(self, succ, alive):
        self.name, self.variant, self.invariants = "graph", "fixed", ()
        self.succ, self.alive = succ, alive

    def initial_states(self):
        return (0,)

    def enabled(self, state):
        return [("to", t) for t in self.succ[state]]

    def step(self, state, action):
        return action[1]

    def done(self, state):
        return self.alive[state]


@pytest.mark.parametrize("bulk, most, few, small", [(0, 1 << 30, 1, 8), (0, 1 << 30, 64, 1), (1 << 30, 1 << 30, 64, 8),
                                                     (0, 0, 64, 8)])
def test_workers_find_the_hung_states_one_process_finds(monkeypatch, bulk, most, few, small):
    """Three partitions' pass (their first rounds by numpy's levels to the end, handing over to the walk at once,
    or walked, below the levels' bounds and above): as many hung states as one process finds, the same first one."""
    for name, value in (("BULK", bulk), ("MOST", most), ("FEW", few), ("SMALL", small)):
        monkeypatch.setattr(hangs, name, value)
    shapes = 0
    for n, succ, alive in graphs():
        system = Graph(succ, alive)
        one = explore(system, ExploreOptions(store="fingerprint", symmetry=False))
        parts = [Partition(lambda: system, w, 3, "fingerprint", False, None) for w in range(3)]
        three = _search(system, Inline(parts), 3, time.perf_counter(), ExploreOptions(store="fingerprint"))
        assert (three.states, three.hang_states) == (one.states, one.hang_states)
        assert [(v.kind, len(v.trace), v.message) for v in three.violations] == \
            [(v.kind, len(v.trace), v.message) for v in one.violations]
        shapes += 0 < one.hang_states < one.states
    assert shapes > 10  # graphs where some reachable states hang and some do not
