"""pipelined-transfer: the requests, and the sender ranks, are interchangeable, so `canonical` is a symmetry.

Proved on small two-request configurations by checking every reachable state (no reduction) against the
swap of the two requests: the relabelled state has exactly the relabelled enabled actions, each step
commutes with the relabelling, `done` and every invariant's verdict agree, and both states get one
representative. Then the explorer with and without the reduction gives the same violations, trace lengths
and liveness verdict, and its reported paths are real paths of the unreduced system. The same for the swap of
the two sender ranks (each rank sends the same slices into its own destination segment).
"""

from itertools import permutations

import pytest

from kvsim.engine.actions import decode
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.symmetry import Relabellings, least_by_repr
from kvsim.engine.system import run_actions
from kvsim.models.pipelined_transfer import DESCRIPTOR, symmetry
from kvsim.models.pipelined_transfer.state import ACTIONS

from toys import reachable, symmetry_breaks

SWAP = (1, 0)
OWN_PAGES = {"requests": 2, "prompt_len": 4, "chunk_tokens": 2, "faults": "gen_cancel,drop", "timeouts": 0}
SHARED_POOL = {"requests": 2, "prompt_len": 2, "chunk_tokens": 1, "rx_pages": 1, "faults": "gen_cancel",
               "timeouts": 0}
TWO_RANKS = {"ranks": 2, "prompt_len": 4, "chunk_tokens": 2, "faults": "fail,drop,gen_cancel"}
TWO_BY_TWO = {"requests": 2, "ranks": 2, "prompt_len": 2, "chunk_tokens": 2, "faults": "", "fault_budget": 0,
              "timeouts": 0}


def request_swap_breaks(system, states, relabel=symmetry.relabel):
    return symmetry_breaks(system, states, lambda s: relabel(s, SWAP, system.page_block),
                           lambda a: symmetry.relabel_action(a, SWAP), two_per_orbit=True)


def rank_symmetry_breaks(system, states, relabel=symmetry.relabel_ranks):
    """The same for swapping the two sender ranks."""
    return symmetry_breaks(system, states, lambda s: relabel(s, SWAP), lambda a: symmetry.relabel_rank_action(a, SWAP))


@pytest.mark.parametrize("swap,variant,params", [
    ("requests", "fixed", OWN_PAGES), ("requests", "fixed", SHARED_POOL),
    ("requests", "proposed_rx_release_after_drain", SHARED_POOL),
    ("ranks", "fixed", TWO_RANKS), ("ranks", "pre_15519", TWO_RANKS),
    ("ranks", "proposed_rx_release_after_drain", TWO_RANKS), ("ranks", "fixed", TWO_BY_TWO)])
def test_swapping_requests_or_ranks_is_a_symmetry_on_every_reachable_state(swap, variant, params):
    system = DESCRIPTOR.build_system(variant, params)
    states = reachable(system)
    assert len(states) > 500
    breaks = request_swap_breaks if swap == "requests" else rank_symmetry_breaks
    assert breaks(system, states) is None


def test_a_relabelling_that_forgets_a_component_is_no_symmetry():
    """The check above can fail: relabel everything but the result frames in flight."""
    system = DESCRIPTOR.build_system("fixed", OWN_PAGES)

    def forgetful(s, perm, block):
        return symmetry.relabel(s, perm, block)._replace(frames=s.frames)

    assert "step" in request_swap_breaks(system, reachable(system), forgetful)


def test_a_canonical_form_that_is_no_symmetry_is_caught_by_the_explorer(monkeypatch):
    """The explorer's own check: mapping a reported path back through a bad representative fails."""
    system = DESCRIPTOR.build_system("fixed", OWN_PAGES)

    def forgetful(s):  # sorts the requests but leaves their result frames where they were
        c = symmetry.canonical(s, system.page_block)
        return c if c == s else c._replace(frames=s.frames)

    monkeypatch.setattr(system, "canonical", forgetful)
    with pytest.raises(AssertionError, match="not a symmetry"):
        explore(system)


