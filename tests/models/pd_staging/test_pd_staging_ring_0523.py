"""pd-staging on SGLang 0.5.23: the empty-ring fresh round of #37166 (`fresh_round_when_empty`).

At 05c7ebf (`fixed`) a free that empties the ring keeps the stale head; from 0.5.19 (#37166) it starts a fresh
round: round + 1, head 0, watermark (round + 1, 0). `sglang_0_5_23` is `fixed` plus that flag.
"""

from itertools import product

import pytest

from kvsim.engine.explore import explore
from kvsim.models.pd_staging import DESCRIPTOR
from kvsim.models.pd_staging.data import StagingSystemConfig
from kvsim.models.pd_staging.ring import (Allocation, StagingAllocator, apply_ring_ops, same_round_overlaps,
                                          unsafe_ready_pairs)
from kvsim.models.pd_staging.system import PdStaging
from kvsim.models.pd_staging.variants import AFTER_05C7EBF, FIXED, VARIANTS

NEW = VARIANTS["sglang_0_5_23"]
PRE = VARIANTS["pre_05c7ebf"]


# -- the variant table ---------------------------------------------------------------------------------------------

def test_variant_table_has_the_release_after_fixed_and_pre():
    assert VARIANTS.names == ("fixed", "pre_05c7ebf", "sglang_0_5_23", "proposed_per_dst_retry")
    assert DESCRIPTOR.variants is VARIANTS
    assert DESCRIPTOR.variant("sglang_0_5_23") is NEW


def test_sglang_0_5_23_is_fixed_plus_37166_and_fixed_stays_05c7ebf():
    after = {"fresh_round_when_empty": True, "deferred_decode_kv_release": True, "pp_prefill_writers": True}
    assert NEW.flags() == {**FIXED.flags(), **after}
    assert AFTER_05C7EBF == tuple(after)
    assert not any(getattr(v, f) for v in (FIXED, PRE) for f in AFTER_05C7EBF)
    # the whole-chunk re-enqueue is in every release; only the proposed fix lacks it
    assert FIXED.whole_chunk_reenqueue and PRE.whole_chunk_reenqueue and NEW.whole_chunk_reenqueue
    assert VARIANTS["proposed_per_dst_retry"].flags() == {**NEW.flags(), "whole_chunk_reenqueue": False}


# -- the ring: the one line #37166 changed --------------------------------------------------------------------------

def test_a_free_that_empties_the_ring_starts_a_fresh_round_only_on_the_new_variant():
    _, ring = StagingAllocator(100).assign(60)
    old, new = ring.free(0, FIXED), ring.free(0, NEW)
    assert (old.round, old.head, old.watermark) == (0, 60, (0, 60))  # 05c7ebf: the stale head
    assert (new.round, new.head, new.watermark) == (1, 0, (1, 0))    # #37166: round + 1, head 0, (round + 1, 0)
    assert ring.free(0) == old  # the default is `fixed`
    assert old.allocations == new.allocations == () and old.next_id == new.next_id == 1


def test_the_fresh_round_removes_the_stale_head_hazard():
    """#37166's example: free [0, 60), then 70 bytes. 05c7ebf wraps to round 1 and waits on 70 <= 60 forever;
    0.5.23 places it at [0, 70) of the fresh round, writable at once."""
    _, ring = StagingAllocator(100).assign(60)
    stuck, ring_old = ring.free(0, FIXED).assign(70)
    fresh, ring_new = ring.free(0, NEW).assign(70)
    assert stuck == Allocation(1, 0, 70, 1) and not ring_old.ready(stuck)
    assert fresh == Allocation(1, 0, 70, 1) and ring_new.ready(fresh) and ring_new.watermark == (1, 0)
    _, ring_small = ring.free(0, NEW).assign(30)  # a fitting one starts at 0 too (05c7ebf: at the stale head 60)
    assert ring_small.allocations[0].offset == 0 and ring.free(0, FIXED).assign(30)[0].offset == 60


def test_a_free_that_leaves_a_live_allocation_is_the_same_on_both():
    ring = StagingAllocator(100)
    for size in (60, 30, 50):
        _, ring = ring.assign(size)
    for aid in (1, 2):
        assert ring.free(aid, FIXED) == ring.free(aid, NEW)
    emptied = ring.free(1, NEW).free(0, NEW).free(2, NEW)
    assert (emptied.round, emptied.head, emptied.watermark) == (2, 0, (2, 0))


def test_apply_ring_ops_frees_as_the_variant_frees():
    ops = (("assign", 60), ("free", 0), ("assign", 70))
    assert [s.ring.round for s in apply_ring_ops(StagingAllocator(100), ops, NEW)] == [0, 1, 1]
    assert [s.ring.round for s in apply_ring_ops(StagingAllocator(100), ops)] == [0, 0, 1]


