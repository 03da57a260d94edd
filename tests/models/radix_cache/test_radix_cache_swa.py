"""radix-cache-swa (the unified radix cache's SWA component, #28161): pinned explorations, the #28161 violation on
pre_28161 only, every invariant able to fail, the stateful property and the bug report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.runner import run_property
from kvsim.models.radix_cache import SWA_DESCRIPTOR
from kvsim.models.radix_cache.swa_system import RULES, UnifiedSwaConfig, UnifiedSwaSystem
from kvsim.models.radix_cache.unified_swa import SWATokenToKVPoolAllocator, UnifiedRadixCache

from toys import fails_alone

# the default (one family, two requests); window 1, three requests over two families and a small SWA pool:
# tombstones and their recovery on insert; the same with a smaller full pool: tombstones and retraction
TOMBSTONES = {"prompts": "0,1,0", "sliding_window_size": 1, "num_swa_slots": 4, "num_slots": 5, "max_tokens": 2}
PRESSURE = {**TOMBSTONES, "num_slots": 4}
CONFIGS = [({}, 75), (TOMBSTONES, 91), (PRESSURE, 255)]


def system(variant="fixed", values=()):
    return SWA_DESCRIPTOR.build_system(variant, dict(values))


@pytest.mark.parametrize("values, states", CONFIGS)
def test_fixed_holds_every_invariant_and_liveness(values, states):
    result = explore(system("fixed", values))
    assert result.bound_hit is None and result.violations == [] and result.hang_states == 0
    assert result.states == states


def test_pre_28161_keeps_the_window_lock_past_the_window():
    result = explore(system("pre_28161"))
    assert [v.property for v in result.violations] == ["swa_lock_within_window"]
    (v,) = result.violations
    assert [tuple(a) for a in v.trace] == [("admit", 0), ("decode", 0), ("decode", 0)]
    assert "node [1, 1, 2]: swa lock_ref 1, but only 0 running requests" in v.message


def test_the_early_release_runs_on_fixed_and_frees_only_the_swa_lock():
    s = system("fixed")
    state = s.initial_states()[0]
    for a in (("admit", 0), ("decode", 0)):
        state = s.step(state, a)
    # the prompt's leaf is split so its last window is a node: [1] (outside the window), [1, 2] (the window)
    locks = [(n.path, n.full_lock_ref, n.swa_lock_ref) for n in state.tree.nodes]
    assert locks == [((1,), 1, 0), ((1, 1, 2), 1, 1)] and not state.requests[0].swa_prefix_lock_released
    after, effects = s.transition(state, ("decode", 0))
    locks = [(n.path, n.full_lock_ref, n.swa_lock_ref) for n in after.tree.nodes]
    assert locks == [((1,), 1, 0), ((1, 1, 2), 1, 0)] and after.requests[0].swa_prefix_lock_released
    assert [e.tag for e in effects] == ["swa_lock_released"]
    assert (after.tree.swa_protected_size, after.tree.full_protected_size) == (0, 3)


def test_the_small_configurations_reach_tombstones_recovery_and_retraction(monkeypatch):
    seen = {"tombstoned": 0, "recovered": 0}
    tombstone, insert = UnifiedRadixCache._evict_swa_component, UnifiedRadixCache.insert

    def counting_tombstone(self, node):
        seen["tombstoned"] += bool(node.children) or node.full.lock_ref > 0
        return tombstone(self, node)

    def counting_insert(self, tokens, value, prev_prefix_len):
        before = sum(n.swa.value is None for n in self.all_nodes())
        out = insert(self, tokens, value, prev_prefix_len)
        seen["recovered"] += sum(n.swa.value is None for n in self.all_nodes()) < before
        return out

    monkeypatch.setattr(UnifiedRadixCache, "_evict_swa_component", counting_tombstone)
    monkeypatch.setattr(UnifiedRadixCache, "insert", counting_insert)
    explore(system("fixed", TOMBSTONES), ExploreOptions(check_liveness=False))
    assert seen["tombstoned"] > 0 and seen["recovered"] > 0
    result = explore(system("fixed", PRESSURE), ExploreOptions(check_liveness=False))
    assert result.coverage.actions["retract"] > 0


@pytest.mark.parametrize("values", [{}, PRESSURE])
def test_allows_is_membership_in_enabled(values):
    actions, wrong = RULES.disagreements(system("fixed", values))
    assert {a.tag for a in actions} >= {"admit", "decode"} and not wrong


def test_the_config_refuses_what_the_model_cannot_run():
    with pytest.raises(Exception, match="prompts"):
        UnifiedSwaConfig(prompts=(0, 1, 2, 3))
    with pytest.raises(Exception, match="num_swa_slots"):
        UnifiedSwaConfig(num_swa_slots=5)  # a 3-token prompt and 3 more decodes need 6


# -- each invariant fails when its thing breaks ------------------------------------------------------------------
def _swa_locked_twice(self, node):
    uuid = ORIGINAL_INC(self, node)
    if node.swa.value is not None:
        node.swa.lock_ref += 1
    return uuid


def _full_release_skipped(self, node, swa_uuid_for_lock, skip_swa=False):
    """dec_lock_ref at a finish that releases SWA only (a retraction still releases both: bounded)."""
    if skip_swa:
        return ORIGINAL_DEC(self, node, swa_uuid_for_lock, skip_swa)
    full = [(n, n.full.lock_ref) for n in _path(self, node)]
    ORIGINAL_DEC(self, node, swa_uuid_for_lock, skip_swa)
    for n, ref in full:
        n.full.lock_ref = ref


def _path(tree, node):
    out = []
    while node is not tree.root_node:
        out.append(node)
        node = node.parent
    return out


def _tombstone_keeps_swa_slots(self, indices):
    return None


def _lru_ignores_locks(self):
    listed = [n for n in self.all_nodes() if n.swa_lru_time is not None]
    return min(listed, key=lambda n: n.swa_lru_time, default=None)


def _free_twice(self, indices):
    ORIGINAL_FREE(self, indices)
    ORIGINAL_FREE_FULL(self, indices[:1])


def _finish_keeps_lock(self, tree, alloc, req, is_insert):
    if is_insert:
        tree.insert(req.fill_ids[:len(req.row)], req.row, req.cache_protected_len)
        return
    ORIGINAL_FINISHED(self, tree, alloc, req, is_insert)


ORIGINAL_INC, ORIGINAL_DEC = UnifiedRadixCache.inc_lock_ref, UnifiedRadixCache.dec_lock_ref
ORIGINAL_FREE, ORIGINAL_FREE_FULL = SWATokenToKVPoolAllocator.free, SWATokenToKVPoolAllocator.free_full
ORIGINAL_FINISHED = UnifiedSwaSystem.cache_finished_req


@pytest.mark.parametrize("name, plant", [
    ("lock_order", (UnifiedRadixCache, "inc_lock_ref", _swa_locked_twice)),
    ("full_lock_refs", (UnifiedRadixCache, "dec_lock_ref", _full_release_skipped)),
    ("pool_accounting", (SWATokenToKVPoolAllocator, "free_swa", _tombstone_keeps_swa_slots)),
    ("evict_unlocked", (UnifiedRadixCache, "_swa_lru_no_lock", _lru_ignores_locks)),
    ("no_double_free", (SWATokenToKVPoolAllocator, "free", _free_twice)),
    ("all_free_when_done", (UnifiedSwaSystem, "cache_finished_req", _finish_keeps_lock)),
])
def test_an_invariant_fails_on_a_planted_bug(name, plant, monkeypatch):
    fails_alone(lambda: system("fixed", TOMBSTONES), name, plant, monkeypatch)


DIGEST = """
import hashlib, sys
sys.path.insert(0, "tests")
from toys import reachable
from kvsim.models.radix_cache import SWA_DESCRIPTOR
states = reachable(SWA_DESCRIPTOR.build_system("fixed", {}))
print(len(states), hashlib.sha256(repr(states).encode()).hexdigest())
"""


def test_explore_is_deterministic_under_any_hash_seed():
    root = Path(__file__).resolve().parents[3]
    out = {subprocess.run([sys.executable, "-c", DIGEST], cwd=root, env={**os.environ, "PYTHONHASHSEED": seed},
                          capture_output=True, text=True, check=True).stdout for seed in ("0", "1")}
    assert len(out) == 1 and out.pop().startswith("75 ")


PROP = {p.name: p for p in catalog.load().properties_of("radix-cache-swa")}["unified_swa_invariants"]


def test_the_stateful_property_holds_on_fixed_and_fails_on_pre_28161():
    assert run_property(PROP, "fixed", max_examples=30, derandomize=True).status == "passed"
    result = run_property(PROP, "pre_28161", max_examples=30, derandomize=True)
    assert result.status == "failed" and result.message.startswith("swa_lock_within_window")


def test_the_bug_report_holds():
    result = reproduce(catalog.load().bug("sglang-28161-unified-swa-window-lock-kept"))
    assert result.ok and result.reproduced and result.fixed_passes
    assert [tuple(a) for a in result.counterexample["trace"]] == [("admit", 0), ("decode", 0), ("decode", 0)]


# -- the flags of the later releases (0.5.15's locked-Full recovery, 0.5.20's TreeCore), on the tree directly -------
def _tree(variant):  # type: ignore[no-untyped-def]
    """A window of 1 over [1, 2, 3] (slots 1-3), then [1, 2, 4] (slot 4): the split leaves [1, 2] above both."""
    tree = UnifiedRadixCache(SWATokenToKVPoolAllocator(8, 8), 1, SWA_DESCRIPTOR.variants[variant])
    tree.insert((1, 2, 3), tree.allocator.alloc(3), 0)
    tree.insert((1, 2, 4), (1, 2) + tree.allocator.alloc(1), 2)
    return tree


@pytest.mark.parametrize("variant, child_first", [("fixed", False), ("tree_core", True)])
def test_a_split_keeps_the_suffix_recency_from_0_5_20(variant, child_first):
    tree = _tree(variant)
    tree.match_prefix((1, 2, 4))  # [1, 2, 4] most recent, [1, 2, 3] least
    tree.match_prefix((1,))  # splits [1, 2] into [1] and [2]: the suffix [2] keeps its place (#38482) or not
    order = [n.path() for n in sorted(tree.all_nodes(), key=lambda n: n.swa_lru_time)]
    assert (order.index((1, 2)) < order.index((1, 2, 4))) == child_first
    assert order[-1] == (1,)  # the matched prefix: most recent either way (the match's window refresh)


@pytest.mark.parametrize("variant, locks", [("fixed", (1, 0)), ("tree_core", (0, 1))])
def test_the_swa_segment_lock_counts_tombstones_from_0_5_20(variant, locks):
    tree = UnifiedRadixCache(SWATokenToKVPoolAllocator(8, 8), 2, SWA_DESCRIPTOR.variants[variant])
    tree.insert((1, 2, 3), tree.allocator.alloc(3), 0)  # [1] and the window leaf [2, 3]
    tree._evict_swa_component(tree.node_at((1, 2, 3)))  # [2, 3] tombstoned
    tree.insert((1, 2, 3, 4), tree.path_device_indices(tree.node_at((1, 2, 3))) + tree.allocator.alloc(1), 3)
    uuid = tree.inc_lock_ref(tree.node_at((1, 2, 3, 4)))  # [4], then [2, 3] counted (0.5.20) or skipped for [1]
    assert (tree.node_at((1,)).swa.lock_ref, tree.node_at((1, 2, 3)).swa.lock_ref) == locks
    tree.dec_lock_ref(tree.node_at((1, 2, 3, 4)), uuid)
    assert [n.swa.lock_ref for n in tree.all_nodes()] == [0, 0, 0] and tree.problems == []
    assert tree.swa_protected_size_ == 0 and tree.swa_evictable_size_ == 2


@pytest.mark.parametrize("variant", ["fixed", "pre_locked_full_recovery"])
def test_a_tombstone_under_a_full_lock_is_recovered_without_freeing_the_locked_slots(variant):
    tree = _tree(variant)
    held = tree.node_at((1, 2)).full.value
    tree.inc_lock_ref(tree.node_at((1, 2, 3)))  # another request's Full lock on [1, 2]
    tree.node_at((1, 2)).swa.lock_ref = 0
    tree._evict_swa_component(tree.node_at((1, 2)))
    fresh = tree.allocator.alloc(3)
    tree.insert((1, 2, 5), fresh, 0)  # a request that matched nothing recovers the tombstone [1, 2]
    node = tree.node_at((1, 2))
    if variant == "fixed":  # the locked slots stay and take the fresh SWA slots; the fresh Full slots go back
        assert node.full.value == held and set(fresh[:2]) <= tree.allocator.full_free
        assert not set(held) & tree.allocator.full_free and node.swa.value is not None
    else:  # 0.5.14: the locked Full slots are freed while the other request's row holds them
        assert node.full.value == fresh[:2] and set(held) <= tree.allocator.full_free
    assert tree.allocator.problems == []
