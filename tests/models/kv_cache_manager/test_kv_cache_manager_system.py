"""kv-cache-manager's transition system: exhaustive exploration of small configurations (pinned state counts),
every invariant failing alone on a planted wrong line (a monkeypatched method, never a copied module), liveness
failing on a pool too small for one request, the rules agreeing with `enabled`, and the stateful property."""

from dataclasses import replace

import pytest

from kvsim.app import catalog
from kvsim.engine.explore import explore
from kvsim.engine.runner import run_property
from kvsim.models.kv_cache_manager import DESCRIPTOR
from kvsim.models.kv_cache_manager import block_pool, kv_cache_coordinator, kv_cache_manager, kv_cache_utils
from kvsim.models.kv_cache_manager import single_type_kv_cache_manager as single_type
from kvsim.models.kv_cache_manager.kv_events import BlockStored
from kvsim.models.kv_cache_manager.system import RULES, CacheManagerConfig, CacheManagerSystem

from toys import explores_clean, fails_alone

# (parameters, states, states with the block renaming reduced): block_size 2, prompts of 3 tokens sharing 2,
# two outputs each, unless set
CONFIGS = [
    ({}, 803, 260),  # A -> B -> A on 3 usable blocks, one reset_prefix_cache
    ({"resets": 0}, 221, 117),
    ({"prompts": (0, 1), "num_blocks": 5, "resets": 0}, 43, 26),
    ({"prompts": (0, 0), "prompt_len": 4, "resets": 0}, 33, 30),  # equal prompts: a wholly cached prompt
    ({"num_blocks": 5, "resets": 1}, 1729, 284),
    ({"num_blocks": 5, "max_tokens": 3, "resets": 0}, 2421, 502),
    ({"num_blocks": 6, "max_tokens": 3, "prompt_len": 4, "resets": 0}, 11247, 1247),
    ({"lookahead": 2, "num_blocks": 5, "resets": 0}, 282, 108),  # two lookahead slots every step
]


# the smallest hybrid where per-group hits part: full attention + Mamba, a prompt that fills two blocks
HYBRID = {"groups": "full,mamba", "prompt_len": 5, "shared": 2, "num_blocks": 8, "resets": 0}


def system(values=()):
    return DESCRIPTOR.build_system("fixed", dict(values))


@pytest.mark.parametrize("values, states, reduced", CONFIGS)
def test_explore_holds_every_invariant_and_liveness(values, states, reduced):
    explores_clean(system(values), states, reduced)


def test_the_default_configuration_reaches_every_kind_of_step():
    """Hits, refusals, evictions of cached blocks, resets that clear and resets refused: the search sees each."""
    s = system()
    seen, frontier, kinds = set(), list(s.initial_states()), set()
    while frontier:
        state = frontier.pop()
        for action in s.enabled(state):
            after, effects = s.transition(state, action)
            for e in effects:
                kinds.add(e.tag)
                if e.tag == "events":
                    kinds.update(ev.tag for ev in e.events)
                if e.tag == "allocated" and e.num_hit_tokens:
                    kinds.add("hit")
                if e.tag == "reset_done":
                    kinds.add(f"reset {e.ok}")
            if after not in seen:
                seen.add(after)
                frontier.append(after)
    assert kinds == {"allocated", "hit", "deferred", "freed", "events", "block_stored", "block_removed",
                     "all_blocks_cleared", "reset_done", "reset True", "reset False"}


# -- each invariant alone catches its planted wrong line ----------------------------------------------------
_emit, _pop_for_free = block_pool.BlockPool._emit, single_type.SingleTypeKVCacheManager.pop_blocks_for_free
_Coordinator = kv_cache_coordinator.KVCacheCoordinator


def _max_over_groups(self, block_hashes, max_length):  # 0.26.0's scheduler line as the reconciled hit
    blocks, hits = _Coordinator.find_longest_cache_hit_per_group(self, block_hashes, max_length)
    return blocks, max(hits)


_allocate_slots = kv_cache_manager.KVCacheManager.allocate_slots
LOOKAHEAD = {"lookahead": 2, "num_blocks": 5, "resets": 0}


def _drafts_as_tokens(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                      num_lookahead_tokens=0):
    drafted = replace(request, all_token_ids=request.all_token_ids + [7] * num_lookahead_tokens)
    return _allocate_slots(self, drafted, num_new_tokens + num_lookahead_tokens, num_new_computed_tokens,
                           new_computed_blocks)


def _lookahead_left_out(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                        num_lookahead_tokens=0):
    return _allocate_slots(self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks)