@pytest.mark.parametrize("variant,params,found", [
    ("fixed", OWN_PAGES, {"S1_no_use_after_free", "E4_every_request_settles"}),
    ("fixed", SHARED_POOL, {"S1_no_use_after_free"}),
    ("proposed_rx_release_after_drain", SHARED_POOL, set())])
def test_reduction_keeps_violations_and_liveness_and_stores_fewer_states(variant, params, found):
    system = DESCRIPTOR.build_system(variant, params)
    every, reduced = explore(system, ExploreOptions(symmetry=False)), explore(system)
    assert reduced.symmetry and not every.symmetry and reduced.states < every.states
    assert {v.property: len(v.trace) for v in reduced.violations} == {
        v.property: len(v.trace) for v in every.violations}
    assert {v.property for v in every.violations} == found
    assert (reduced.hang_states > 0) == (every.hang_states > 0)
    for v in reduced.violations:  # a real path of the unreduced system, ending where the report says
        end = run_actions(system, [decode(a, ACTIONS) for a in v.trace])[-1]
        if v.kind == "invariant":
            inv = next(i for i in system.invariants if i.name == v.property)
            assert inv.check(end) is not None
        else:
            assert not system.done(end) and end == v.state


def test_canonical_sorts_by_request_and_renames_flags():
    system = DESCRIPTOR.build_system("fixed", OWN_PAGES)
    s = system.initial_states()[0]
    later = system.step(s, system.enabled(s)[0])  # request 0 computed its first chunk
    swapped = symmetry.relabel(later, SWAP, system.page_block)
    assert swapped.reqs[1].computed == 1 and swapped.rx[1].pages == (2, 3)
    assert system.canonical(later) == system.canonical(swapped)
    flagged = later._replace(flags=(("S9_outcome_stable", "request 0: outcome changed"),))
    assert symmetry.relabel(flagged, SWAP).flags == (("S9_outcome_stable", "request 1: outcome changed"),)


def test_a_rank_relabelling_that_forgets_the_destination_segments_is_no_symmetry():
    """The check above can fail: relabel the ranks everywhere but in the receiver's destination cells."""
    system = DESCRIPTOR.build_system("fixed", TWO_RANKS)

    def forgetful(s, perm):
        out = symmetry.relabel_ranks(s, perm)
        return out._replace(rx=tuple(rx._replace(dest=old.dest) for rx, old in zip(out.rx, s.rx)))

    assert rank_symmetry_breaks(system, reachable(system), forgetful) is not None


@pytest.mark.parametrize("variant,params,found", [
    ("fixed", TWO_RANKS, {"S1_no_use_after_free", "E4_every_request_settles"}),
    ("fixed", dict(TWO_RANKS, faults="dup", fault_budget=2), {"S3_no_early_completion", "E4_every_request_settles"}),
    ("local_quiescence", dict(TWO_RANKS, faults="cancel"), {"S1_no_use_after_free", "S2_ownership_covers_flight"}),
    ("proposed_rx_release_after_drain", dict(TWO_RANKS, faults="gen_cancel,cancel"), set())])
def test_rank_reduction_keeps_violations_and_liveness(variant, params, found):
    system = DESCRIPTOR.build_system(variant, params)
    every, reduced = explore(system, ExploreOptions(symmetry=False)), explore(system)
    assert reduced.states < every.states
    assert {v.property: len(v.trace) for v in reduced.violations} == {
        v.property: len(v.trace) for v in every.violations}
    assert {v.property for v in every.violations} == found
    assert (reduced.hang_states > 0) == (every.hang_states > 0)
    for v in reduced.violations:
        end = run_actions(system, [decode(a, ACTIONS) for a in v.trace])[-1]
        if v.kind == "invariant":
            inv = next(i for i in system.invariants if i.name == v.property)
            assert inv.check(end) is not None


THREE_RANKS = {"ranks": 3, "prompt_len": 4, "chunk_tokens": 2, "faults": "fail,drop", "timeouts": 0}
TWO_BY_THREE = {"requests": 2, "ranks": 3, "prompt_len": 2, "chunk_tokens": 2, "faults": "drop", "fault_budget": 1,
                "timeouts": 0}


