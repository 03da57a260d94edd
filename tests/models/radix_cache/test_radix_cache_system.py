"""radix-cache as a transition system: pinned state counts, every invariant able to fail, determinism."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.app import catalog
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.runner import run_property
from kvsim.models.radix_cache import DESCRIPTOR, checks, common
from kvsim.models.radix_cache.allocator import AllocatorState, PagedTokenToKVPoolAllocator
from kvsim.models.radix_cache.memory_pool import ReqToTokenPool
from kvsim.models.radix_cache.radix_cache import NodeState, RadixCache, TreeState
from kvsim.models.radix_cache.system import RULES, RadixCacheConfig

from toys import fails_alone, kept_walk, reachable

# page size 1 and 2, shared prefixes, retraction under pressure, need_sort
CONFIGS = [
    ({}, 84),
    ({"max_tokens": 3, "num_pages": 6}, 1468),
    ({"page_size": 2, "num_pages": 4, "prompt_len": 4}, 70),
    ({"page_size": 2, "num_pages": 4, "prompt_len": 4, "max_tokens": 3}, 377),
    ({"page_size": 2, "num_pages": 4, "need_sort": 1}, 73),
]
TIGHT = {"page_size": 2, "num_pages": 4, "prompt_len": 4, "max_tokens": 3}


def system(values=()):
    return DESCRIPTOR.build_system("fixed", dict(values))


@pytest.mark.parametrize("values, states", CONFIGS)
def test_explore_holds_every_invariant_and_liveness(values, states):
    result = explore(system(values))
    assert result.bound_hit is None and result.violations == [] and result.hang_states == 0
    assert result.states == states


def test_the_tight_configuration_reaches_hits_evictions_retractions_and_duplicates(monkeypatch):
    seen = {"evicted": 0, "duplicate": 0}
    evict, checkpoint = RadixCache.evict, common.checkpoint

    def counting_evict(self, n):
        got = evict(self, n)
        seen["evicted"] += got
        return got

    def counting_checkpoint(tree, alloc, req, up_to):
        prefix_len = checkpoint(tree, alloc, req, up_to)
        seen["duplicate"] += prefix_len > req.prefix_len
        return prefix_len

    monkeypatch.setattr(RadixCache, "evict", counting_evict)
    monkeypatch.setattr(common, "checkpoint", counting_checkpoint)
    result = explore(system(TIGHT), ExploreOptions(check_liveness=False))
    assert result.coverage.actions["retract"] > 0
    assert seen["evicted"] > 0 and seen["duplicate"] > 0


DIGEST = """
import hashlib, sys
sys.path.insert(0, "tests")
from toys import reachable
from kvsim.models.radix_cache import DESCRIPTOR
states = reachable(DESCRIPTOR.build_system("fixed", {"page_size": 2, "num_pages": 4, "prompt_len": 4, "max_tokens": 3}))
print(len(states), hashlib.sha256(repr(states).encode()).hexdigest())
"""


def test_explore_is_deterministic_under_any_hash_seed():
    root = Path(__file__).resolve().parents[3]
    out = {subprocess.run([sys.executable, "-c", DIGEST], cwd=root, env={**os.environ, "PYTHONHASHSEED": seed},
                          capture_output=True, text=True, check=True).stdout for seed in ("0", "1", "12345")}
    assert len(out) == 1 and out.pop().startswith("377 ")


@pytest.mark.parametrize("values", [{}, TIGHT])
def test_allows_is_membership_in_enabled(values):
    actions, wrong = RULES.disagreements(system(values))
    assert {a.tag for a in actions} >= {"admit", "decode"} and not wrong


def test_the_config_refuses_what_the_model_cannot_run():
    with pytest.raises(Exception, match="prompts"):
        RadixCacheConfig(prompts=(0, 1, 2, 3))
    with pytest.raises(Exception, match="num_pages"):
        RadixCacheConfig(num_pages=4)  # a retracted 4-token input plus a page needs 5
    with pytest.raises(Exception, match="prompt_lens"):
        RadixCacheConfig(prompt_lens=(3, 2))  # a length per request
    with pytest.raises(Exception, match="prompt_lens"):
        RadixCacheConfig(prompt_lens=(3, 2, 4))  # none past prompt_len


def test_prompt_lens_cut_the_family_prompts():
    config = RadixCacheConfig(prompts=(0, 0, 1), prompt_len=4, shared=1, prompt_lens=(4, 2, 3), num_pages=6)
    assert [config.prompt(r) for r in range(3)] == [(1, 2, 2, 2), (1, 2), (1, 3, 3)]
    assert RadixCacheConfig(prompts=(0, 1), prompt_len=4, shared=1, num_pages=6).prompt(1) == (1, 3, 3, 3)


# -- each invariant fails when its thing breaks ------------------------------------------------------------------
def _no_free(self, free_index, start_pos):
    return None


def _finish_keeps_lock(tree, alloc, req, checkpointed):
    """release_kv_cache at a finish that leaves the lock taken (a retraction still unlocks: bounded)."""
    if checkpointed:
        common.checkpoint(tree, alloc, req, len(req.row))
        alloc.free_segment(req.row[req.cache_protected_len:], req.cache_protected_len)
        req.lock, req.row, req.cache_protected_len = None, [], 0
        return
    ORIGINAL_RELEASE(tree, alloc, req, checkpointed)


def _everything_evictable(self, node):
    self.evictable_leaves.setdefault(node, None)


def _extend_keeps_pages_free(self, prefix_len, seq_len, last_loc):
    free = list(self.free_pages)
    out = ORIGINAL_EXTEND(self, prefix_len, seq_len, last_loc)
    self.free_pages = free
    return out


def _match_nothing(self, tokens):
    return 0, (), self.root_node


def _row_kept(self):
    """`req_to_token_pool.free(req)` left out: a finished or retracted request's row is never given back."""