PLANTS = {
    # invariant: (class or module, attribute, the wrong line, parameters)
    "ref_count_is_holders": (kv_cache_utils.KVCacheBlock, "decr_ref", lambda self: None, {}),  # never decremented
    "free_queue_iff_unreferenced":  # a hit takes the wrong block out of the queue (the counts stay right)
        (kv_cache_utils.FreeKVCacheBlockQueue, "remove", lambda self, block: self._blocks.pop(0), {}),
    "pool_accounting":  # blocks handed out stay in the free queue
        (kv_cache_utils.FreeKVCacheBlockQueue, "popleft_n", lambda self, n: self._blocks[:n], {}),
    "cached_map_hashes":  # an evicted block's entry stays in the map
        (block_pool.BlockHashToBlockMap, "pop", lambda self, key, block_id: self.get_one_block(key), {}),
    "free_queue_order":  # the free queue appended at the wrong end
        (kv_cache_utils.FreeKVCacheBlockQueue, "prepend_n", kv_cache_utils.FreeKVCacheBlockQueue.append_n, {}),
    "tables_match_requests":  # slots rounded down: a partial block gets no block
        (single_type, "cdiv", lambda a, b: a // b, {}),
    "lookahead_never_cached":  # a drafter's lookahead tokens taken as the request's own: their blocks cached
        (kv_cache_manager.KVCacheManager, "allocate_slots", _drafts_as_tokens, LOOKAHEAD),
    "freed_in_eviction_order":  # free without reversing: the head of a request is evicted before its tail
        (single_type.SingleTypeKVCacheManager, "free",
         lambda self, request_id: self.block_pool.free_blocks(self.pop_blocks_for_free(request_id)), {}),
    "events_mirror_cache":  # a BlockStored lost
        (block_pool.BlockPool, "_emit", lambda self, e: None if type(e) is BlockStored else _emit(self, e), {}),
    "removed_was_stored":
        (block_pool.BlockPool, "_emit", lambda self, e: None if type(e) is BlockStored else _emit(self, e), {}),
    "all_free_when_done":  # free forgets the request's last block
        (single_type.SingleTypeKVCacheManager, "pop_blocks_for_free", lambda self, r: _pop_for_free(self, r)[:-1],
         {"num_blocks": 8, "resets": 0}),  # room enough that the leak is not first a hang
    "hit_is_proper_prefix":  # a hit one block too long: the whole prompt
        (kv_cache_manager.KVCacheManager, "max_cache_hit_length", lambda self, request: request.num_tokens,
         {"prompts": (0, 0), "prompt_len": 4}),
    "hybrid_hit_backed":  # the reconciled hit taken as the deepest group's
        (_Coordinator, "find_longest_cache_hit", _max_over_groups, HYBRID),
    "no_block_outside_window":  # the blocks before the window never freed
        (single_type.SingleTypeKVCacheManager, "remove_skipped_blocks", lambda self, r, n: None,
         {"groups": "full,swa", "prompt_len": 4, "max_tokens": 3, "num_blocks": 8, "resets": 0}),
}


def test_every_invariant_has_its_planted_line():
    assert set(PLANTS) == {i.name for i in CacheManagerSystem().invariants}


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_each_invariant_fails_alone_on_its_planted_line(name, monkeypatch):
    where, attribute, wrong, values = PLANTS[name]
    fails_alone(lambda: system(values), name, (where, attribute, wrong), monkeypatch)


def test_free_queue_order_is_every_uncached_block_before_every_cached_one():
    # every free queue of up to 8 blocks, cached or not: the verdict is the definition's, pair by pair
    from itertools import product

    from kvsim.models.kv_cache_manager.block_pool import PoolState
    from kvsim.models.kv_cache_manager.checks import free_queue_order

    for n in range(9):
        for cached in product((False, True), repeat=n):
            pool = PoolState((0,) * n, tuple((("t", b),) if c else None for b, c in enumerate(cached)),
                             tuple(range(n)), ())
            wrong = any(a and not b for i, a in enumerate(cached) for b in cached[i + 1:])
            assert (free_queue_order(pool) is not None) == wrong, cached


def test_lookahead_slots_left_out_fail_the_tables(monkeypatch):
    """`allocate_slots` that drops `num_lookahead_tokens`: a running request holds fewer blocks than its computed
    tokens and lookahead slots need."""
    fails_alone(lambda: system(LOOKAHEAD), "tables_match_requests",
                (kv_cache_manager.KVCacheManager, "allocate_slots", _lookahead_left_out), monkeypatch)


def test_the_whole_prompt_hit_is_found_in_two_steps(monkeypatch):
    monkeypatch.setattr(kv_cache_manager.KVCacheManager, "max_cache_hit_length", lambda self, request: request.num_tokens)
    (violation,) = explore(system({"prompts": (0, 0), "prompt_len": 4, "max_tokens": 1})).violations
    assert violation.property == "hit_is_proper_prefix"
    assert violation.trace == [["schedule", 0], ["schedule", 1]]
    assert "hit of 4 tokens" in violation.message


def test_a_pool_too_small_for_one_request_is_a_hang():
    """Liveness: with one usable block a 3-token prompt can never be scheduled."""
    result = explore(system({"num_blocks": 2, "resets": 0}))
    assert [v.property for v in result.violations] == ["every_request_finishes"] and result.hang_states == 1


@pytest.mark.parametrize("values", [{}, {"prompts": (0, 0), "prompt_len": 4}])
def test_allows_is_membership_in_enabled(values):
    actions, wrong = RULES.disagreements(system(values))
    assert {a.tag for a in actions} == {"schedule", "decode", "finish", "preempt", "reset"}
    assert not wrong


# -- chunked local attention (`ChunkedLocalAttentionManager`) ------------------------------------------------------
# two requests of one prompt, chunks of one block (2 tokens): the blocks of every earlier chunk freed as they pass;
# a prompt whose hit ends inside its second chunk of 4 (the chunk's first block backs it)
LOCAL_CHUNKS = {"groups": "full,local", "prompts": (0, 0), "prompt_len": 5, "shared": 2, "max_tokens": 3,
                "num_blocks": 8, "resets": 0, "attention_chunk_size": 2}
LOCAL_HIT = {"groups": "full,local", "prompt_len": 5, "shared": 2, "num_blocks": 8, "resets": 0,
             "attention_chunk_size": 4}
_local_hit = single_type.ChunkedLocalAttentionManager.find_longest_cache_hit


def _local_hit_from_the_next_block(self, block_hashes, max_length):  # the chunk's first block taken as before it
    blocks, hit = _local_hit(self, block_hashes, max_length)
    first = max_length // self.attention_chunk_size * self.attention_chunk_size // self.block_size
    return [self._null_block] * min(first + 1, len(blocks)) + blocks[first + 1:], hit


@pytest.mark.parametrize("values, states, reduced", [(LOCAL_CHUNKS, 471, 116), (LOCAL_HIT, 677, 231)])
def test_explore_chunked_local_attention_holds_every_invariant(values, states, reduced):
    explores_clean(system(values), states, reduced)


def test_a_chunk_boundary_one_token_late_keeps_a_block_before_the_chunk(monkeypatch):
    """`get_num_skipped_tokens` rounding `n - 1` down to the chunk: at a chunk boundary the last chunk's blocks
    are kept (`no_block_outside_window`)."""
    fails_alone(lambda: system(LOCAL_CHUNKS), "no_block_outside_window",
                (single_type.ChunkedLocalAttentionManager, "get_num_skipped_tokens",
                 lambda self, n: max(0, n - 1) // self.attention_chunk_size * self.attention_chunk_size), monkeypatch)


def test_a_local_hit_that_nulls_its_chunks_first_block(monkeypatch):
    """The hit's null blocks reach into the chunk the next token reads: the hit is not backed
    (`hybrid_hit_backed`)."""
    fails_alone(lambda: system(LOCAL_HIT), "hybrid_hit_backed",
                (single_type.ChunkedLocalAttentionManager, "find_longest_cache_hit", _local_hit_from_the_next_block),
                monkeypatch)


def test_the_config_refuses_what_the_model_cannot_run():
    with pytest.raises(Exception, match="prompts"):
        CacheManagerConfig(prompts=(0, 1, 2, 3))
    with pytest.raises(Exception, match="shared"):
        CacheManagerConfig(prompt_len=2, shared=3)
    with pytest.raises(Exception, match="attention_chunk_size"):
        CacheManagerConfig(groups="full,local", block_size=2, attention_chunk_size=3)
    assert CacheManagerConfig(block_size=2, attention_chunk_size=3).kinds == ("full",)  # read with local only


# -- the stateful property ------------------------------------------------------------------------------------
PROP = {p.name: p for p in catalog.load().properties_of("kv-cache-manager")}["cache_manager_invariants"]


def test_the_stateful_property_holds_on_fixed():
    result = run_property(PROP, "fixed", max_examples=60, derandomize=True)
    assert result.status == "passed", result.message


def test_the_stateful_property_fails_on_a_reference_count_not_decremented(monkeypatch):
    monkeypatch.setattr(kv_cache_utils.KVCacheBlock, "decr_ref", lambda self: None)
    result = run_property(PROP, "fixed", max_examples=60, derandomize=True)
    assert result.status == "failed" and result.message.startswith("ref_count_is_holders")
