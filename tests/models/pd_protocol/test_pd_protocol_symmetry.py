"""pd-protocol's rooms are interchangeable (`models/pd_protocol/symmetry.py`): the relabelling commutes with every
step on reachable states, and the reduced search keeps every verdict of the full one."""

from __future__ import annotations

from itertools import permutations

import pytest

from kvsim.app import catalog
from kvsim.engine.canon import canonical_json
from kvsim.engine.descriptor import RunSpec
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.symmetry import Relabellings, least_by_repr
from kvsim.engine.system import first_violation, run_actions
from kvsim.models.pd_protocol.symmetry import relabel, relabel_action, room_symmetry, signature

from toys import reachable, symmetry_breaks

SWAP = (1, 0)


def protocol(variant: str, **params):
    return RunSpec.resolve(catalog.models().model("pd-protocol"), variant, params).system()


def swap_breaks(system, states, relabel=relabel) -> str | None:
    """How swapping the two rooms fails to be a symmetry on `states` (`toys.symmetry_breaks`), or None."""
    return symmetry_breaks(system, states, lambda s: relabel(s, SWAP), lambda a: relabel_action(a, SWAP))


def moved(states) -> int:
    """The number of states that are not their own mirror image (the swap undoes itself on every state)."""
    assert all(relabel(relabel(s, SWAP), SWAP) == s for s in states)
    return sum(relabel(s, SWAP) != s for s in states)


@pytest.mark.parametrize("backend", ("mooncake", "nixl", "mori"))
@pytest.mark.parametrize("variant", ("fixed", "pre_35281"))
def test_the_room_swap_commutes_with_every_step(backend, variant):
    clean = protocol(variant, backend=backend, rooms=2, chunks=1, faults=0)
    states = reachable(clean)
    assert swap_breaks(clean, states) is None and moved(states) > len(states) // 2
    faulted = protocol(variant, backend=backend, rooms=2, chunks=1, faults=1, staging=1)
    states = explore(faulted, ExploreOptions(symmetry=False, max_states=1500))._store.states
    assert swap_breaks(faulted, states) is None and moved(states) > 500


def test_a_relabelling_that_forgets_the_queue_is_caught():
    system = protocol("fixed", rooms=2, chunks=1, faults=0)
    assert swap_breaks(system, reachable(system), lambda s, p: relabel(s, p)._replace(queue=s.queue)) is not None


def replays(system, violation) -> None:
    state = next(iter(system.initial_states()))
    for saved in violation.trace:
        state = system.step(state, next(a for a in system.enabled(state)
                                        if canonical_json(a) == canonical_json(saved)))
    end = run_actions(system, [], state)[-1]
    if violation.kind == "invariant":
        assert first_violation(system, end) == (violation.property, violation.message)
    else:
        assert not system.done(end)


@pytest.mark.parametrize("variant,backend", (("pre_35281", "nixl"), ("fixed", "mooncake"), ("pre_35281", "mori")))
def test_the_reduced_search_keeps_every_verdict(variant, backend):
    system = protocol(variant, backend=backend, rooms=2, chunks=1, faults=1)
    every, reduced = explore(system, ExploreOptions(symmetry=False,
                                                    store="fingerprint")), explore(system,
                                                                                   ExploreOptions(store="fingerprint"))
    assert reduced.symmetry and reduced.states < every.states * 0.6
    shape = [lambda r: sorted((v.property, v.kind, len(v.trace)) for v in r.violations),
             lambda r: r.hang_states > 0, lambda r: r.bound_hit]
    assert [f(reduced) for f in shape] == [f(every) for f in shape]
    assert reduced.violations or variant == "fixed"
    for v in reduced.violations:
        replays(system, v)


def test_one_room_or_a_tree_of_rooms_is_not_reduced():
    assert room_symmetry(1) is None and room_symmetry(4) is None
    assert protocol("fixed", rooms=1).canonical is None and protocol("fixed", rooms=2).canonical is not None


def one_per_orbit(canon, states, perms) -> int:
    """`canon` gives every relabelling of every state the same form, a fixed point; how many states it moved."""
    moved = 0
    for s in states:
        c = canon(s)
        assert canon(c) == c
        for p in perms:
            assert canon(relabel(s, p)) == c, (s, p)
        moved += c != s
    return moved


def test_the_signature_ordered_form_is_one_per_orbit_of_three_rooms():
    system = protocol("fixed", rooms=3, chunks=1)
    states = explore(system, ExploreOptions(symmetry=False, max_states=4000, check_liveness=False))._store.states
    perms = list(permutations(range(3)))
    assert one_per_orbit(system.canonical, states, perms) > len(states) // 3
    # the same states under the least `repr` of all six relabellings (the form before signatures): as many orbits
    by_repr = lambda s: least_by_repr(s, (relabel(s, p) for p in perms))[0]  # noqa: E731
    assert len({system.canonical(s) for s in states}) == len({by_repr(s) for s in states})


def test_a_signature_a_relabelling_does_not_carry_is_caught():
    # the room's index in the signature: the order then depends on which member of the orbit is given
    system = protocol("fixed", rooms=2, chunks=1)
    states = explore(system, ExploreOptions(symmetry=False, max_states=2000, check_liveness=False))._store.states
    wrong = Relabellings(2, relabel, lambda s, r: (signature(s, r), -r if r else 0)).canonical
    with pytest.raises(AssertionError):
        one_per_orbit(wrong, states, [SWAP])