ORIGINAL_EXTEND = PagedTokenToKVPoolAllocator.alloc_extend
ORIGINAL_RELEASE = common.release_kv_cache


@pytest.mark.parametrize("name, plant", [
    ("pool_accounting", (PagedTokenToKVPoolAllocator, "free_segment", _no_free)),
    ("lock_refs", (common, "release_kv_cache", _finish_keeps_lock)),
    ("evict_unlocked_leaves", (RadixCache, "_update_leaf_status", _everything_evictable)),
    ("no_double_free", (PagedTokenToKVPoolAllocator, "alloc_extend", _extend_keeps_pages_free)),
    ("free_list", (PagedTokenToKVPoolAllocator, "alloc_extend", _extend_keeps_pages_free)),
    ("match_is_longest", (RadixCache, "match_prefix", _match_nothing)),
    ("req_slots", (ReqToTokenPool, "free", _row_kept)),
])
def test_an_invariant_fails_on_a_planted_bug(name, plant, monkeypatch):
    fails_alone(lambda: system(TIGHT), name, plant, monkeypatch)


@pytest.mark.parametrize("page_size", [1, 2])
def test_pool_accounting_names_each_page_owned_twice_out_of_range_or_by_none(page_size):
    # pages 1..4: page 1 free, page 2 in the tree (a node of one page), pages 3 and 4 held by a running request
    node = NodeState((7,) * page_size, page_size, tuple(range(2 * page_size, 3 * page_size)), 0, 0)
    tree, pages = TreeState((node,), page_size, 0), lambda *p: tuple(p)

    def accounting(free, held, staged=()):
        return checks.pool_accounting(tree, AllocatorState(free, staged), held, 4, page_size)

    assert accounting(pages(1), [pages(3, 4)]) is None
    assert accounting(pages(), [pages(1, 3, 4)]) is None and accounting(pages(), [pages(3, 4)], pages(1)) is None
    sizes = lambda held: f"free + evictable + protected + held = {held * page_size} tokens, expected the pool's " \
                         f"{4 * page_size}"  # noqa: E731
    assert accounting(pages(1, 3), [pages(3, 4)]) == "pages owned more than once or out of range {3: 2}, owned by " \
                                                     f"none []; {sizes(5)}"
    assert accounting(pages(0), [pages(3, 4)]) == "pages owned more than once or out of range {0: 1}, owned by " \
                                                  f"none [1]; {sizes(4)}"
    assert accounting(pages(1), [pages(3, 5)]) == "pages owned more than once or out of range {5: 1}, owned by " \
                                                  f"none [4]; {sizes(4)}"
    assert accounting(pages(1, 3), [pages(3)]) == "pages owned more than once or out of range {3: 2}, owned by " \
                                                  f"none [4]; {sizes(4)}"  # as many pages as the pool: not each once
    assert accounting(pages(1), [pages(3)]) == f"pages owned more than once or out of range {{}}, owned by none [4]; " \
                                               f"{sizes(3)}"
    short = checks.pool_accounting(tree._replace(evictable_size=0), AllocatorState(pages(1), ()), [pages(3, 4)], 4,
                                   page_size)
    assert short == f"pages owned more than once or out of range {{}}, owned by none []; {sizes(3)}"
    # every page owned, one twice, and the tree's sizes a page short: the tokens add up, the pages do not
    twice = checks.pool_accounting(tree._replace(evictable_size=0), AllocatorState(pages(1, 3), ()), [pages(3, 4)], 4,
                                   page_size)
    assert twice == f"pages owned more than once or out of range {{3: 2}}, owned by none []; {sizes(4)}"