def test_the_ring_safety_rules_hold_with_the_fresh_round_over_every_short_program():
    """S6 (no writable allocation over older live data), disjoint live allocations of one round, a watermark that
    never decreases, and the oldest live allocation writable once a free followed it: every program of 5 ops."""
    ops = [("assign", n) for n in (1, 2, 3, 4, 5)] + [("free", p) for p in (0, 1)]
    checked = 0
    for total, program in product((3, 4, 5), product(ops, repeat=5)):
        steps = apply_ring_ops(StagingAllocator(total), program, NEW)
        prev, assigned_at, last_free = (0, 0), {}, -1
        for n, step in enumerate(steps):
            ring = step.ring
            assert not unsafe_ready_pairs(ring) and not same_round_overlaps(ring.allocations), (total, program)
            assert ring.watermark >= prev, (total, program)
            prev = ring.watermark
            if step.op == "assign" and step.alloc is not None:
                assigned_at[step.alloc.alloc_id] = n
            elif step.op == "free":
                last_free = n
                want = (ring.allocations[0].round, ring.allocations[0].offset) if ring.allocations else (ring.round, 0)
                assert ring.watermark == want, (total, program)
        if steps and steps[-1].ring.allocations:
            oldest = steps[-1].ring.allocations[0]
            assert last_free < assigned_at[oldest.alloc_id] or steps[-1].ring.ready(oldest), (total, program)
        checked += 1
    assert checked == 3 * 7 ** 5


def test_the_stale_head_rule_fails_that_last_check_so_it_can_fail():
    steps = apply_ring_ops(StagingAllocator(100), (("assign", 60), ("free", 0), ("assign", 70)), FIXED)
    assert not steps[-1].ring.ready(steps[-1].ring.allocations[0])


# -- the transition system: the flag reaches the decode rank's ring -------------------------------------------------

LOST_WM = dict(rooms=2, prompt_len=1, faults="drop_wm", timeouts=0)  # sglang-05c7ebf-staging-lost-watermark's params


def test_the_system_frees_through_the_variant_and_broadcasts_the_fresh_watermark():
    path = [("batch", 0), ("deliver", 0, 0, ("REQ", 0, 0, 1, 0)), ("deliver", 1, 0, ("RSP", 0, 0, 0, 0, 0, 0, 1)),
            ("work", 0), ("deliver", 0, 0, ("READY", 0, 0, 0, 1, 0)), ("scatter_done", 0, 0)]
    got = {}
    for variant in (FIXED, NEW):
        system = PdStaging(variant, StagingSystemConfig(**LOST_WM))
        s = system.initial_states()[0]
        for a in path:
            assert any(tuple(e) == a for e in system.enabled(s)), (variant.name, a)
            s = system.step(s, next(e for e in system.enabled(s) if tuple(e) == a))
        got[variant.name] = (s.ring.round, s.ring.head, [tuple(m) for m in s.chans[1][0] if m[0] == "WM"])
    assert got == {"fixed": (0, 1, [("WM", 0, 0, 1)]), "sglang_0_5_23": (1, 0, [("WM", 0, 1, 0)])}


@pytest.mark.parametrize("ring_units", [0, 4])
def test_a_lost_watermark_hangs_the_next_room_without_ring_pressure_only_on_0_5_23(ring_units):
    """The lost-watermark finding is wider on 0.5.23: with every slot fitting (no wrap) the fresh round's
    WATERMARK is what lets the next room's round-1 slot be written; 05c7ebf needs a wrap (ring_units=1)."""
    cfg = StagingSystemConfig(ring_units=ring_units, **LOST_WM)
    new, old = explore(PdStaging(NEW, cfg)), explore(PdStaging(FIXED, cfg))
    assert not old.violations and old.bound_hit is None
    assert [(v.property, v.kind) for v in new.violations] == [("every_room_concludes", "hang")]
    trace = new.violations[0].trace  # JSON form
    assert len(trace) == 7 and trace[-2:] == [["scatter_done", 0, 0], ["drop", 1, 0, ["WM", 0, 1, 0]]]


def test_the_waiting_timeout_fails_that_room_instead_of_hanging():
    result = explore(PdStaging(NEW, StagingSystemConfig(**{**LOST_WM, "timeouts": 1})))
    assert not result.violations and result.bound_hit is None


def test_the_rings_assign_and_free_make_are_the_constructors_rings():
    """`assign` and `free` build their ring without `__init__` (`ring._ring`): each is the ring the constructor
    makes of the same fields (equal, the same hash, repr, pickle and attribute order, and its attributes held as
    the constructor's are: no `__dict__` of its own made, which would double a stored state's ring) on both
    variants."""
    import gc
    import pickle

    for variant in (FIXED, NEW):
        ring, rings = StagingAllocator(16), []
        for op in (5, 7, 5, "free", 6, "free", "free", "free"):
            if op == "free":
                ring = ring.free(ring.allocations[0].alloc_id, variant)
            else:
                ring = ring.assign(op)[1]
            rings.append(ring)
        for ring in rings:
            built = StagingAllocator(ring.total, ring.head, ring.round, ring.allocations, ring.next_id, ring.watermark)
            assert [type(x) for x in gc.get_referents(ring)] == [type(x) for x in gc.get_referents(built)]
            assert ring == built and hash(ring) == hash(built) and repr(ring) == repr(built)
            assert pickle.dumps(ring) == pickle.dumps(built) and list(vars(ring)) == list(vars(built))
        assert rings[-1].allocations == () and rings[2].round == 1  # the third assign wrapped; the last free emptied
