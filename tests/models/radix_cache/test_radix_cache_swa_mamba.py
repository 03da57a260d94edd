"""radix-cache-swa with the unified cache's Mamba component (`num_mamba_slots`): pinned explorations, #28161's
second layer (the early release drops the node's Mamba lock with SWA's, keeping full >= swa >= mamba), the double
Mamba release of 0.5.14 to 0.5.19 that 0.5.20's TreeCore removed, and every Mamba invariant able to fail."""

from __future__ import annotations

import pytest

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.models.radix_cache import SWA_DESCRIPTOR
from kvsim.models.radix_cache.mamba import MambaComponent, MambaSlotAllocator
from kvsim.models.radix_cache.swa_system import UnifiedSwaConfig
from kvsim.models.radix_cache.unified_swa import UnifiedRadixCache

from toys import fails_alone

# the model tests' default with a Mamba pool of 4 (two requests of one family); of 3 (Mamba states evicted for a
# request's slots); two families in a window of 1 under pressure (SWA tombstones cascading into Mamba states,
# retraction, a retracted request's prefix hit on its own state)
MAMBA = {"num_mamba_slots": 4}
MAMBA_EVICTION = {"num_mamba_slots": 3}
MAMBA_PRESSURE = {"prompts": "0,1", "sliding_window_size": 1, "num_slots": 6, "num_swa_slots": 5, "max_tokens": 3,
                  "num_mamba_slots": 4}


def system(variant="fixed", values=()):
    return SWA_DESCRIPTOR.build_system(variant, dict(values))


@pytest.mark.parametrize("variant, values, states", [
    ("tree_core", MAMBA, 134), ("tree_core", MAMBA_EVICTION, 48),
    ("tree_core", MAMBA_PRESSURE, 75), ("fixed", MAMBA_PRESSURE, 75)])
def test_the_mamba_configurations_hold_every_invariant_and_liveness(variant, values, states):
    result = explore(system(variant, values))
    assert result.bound_hit is None and result.violations == [] and result.hang_states == 0
    assert result.states == states


@pytest.mark.parametrize("variant", ["fixed", "pre_locked_full_recovery"])
def test_before_0_5_20_the_final_release_takes_another_requests_mamba_lock(variant):
    """Request 0's early release drops its Mamba lock on [1, 1, 2]; request 1 locks the node; request 0's end,
    `dec_lock_ref(skip_swa=True)`, releases the node's Mamba lock again: request 1's."""
    result = explore(system(variant, MAMBA))
    assert [v.property for v in result.violations] == ["mamba_lock_refs"]
    (v,) = result.violations
    assert [tuple(a) for a in v.trace] == [("admit", 0), ("decode", 0), ("decode", 0), ("admit", 1), ("decode", 0)]
    assert v.message == "node [1, 1, 2]: expected mamba lock_ref 1 (running requests locking it that have not " \
                        "released their window), got 0"


def test_pre_28161_with_mamba_fails_on_the_window_lock_only():
    """0.5.13 has no early release, so the second layer has nothing to act on: the Mamba lock is kept with SWA's
    until the request ends, and the one violation is the SWA lock kept past the window."""
    result = explore(system("pre_28161", MAMBA))
    assert [v.property for v in result.violations] == ["swa_lock_within_window"]
    assert [tuple(a) for a in result.violations[0].trace] == [("admit", 0), ("decode", 0), ("decode", 0)]


def test_the_early_release_drops_the_mamba_lock_with_the_swa_lock():
    s = system("tree_core", MAMBA)
    state = s.initial_states()[0]
    for a in (("admit", 0), ("decode", 0)):
        state = s.step(state, a)
    locks = [(n.path, n.full_lock_ref, n.swa_lock_ref, n.mamba_lock_ref, n.mamba_value) for n in state.tree.nodes]
    assert locks == [((1,), 1, 0, 0, None), ((1, 1, 2), 1, 1, 1, (2,))]  # the donated state on the prompt's leaf
    assert state.requests[0].mamba_pool_idx == 1 and state.mamba_free == (3, 4)
    after = s.step(state, ("decode", 0))
    locks = [(n.path, n.full_lock_ref, n.swa_lock_ref, n.mamba_lock_ref) for n in after.tree.nodes]
    assert locks == [((1,), 1, 0, 0), ((1, 1, 2), 1, 0, 0)] and after.requests[0].swa_prefix_lock_released
    assert (after.tree.mamba_protected_size, after.tree.mamba_evictable_size) == (0, 1)