def _offset_walk(row, start, page_size):
    """page_aligned_slots's definition, a position at a time: the first position off its page's offset or run."""
    for i, slot in enumerate(row):
        offset = (start + i) % page_size
        if slot % page_size != offset or (offset and i and slot != row[i - 1] + 1):
            return start + i
    return None


def test_page_aligned_slots_answers_as_its_walk_a_position_at_a_time():
    import random

    rng = random.Random(7)
    for _ in range(3000):
        page_size, start = rng.choice([1, 2, 3, 4, 16]), rng.randrange(0, 40)
        pages = rng.sample(range(1, 400), 80)  # a page for each page of positions; or pages one after another
        pages = pages if rng.random() < 0.5 else list(range(pages[0], pages[0] + 80))
        row = [pages[(start + i) // page_size] * page_size + (start + i) % page_size for i in range(rng.randrange(30))]
        if row and rng.random() < 0.7:  # one slot moved: off its offset, out of its page's run, or neither
            row[rng.randrange(len(row))] += rng.choice([-page_size, -1, 1, page_size, 2 * page_size + 1])
        problem = checks.page_aligned_slots(tuple(row), start, page_size)
        at = _offset_walk(row, start, page_size)
        assert (problem is None) == (at is None) and (at is None or problem.startswith(f"position {at} at slot ")), \
            (row, start, page_size, problem)


def _states():
    return [s for s in reachable(system(TIGHT)) if any(r.status == "running" for r in s.requests)]


def _check(name, state):
    (inv,) = [i for i in system(TIGHT).invariants if i.name == name]
    return inv.check(state)


def test_hand_built_bad_states_fail_their_invariant():
    s = next(s for s in _states() if s.tree.nodes and s.requests[0].status == "running")
    for name in ("tree_shape", "rows_page_aligned", "lock_refs", "free_list"):
        assert _check(name, s) is None
    node = s.tree.nodes[0]
    odd = s._replace(tree=s.tree._replace(nodes=(NodeState(node.path, 1, node.value[:1], node.lock_ref,
                                                            node.last_access),) + s.tree.nodes[1:]))
    assert "whole pages" in _check("tree_shape", odd)
    r0 = s.requests[0]
    shifted = s._replace(requests=(r0._replace(row=(r0.row[0] + 1,) + r0.row[1:]),) + s.requests[1:])
    assert "expected offset" in _check("rows_page_aligned", shifted)
    unlocked = s._replace(requests=(r0._replace(lock=None),) + s.requests[1:])
    assert _check("rows_page_aligned", unlocked) is not None
    twice = s._replace(allocator=s.allocator._replace(free_pages=s.allocator.free_pages + (0,)))
    assert "never page 0" in _check("free_list", twice)
    more = s._replace(tree=s.tree._replace(nodes=(node._replace(lock_ref=node.lock_ref + 1),) + s.tree.nodes[1:]))
    assert "lock_ref" in _check("lock_refs", more)


def _no_lock(self, node):
    return 0


def test_a_negative_lock_count_is_flagged(monkeypatch):
    fails_alone(lambda: system(TIGHT), "lock_ref_never_negative", (RadixCache, "inc_lock_ref", _no_lock), monkeypatch)


def test_a_page_held_after_every_request_ended_fails_all_free_when_done():
    done = [s for s in reachable(system(TIGHT)) if all(r.status == "finished" for r in s.requests)]
    assert done and all(_check("all_free_when_done", s) is None for s in done)
    s = done[0]
    leaked = s._replace(allocator=s.allocator._replace(free_pages=s.allocator.free_pages[1:]))
    assert "expected the pool" in _check("all_free_when_done", leaked)


def test_the_tree_reports_a_negative_lock_count():
    s = system(TIGHT)
    state = s.initial_states()[0]
    state = s.step(state, ("admit", 0))
    tree = RadixCache.thaw(state.tree, None, 2)
    node = tree.node_at(state.requests[0].lock)
    tree.dec_lock_ref(node)
    tree.dec_lock_ref(node)
    assert tree.problems and "went to -1" in tree.problems[0]


PROP = {p.name: p for p in catalog.load().properties_of("radix-cache")}["radix_cache_invariants"]


def test_the_stateful_property_holds_on_fixed():
    result = run_property(PROP, "fixed", max_examples=40, derandomize=True)
    assert result.status == "passed", result.message


def test_the_stateful_property_fails_on_duplicates_never_freed(monkeypatch):
    monkeypatch.setattr(PagedTokenToKVPoolAllocator, "free_segment", _no_free)
    result = run_property(PROP, "fixed", max_examples=40, derandomize=True)
    assert result.status == "failed" and result.message.startswith("pool_accounting")


def _lock_refs_by_definition(tree, locks):
    """`checks.lock_refs` as its doc states it: every node against every lock, the first node that disagrees."""
    protected = evictable = 0
    for n in tree.nodes:
        want = sum(1 for path in locks if path[:len(n.path)] == n.path)
        if n.lock_ref != want:
            return f"node {list(n.path)}: expected lock_ref {want} (requests locking it or below), got {n.lock_ref}"
        protected, evictable = (protected + n.key_len, evictable) if n.lock_ref else (protected, evictable + n.key_len)
    if (protected, evictable) != (tree.protected_size, tree.evictable_size):
        return f"expected protected_size {protected} and evictable_size {evictable} (the tree's nodes), got " \
               f"{tree.protected_size} and {tree.evictable_size}"
    return None


def test_lock_refs_and_path_slots_answer_as_their_definitions():
    """lock_refs counts equal locks once and looks at a lock's token at a node's last position before its prefix;
    path_slots walks the nodes by path where the live tree walks its children: the same answers, on every state
    with running requests and on its locks dropped, doubled, cut short and run on."""
    import random

    rng, failing = random.Random(3), 0
    for s in _states():
        locks = [r.lock for r in s.requests if r.lock is not None]
        tree = RadixCache.thaw(s.tree, None, 2)
        nodes = {n.path: n for n in s.tree.nodes}
        for lock in locks:
            assert checks.path_slots(nodes, lock) == tree.path_device_indices(tree.node_at(lock))
        variants = [locks, locks[1:], locks + locks[:1], [lock[:rng.randrange(len(lock) + 1)] for lock in locks],
                    [lock + (rng.randrange(4),) for lock in locks]]
        for v in variants:
            got = checks.lock_refs(s.tree, v)
            assert got == _lock_refs_by_definition(s.tree, v), (s, v)
            failing += got is not None
        for lock in locks:  # a path that ends inside a node, or past a leaf: not a node's path
            assert lock == () or checks.path_slots(nodes, lock[:-1]) is None
            assert checks.path_slots(nodes, lock + (9,)) is None
    assert failing > 100  # the variations reach the counts' failures, not only their passes


def test_the_invariants_answer_along_a_walk_as_a_fresh_system():
    """The checks answered again for an equal part of the state (`SameAnswer`), the rows and node slots found
    aligned (`AlignedRows`) and the lock slots kept for an equal tree answer, state after state and with bad
    states between good ones, as a system asked each state afresh."""
    states = _states()
    kept = system(TIGHT)
    walk = []
    for s in states[::3]:
        r0, node = s.requests[0], s.tree.nodes[0] if s.tree.nodes else None
        walk.append(s)
        if r0.status == "running":
            walk.append(s._replace(requests=(r0._replace(row=(r0.row[0] + 1,) + r0.row[1:]),) + s.requests[1:]))
            walk.append(s._replace(requests=(r0._replace(lock=r0.lock + (1, 1)),) + s.requests[1:]))
        if node is not None:
            walk.append(s._replace(tree=s.tree._replace(nodes=(node._replace(lock_ref=node.lock_ref + 1),)
                                                        + s.tree.nodes[1:])))
            walk.append(s._replace(tree=s.tree._replace(nodes=(node._replace(value=node.value[::-1]),)
                                                        + s.tree.nodes[1:])))
        walk.append(s._replace(allocator=s.allocator._replace(free_pages=s.allocator.free_pages + (1,))))
        walk.append(s)
    bad = 0
    for s in walk:
        fresh = system(TIGHT)
        answers = [inv.check(s) for inv in kept.invariants]
        assert answers == [inv.check(s) for inv in fresh.invariants], s
        bad += any(a is not None for a in answers)
    assert bad > len(walk) // 3


def test_aligned_rows_checks_a_tuple_once_and_anything_else_every_time(monkeypatch):
    calls = []
    real = checks.page_aligned_slots
    monkeypatch.setattr(checks, "page_aligned_slots", lambda row, start, ps: calls.append(row) or real(row, start, ps))
    aligned = checks.AlignedRows(2, capacity=2)
    row, odd, rows = (4, 5, 8, 9), (5, 6), [4, 5]
    assert aligned(row) is None and aligned(row) is None and len(calls) == 1
    assert aligned(tuple(list(row))) is None and len(calls) == 2  # an equal tuple, another object: checked
    assert aligned(odd) is not None and aligned(odd) is not None and len(calls) == 4  # a failure is not kept
    assert aligned(rows) is None and aligned(rows) is None and len(calls) == 6
    rows[1] = 7
    assert aligned(rows) is not None
    aligned((2, 3)), aligned((6, 7))  # past its capacity it starts over
    calls.clear()
    assert aligned(row) is None and len(calls) == 1


@pytest.mark.parametrize("variant, values", [
    ("fixed", {}), ("fixed", TIGHT), ("fixed", {"page_size": 2, "num_pages": 4, "need_sort": 1}),
    ("fixed", {"max_tokens": 3, "num_pages": 6}), ("fixed", {"num_draft_tokens": 2, "page_size": 2, "num_pages": 8}),
    ("pre_31616", {"num_draft_tokens": 3, "page_size": 2, "num_pages": 8}),
])
def test_a_transition_from_the_state_the_last_one_froze_to_takes_its_tree_as_a_fresh_thaw(variant, values):
    """The allocator and tree the last transition left (`Thawed`, keyed by the state it froze them to) step as ones
    thawed afresh: the same successors and effects on a random walk (hits, evictions, retractions, a pool's
    staged pages, drafts, the variant's flagged states), and they freeze to the successor with nothing of the step
    left on them."""
    def anew(kept, state):
        alloc, tree = kept
        return (alloc.freeze(), tree.freeze()) == (state.allocator, state.tree) and not tree.problems \
            and "match_prefix" not in vars(tree)  # the step's watch of its matches, taken off

    kept = kept_walk(lambda: DESCRIPTOR.build_system(variant, dict(values)), 400, 11, anew, key=lambda s: s)
    assert kept > 200