def orbit_breaks(canon, system, states, rank_perms, request_perms=((0,),)):
    """The first state of `states` whose relabellings (ranks, then requests) `canon` does not map to one form."""
    for s in states:
        c = canon(s)
        if canon(c) != c:
            return s
        for p in rank_perms:
            for q in request_perms:
                t = symmetry.relabel_ranks(s, p)
                t = symmetry.relabel(t, q, system.page_block) if len(q) > 1 else t
                if canon(t) != c:
                    return s
    return None


@pytest.mark.parametrize("params", [THREE_RANKS, TWO_BY_THREE])
def test_the_rank_signature_form_is_one_per_orbit_of_three_ranks(params):
    system = DESCRIPTOR.build_system("fixed", params)
    states = explore(system, ExploreOptions(symmetry=False, max_states=6000, check_liveness=False))._store.states
    ranks = list(permutations(range(3)))
    requests = list(permutations(range(params.get("requests", 1))))
    assert orbit_breaks(system.canonical, system, states, ranks, requests) is None
    # as many orbits as the least `repr` of the request-sorted forms of all six rank relabellings (the form before
    # rank signatures)
    sort = symmetry.Canonical(system.page_block)
    every = lambda s: least_by_repr(sort(s), (sort(symmetry.relabel_ranks(s, p)) for p in ranks))[0]  # noqa: E731
    forms = {system.canonical(s) for s in states}
    assert len(forms) == len({every(s) for s in states}) < len(states) // 2


def test_identical_ranks_are_ordered_once():
    """Every rank alike (the initial state): one relabelling, not six. Rank 0 ahead of ranks 1 and 2, still
    alike: one, not two. A flag naming rank 1 tells it from rank 2: two."""
    system = DESCRIPTOR.build_system("fixed", THREE_RANKS)
    order = system._canonical.order
    untwinned = Relabellings(3, order.relabel, symmetry.rank_signature)
    s = system.initial_states()[0]
    assert (len(order.ordered(s)), len(untwinned.ordered(s))) == (1, 6)
    s = system.step(s, next(a for a in system.enabled(s) if a.tag == "compute"))
    s = system.step(s, next(a for a in system.enabled(s) if a.tag == "write_done" and a.rank == 0))
    assert (len(order.ordered(s)), len(untwinned.ordered(s))) == (1, 2)
    named = s._replace(flags=(("S3_no_early_completion", "rank 1: early"),))
    assert len(order.ordered(named)) == 2
    assert system.canonical(symmetry.relabel_ranks(s, (2, 0, 1))) == system.canonical(s)


def test_a_twin_that_calls_unlike_ranks_identical_is_caught():
    """Two requests: ranks with one signature (their slices sorted) can still differ in which request holds
    what. A twin that calls them identical tries one order only, and the form then depends on the member."""
    system = DESCRIPTOR.build_system("fixed", TWO_BY_THREE)
    states = explore(system, ExploreOptions(symmetry=False, max_states=6000, check_liveness=False))._store.states
    sort = symmetry.Canonical(system.page_block)
    lying = Relabellings(3, system._canonical.order.relabel, symmetry.rank_signature, lambda s, k: 0)
    wrong = lambda s: lying.canonical(sort(s))  # noqa: E731
    assert orbit_breaks(wrong, system, states, list(permutations(range(3))), [(0, 1), (1, 0)]) is not None


def test_the_canonical_form_makes_no_reference_cycles():
    """A search collects cycles every few thousand states once its steps make any (`memory.YoungCollections`):
    ordering tied ranks must leave none behind."""
    import gc

    system = DESCRIPTOR.build_system("fixed", THREE_RANKS)
    s = system.initial_states()[0]  # every rank tied
    gc.collect()
    gc.disable()
    try:
        for _ in range(50):
            system.canonical(symmetry.relabel_ranks(s, (1, 2, 0)))
        assert gc.collect() == 0
    finally:
        gc.enable()
