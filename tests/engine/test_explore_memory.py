"""A search's memory: the collector paused while it runs, the text a state's fingerprint is taken of, and the
states it keeps sharing their equal fields (`kvsim.engine.memory`, `statetext.RecordText`, `store.Interner`, and the
fingerprint's field caches: `tests/engine/test_explore_fingerprint.py`)."""

from __future__ import annotations

import time
from collections import deque

import pytest

from kvsim.app import catalog
from kvsim.engine.descriptor import RunSpec
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.explore.parallel import _search, absorb_level
from kvsim.engine.explore.partition import Partition
from kvsim.engine.explore.store import Interner
from test_explore_scale import Inline, run_of
from toys import Counter, Pair


# -- the collector during a search ------------------------------------------------------------------------------

def test_a_search_leaves_the_collector_as_it_found_it():
    import gc

    frozen = gc.get_freeze_count()
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            explore(Pair(gap=3, jam=True), ExploreOptions(store="fingerprint"))
            assert gc.isenabled() is enabled and gc.get_freeze_count() == frozen
        finally:
            gc.enable()
    class Crashing(Counter):  # a model that fails mid-search
        def step(self, state, action):
            if state == 2:
                raise ZeroDivisionError("step")
            return super().step(state, action)

    with pytest.raises(ZeroDivisionError):
        explore(Crashing(limit=5))
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_the_collector_still_reclaims_cycles_a_model_makes():
    import gc
    import weakref

    from kvsim.engine.memory import YoungCollections

    class Node:
        pass

    refs = []
    collector = YoungCollections()
    try:
        for _ in range(40):
            for _ in range(50):
                node = Node()
                node.self = node  # a reference cycle, unreachable once `node` moves on
                refs.append(weakref.ref(node))
            del node
            collector.tick()
        assert collector.collect  # the first sampled tick found cycles: every tick collects since
        assert sum(r() is not None for r in refs) == 0  # none was frozen alive
    finally:
        collector.close()
    assert gc.isenabled()


# -- the texts a field's code and a symmetry's comparison are taken of ------------------------------------------------

def test_record_text_is_the_repr_of_every_state_each_model_reaches():
    # the fields' texts are looked up by value: the models must give equal field values one repr (0 and False in
    # one field would be two states to `repr` and one to the cache); checked on every state of each model's default
    # configuration and of a pre-fix variant, in the order the search meets them, the cache warm
    from kvsim.engine.statetext import RecordText

    reg = catalog.models()
    models = [m for m in reg.models.values() if m.system is not None]
    assert len(models) >= 5
    for spec in models:
        for variant in ("fixed", spec.variants.names[-1]):
            states = reached(RunSpec.resolve(spec, variant, {}).system(), 20_000)
            text, intern = RecordText(), Interner()
            assert [text(s) for s in states] == [repr(s) for s in states], (spec.name, variant)
            assert [repr(intern(s)) for s in states] == [repr(s) for s in states], (spec.name, variant)


def reached(system, limit: int) -> list:
    """The first `limit` states a breadth-first search meets, as the model's steps built them (not interned)."""
    seen = {s: None for s in system.initial_states()}
    queue = deque(seen)
    while queue and len(seen) < limit:
        state = queue.popleft()
        for action in system.enabled(state):
            nxt = system.step(state, action)
            if nxt not in seen:
                seen[nxt] = None
                queue.append(nxt)
    return list(seen)[:limit]


def test_a_search_holds_equal_fields_of_its_states_once():
    # every state the search keeps (full store: all of them) is made of the equal field values held before
    def shared(states):
        return all(len({id(s[i]) for s in states}) == len({s[i] for s in states}) for i in range(len(states[0])))

    system = run_of("pd-staging", "pre_05c7ebf").system
    assert not shared(reached(system(), 1000))  # the steps rebuild equal fields
    assert shared(explore(system(), ExploreOptions(store="full"))._store.states)
    parts = [Partition(system, w, 2, "full", True, None) for w in range(2)]
    result = _search(system(), Inline(parts), 2, time.perf_counter(),
                     ExploreOptions(max_states=10 ** 7, check_liveness=False, store="full"))
    assert result.bound_hit is None and all(shared(list(part.ids)) for part in parts)  # each its own
    # the fingerprint store keeps no state: a worker's frontier, its own successors and those sent to it, shares them
    parts = [Partition(system, w, 2, "fingerprint", True, None) for w in range(2)]
    pool, inboxes, sent, widest = Inline(parts), [[box] for box in parts[0].initial()], 0, 0
    try:
        for depth in range(12):
            absorb_level(pool, 2, inboxes, depth)
            sent += sum(len(positions) for asked in pool.answers["absorb"] for positions in asked)
            frontiers = [[state for _, state, _ in part.frontier] for part in parts]
            assert all(shared(states) for states in frontiers if states), depth
            widest = max([widest] + [len(states) for states in frontiers])
            outboxes = [part.expand()[0] for part in parts]
            inboxes = [[outboxes[src][dst] for src in range(2)] for dst in range(2)]
    finally:
        for part in parts:
            part.finish()
    assert sent > 0 and widest > 50  # states that came from the other worker, in a wide frontier


def test_an_interned_state_keeps_its_parents_fields_and_equal_values_as_one_object():
    from collections import namedtuple

    Two = namedtuple("Two", "a b")
    intern = Interner(capacity=8)
    first = intern(Two(tuple([1, 2]), "p"))
    second = intern(Two(tuple([1, 2]), "q"))
    assert second == Two((1, 2), "q") and second.a is first.a  # one (1, 2)
    again = Two(first.a, "p")
    assert intern(again) is again  # nothing to replace: the state itself
    parent = Two([0], (3,))
    child = Two(parent.a, (4,))
    assert intern(child, like=parent) == child  # the parent's own field is kept as it is, without a lookup
    with pytest.raises(TypeError):
        intern(child)  # (a lookup would take its hash: a list has none)
    plain = (1, 2)
    assert intern(plain) is plain


def test_a_state_whose_text_was_just_written_is_interned_from_the_text_cache():
    from collections import namedtuple

    from kvsim.engine.statetext import RecordText

    Two = namedtuple("Two", "a b")
    text = RecordText()
    intern = Interner(text=text)
    first, second = Two(tuple([1, 2]), "p"), Two(tuple([1, 2]), "q")
    assert (text(first), text(second)) == (repr(first), repr(second))
    assert text.held(first) is None  # not the state last written
    held = intern(second)
    assert held == second and held.a is first.a  # the cache's (1, 2)
    assert intern.young == {}  # no lookup of its own


def test_record_text_tells_apart_what_repr_tells_apart():
    from collections import namedtuple

    from kvsim.engine.statetext import RecordText

    Two = namedtuple("Two", "a b")

    class Custom(Two):
        def __repr__(self):
            return "custom"

    text = RecordText(capacity=4)
    seen = [Two(1, (2, 3)), Two(1, (2, 4)), Two((), None), Custom(1, 2), Two(Two(1, 2), "x"), (1, 2), "s"]
    for _ in range(3):  # the second and third rounds come from the caches (and from the old generation)
        assert [text(s) for s in seen] == [repr(s) for s in seen]
    assert text(Two(0, 1)) == "Two(a=0, b=1)" and text(Two(False, 1)) == "Two(a=0, b=1)"  # one value, one text


def test_collection_paused_restores_the_collector_as_it_was():
    import gc

    from kvsim.engine.memory import collection_paused

    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            with pytest.raises(KeyError):
                with collection_paused():
                    assert not gc.isenabled()
                    raise KeyError
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
