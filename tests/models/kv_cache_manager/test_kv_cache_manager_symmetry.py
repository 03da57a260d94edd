"""kv-cache-manager: block ids are names, so renaming the blocks (`symmetry`) is a symmetry.

Checked on every reachable state of small configurations (no reduction) against a renaming that moves every
non-null block: the renamed state has the same enabled actions (they name requests only), each step commutes
with the renaming, `done` and every invariant's verdict agree, and both get one representative. Then the
explorer with and without the reduction gives the same violations, trace lengths and liveness verdict, and its
reported paths are real paths of the unreduced system.
"""

import pytest

from kvsim.engine.actions import decode
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.system import run_actions
from kvsim.models.kv_cache_manager import DESCRIPTOR, kv_cache_manager, kv_cache_utils, symmetry
from kvsim.models.kv_cache_manager import single_type_kv_cache_manager as single_type
from kvsim.models.kv_cache_manager.actions import ACTIONS

from toys import reachable, rotation, symmetry_breaks

CONFIGS = [{}, {"prompts": (0, 0), "prompt_len": 4, "resets": 0}, {"num_blocks": 5, "max_tokens": 3, "resets": 0}]


def rotation_breaks(system, states, relabel=symmetry.relabel):
    """How renaming every non-null block b to b + 1 (the last to 1) fails to be a symmetry, or None."""
    perm = rotation(system.cfg.num_blocks)
    return symmetry_breaks(system, states, lambda s: relabel(s, perm))


@pytest.mark.parametrize("values", CONFIGS)
def test_renaming_the_blocks_is_a_symmetry_on_every_reachable_state(values):
    system = DESCRIPTOR.build_system("fixed", values)
    states = reachable(system)
    assert len(states) > 30
    assert rotation_breaks(system, states) is None


def test_a_renaming_that_forgets_the_free_queue_is_no_symmetry():
    """The check above can fail."""
    system = DESCRIPTOR.build_system("fixed", {})

    def forgetful(s, perm):
        renamed = symmetry.relabel(s, perm)
        return renamed._replace(manager=renamed.manager._replace(
            pool=renamed.manager.pool._replace(free=s.manager.pool.free)))

    assert rotation_breaks(system, reachable(system), forgetful) is not None


def test_a_canonical_form_that_is_no_symmetry_is_caught_by_the_explorer(monkeypatch):
    """The explorer's own check: mapping a reported path back through a bad representative fails."""
    system = DESCRIPTOR.build_system("fixed", {})

    def forgetful(s):  # renames the tables and the pool but leaves the free queue as it was
        c = symmetry.canonical(s)
        return c._replace(manager=c.manager._replace(pool=c.manager.pool._replace(free=s.manager.pool.free)))

    monkeypatch.setattr(system, "canonical", forgetful)
    monkeypatch.setattr(kv_cache_manager.KVCacheManager, "max_cache_hit_length",  # so a 5-step path is reported
                        lambda self, request: request.num_tokens)
    with pytest.raises(AssertionError, match="not a symmetry"):
        explore(system)


PLANTED = {
    "decr_ref": (kv_cache_utils.KVCacheBlock, "decr_ref", lambda self: None),
    "max_cache_hit_length": (kv_cache_manager.KVCacheManager, "max_cache_hit_length", lambda self, r: r.num_tokens),
    "popleft_n": (kv_cache_utils.FreeKVCacheBlockQueue, "popleft_n", lambda self, n: self._blocks[:n]),
    # a step check whose flag's message names blocks (the representative keeps the flag's name only)
    "free": (single_type.SingleTypeKVCacheManager, "free",
             lambda self, request_id: self.block_pool.free_blocks(self.pop_blocks_for_free(request_id))),
}


@pytest.mark.parametrize("plant", [None, *PLANTED])
@pytest.mark.parametrize("values", [{}, {"prompts": (0, 0), "prompt_len": 4}, {"num_blocks": 2, "resets": 0}])
def test_reduction_keeps_violations_and_liveness(plant, values, monkeypatch):
    if plant is not None:
        monkeypatch.setattr(*PLANTED[plant])
    system = DESCRIPTOR.build_system("fixed", values)
    every, reduced = explore(system, ExploreOptions(symmetry=False)), explore(system)
    assert reduced.symmetry and not every.symmetry and reduced.states <= every.states
    assert [(v.property, len(v.trace)) for v in reduced.violations] == [
        (v.property, len(v.trace)) for v in every.violations]
    assert (reduced.hang_states > 0) == (every.hang_states > 0)
    for v in reduced.violations:  # a real path of the unreduced system, ending where the report says
        end = run_actions(system, [decode(a, ACTIONS) for a in v.trace])[-1]
        if v.kind == "invariant":
            inv = next(i for i in system.invariants if i.name == v.property)
            assert inv.check(end) == v.message != symmetry.FLAG_MESSAGE  # the real state's message
        else:
            assert not system.done(end)