def test_the_small_configurations_reach_cascades_mamba_eviction_and_a_hit_after_retraction(monkeypatch):
    seen = {"cascade": 0, "mamba_drive": 0}
    cascade, evict = UnifiedRadixCache._cascade_evict, MambaComponent.evict_component

    def counting_cascade(self, node, tracker):
        seen["cascade"] += node.mamba.value is not None
        return cascade(self, node, tracker)

    def counting_evict(self, node):
        seen["mamba_drive"] += bool(node.children or node.full.lock_ref)  # a state evicted from an internal node
        return evict(self, node)

    monkeypatch.setattr(UnifiedRadixCache, "_cascade_evict", counting_cascade)
    monkeypatch.setattr(MambaComponent, "evict_component", counting_evict)
    result = explore(system("tree_core", MAMBA_PRESSURE), ExploreOptions(check_liveness=False))
    assert seen["cascade"] > 0 and result.coverage.actions["retract"] > 0
    seen.update(cascade=0, mamba_drive=0)
    explore(system("tree_core", MAMBA_EVICTION), ExploreOptions(check_liveness=False))
    assert seen["mamba_drive"] > 0
    # a retracted request comes back to a hit on the state its first caching donated
    s = system("tree_core", MAMBA_PRESSURE)
    state = s.initial_states()[0]
    for a in (("admit", 0), ("admit", 1), ("decode", 0), ("decode", 1)):
        state = s.step(state, a)
    assert ("retract", 1) in [tuple(a) for a in s.enabled(state)]
    state = s.step(s.step(state, ("retract", 1)), ("decode", 0))
    hit = state.tree.nodes[[n.path for n in state.tree.nodes].index((1, 1, 3))]
    assert hit.mamba_value is not None and state.requests[1].status == "waiting"
    after, effects = s.transition(state, ("admit", 1))
    assert [tuple(e) for e in effects][0] == ("admitted", 1, 3)


def test_the_config_refuses_a_mamba_pool_of_one():
    with pytest.raises(ConfigError, match="num_mamba_slots"):
        UnifiedSwaConfig(num_mamba_slots=1)


# -- each Mamba invariant fails when its thing breaks ------------------------------------------------------------
ORIGINAL_ACQUIRE, ORIGINAL_MAMBA_FREE = MambaComponent.acquire, MambaSlotAllocator.free
ORIGINAL_EARLY = UnifiedRadixCache.dec_swa_lock_only


def _early_release_keeps_mamba(self, node, swa_uuid_for_lock):
    """#28161's first layer alone: the SWA window released, the node's Mamba lock kept."""
    ref, protected, evictable = node.mamba.lock_ref, self.mamba.protected_size_, self.mamba.evictable_size_
    ORIGINAL_EARLY(self, node, swa_uuid_for_lock)
    node.mamba.lock_ref, self.mamba.protected_size_, self.mamba.evictable_size_ = ref, protected, evictable


def _mamba_locked_twice(self, node):
    ORIGINAL_ACQUIRE(self, node)
    if node.mamba.value is not None:
        node.mamba.lock_ref += 1


def _evict_keeps_slot(self, node):
    cd = node.mamba
    if cd.value is None:
        return 0
    self.evictable_size_ -= 1
    cd.value, node.mamba_lru_time = None, None
    return 1


def _mamba_freed_twice(self, indices):
    ORIGINAL_MAMBA_FREE(self, indices)
    ORIGINAL_MAMBA_FREE(self, indices)


@pytest.mark.parametrize("name, values, plant", [
    ("lock_order", MAMBA, (UnifiedRadixCache, "dec_swa_lock_only", _early_release_keeps_mamba)),
    ("mamba_lock_refs", MAMBA, (MambaComponent, "acquire", _mamba_locked_twice)),
    ("pool_accounting", MAMBA_EVICTION, (MambaComponent, "evict_component", _evict_keeps_slot)),
    # the first layer alone lets an SWA tombstone cascade into the locked Mamba state (`_cascade_evict`'s assert)
    ("evict_unlocked", MAMBA_PRESSURE, (UnifiedRadixCache, "dec_swa_lock_only", _early_release_keeps_mamba)),
    ("no_double_free", MAMBA, (MambaSlotAllocator, "free", _mamba_freed_twice)),
    # and with 0.5.20's final release skipping SWA and below, strands the Mamba lock once every request has ended
    ("all_free_when_done", MAMBA, (UnifiedRadixCache, "dec_swa_lock_only", _early_release_keeps_mamba)),
])
def test_a_mamba_invariant_fails_on_a_planted_bug(name, values, plant, monkeypatch):
    fails_alone(lambda: system("tree_core", values), name, plant, monkeypatch)


def test_the_double_release_bug_report_holds():
    result = reproduce(catalog.load().bug("sglang-unified-mamba-lock-released-twice"))
    assert result.ok and result.reproduced and result.fixed_passes
    assert [tuple(a) for a in result.counterexample["trace"]] == \
        [("admit", 0), ("decode", 0), ("decode", 0), ("admit", 1), ("decode", 0)]
