"""kv-cache-manager's block pool and full-attention manager, call by call: the null block, the hash chain, the
free queue's eviction order, prefix-cache hits (never the whole prompt), eviction of a reused cached block,
`reset_prefix_cache`, the KV events, and the value form (freeze/thaw)."""

import pytest

from kvsim.models.kv_cache_manager.block_pool import BlockPool
from kvsim.models.kv_cache_manager.checks import announce
from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager, Request
from kvsim.models.kv_cache_manager.kv_cache_utils import (MAX_CHAIN_BLOCKS, ROOT, chain_order, hash_block_tokens,
                                                         request_block_hashes)
from kvsim.models.kv_cache_manager.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


def ids(blocks):
    return [b.block_id for b in blocks]


def free_ids(pool):
    return ids(pool.free_block_queue.get_all_free_blocks())


def admit(m, rid, tokens):
    """What the scheduler does for a new request: its hit, then slots for the rest of its tokens."""
    req = Request(rid, list(tokens), len(tokens), 0, m.block_size)
    hit, num_hit = m.get_computed_blocks(req)  # one group: its blocks are hit[0], the new ones new[0]
    new = m.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return req, ids(hit[0]), num_hit, None if new is None else new[0]


def test_the_hash_is_the_chain_of_token_blocks():
    h1 = hash_block_tokens(ROOT, (1, 2))
    assert request_block_hashes([1, 2, 3, 4, 5], 2) == (h1, hash_block_tokens(h1, (3, 4)))
    # equal blocks after different prefixes hash apart; a partial block has no hash
    assert request_block_hashes([9, 9, 3, 4], 2)[1] != request_block_hashes([1, 2, 3, 4], 2)[1]
    assert request_block_hashes([1], 2) == ()


def test_the_null_block_is_taken_at_start_and_never_freed():
    pool = BlockPool(4)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null and free_ids(pool) == [1, 2, 3]
    pool.free_blocks([pool.null_block])
    pool.touch([pool.null_block])
    assert free_ids(pool) == [1, 2, 3] and pool.null_block.ref_cnt == 0


def test_the_probe_run_blocks_1_2_3_then_an_8_token_hit():
    """The research note's probe of the real 0.33.0 manager (block_size 4, 10 blocks): a 10-token request gets
    blocks [1, 2, 3]; after `free`, a request sharing its first 10 tokens hits 8 tokens; every ref_cnt is 0."""
    m = KVCacheManager(10, 4, 2)
    tokens = list(range(10))
    req, hit, num_hit, new = admit(m, 0, tokens)
    assert (hit, num_hit, ids(new)) == ([], 0, [1, 2, 3])
    m.free(req)
    _, hit, num_hit, new = admit(m, 1, tokens + [99])
    assert (hit, num_hit) == ([1, 2], 8)
    assert [b.ref_cnt for b in m.block_pool.blocks[1:4]] == [1, 1, 1]  # 3 was free, uncached: reused first
    m.free(Request(1, [], 0))
    assert all(b.ref_cnt == 0 for b in m.block_pool.blocks)


def test_a_wholly_cached_prompt_still_computes_its_last_block():
    """The hit is capped at num_tokens - 1 tokens, so a 4-token prompt whose two blocks are cached hits one."""
    m = KVCacheManager(6, 2, 2)
    first, *_ = admit(m, 0, [1, 2, 3, 4])
    m.free(first)
    _, hit, num_hit, new = admit(m, 1, [1, 2, 3, 4])
    assert (hit, num_hit) == ([1], 2) and len(new) == 1


def test_free_returns_the_tail_first_uncached_to_the_front_cached_to_the_back():
    m = KVCacheManager(6, 2, 2)
    req, *_ = admit(m, 0, [1, 2, 3, 4, 5])  # blocks 1, 2 full and cached, 3 holds one token
    assert free_ids(m.block_pool) == [4, 5]
    m.free(req)
    # reversed [1, 2, 3]: 3 (uncached) to the front; 2 then 1 (cached) to the back: the tail is evicted first
    assert free_ids(m.block_pool) == [3, 4, 5, 2, 1]


def test_a_hit_on_a_free_block_takes_it_out_of_the_queue_and_counts_it_in_the_budget():
    m = KVCacheManager(4, 2, 2)  # three usable blocks
    first, *_ = admit(m, 0, [1, 2, 3])
    m.free(first)
    assert free_ids(m.block_pool) == [2, 3, 1]
    assert m.coordinator.get_num_blocks_to_allocate(1, 3, ([m.block_pool.blocks[1]],), 2, 3) == 2  # one new, one free hit
    _, hit, num_hit, new = admit(m, 1, [1, 2, 7])
    assert (hit, num_hit, ids(new)) == ([1], 2, [2]) and free_ids(m.block_pool) == [3]


def test_allocate_slots_refuses_with_nothing_changed():
    m = KVCacheManager(3, 2, 2)  # two usable blocks
    admit(m, 0, [1, 2, 3])
    before = m.freeze()
    _, _, _, new = admit(m, 1, [5, 6, 7])
    assert new is None and m.freeze() == before and m.take_events() == (BlockStored(
        (hash_block_tokens(ROOT, (1, 2)),), None, (1, 2), 2),)


def test_reusing_a_cached_free_block_evicts_its_hash():
    m = KVCacheManager(3, 2, 2)
    first, *_ = admit(m, 0, [1, 2, 3])
    m.free(first)
    m.take_events()
    h = hash_block_tokens(ROOT, (1, 2))
    assert m.block_pool.get_cached_block(h).block_id == 1
    _, hit, _, new = admit(m, 1, [5, 6, 7])  # needs both blocks: block 1 is reused
    assert hit == [] and sorted(ids(new)) == [1, 2]
    assert m.block_pool.get_cached_block(h) is None
    assert m.take_events() == (BlockRemoved((h,)), BlockStored((hash_block_tokens(ROOT, (5, 6)),), None, (5, 6), 2))


def test_cache_blocks_caches_a_decode_block_once_it_is_full_with_its_parent():
    m = KVCacheManager(5, 2, 1)
    req, *_ = admit(m, 0, [1, 2, 3])
    m.take_events()
    req.all_token_ids.append(8)  # the sampled token; the next step computes it
    assert m.allocate_slots(req, 1) == ([],)
    h1 = hash_block_tokens(ROOT, (1, 2))
    assert m.take_events() == (BlockStored((hash_block_tokens(h1, (3, 8)),), h1, (3, 8), 2),)
    assert m.coordinator.single_type_managers[0].num_cached_block[0] == 2


def test_two_requests_filling_the_same_block_cache_it_twice():
    """Upstream does not de-duplicate: a hit returns the block cached first."""
    m = KVCacheManager(6, 2, 2)
    a, *_ = admit(m, 0, [1, 2, 3])
    b, *_ = admit(m, 1, [1, 2, 3])
    for req in (a, b):
        req.all_token_ids.append(8)
        m.allocate_slots(req, 1)
    h2 = request_block_hashes([1, 2, 3, 8], 2)[1]
    assert dict(m.block_pool.freeze().cached)[h2] == (2, 3)
    assert m.block_pool.get_cached_block(h2).block_id == 2


def test_reset_prefix_cache_only_when_no_block_is_held():
    m = KVCacheManager(4, 2, 1)
    req, *_ = admit(m, 0, [1, 2, 3])
    m.take_events()
    assert m.reset_prefix_cache() is False and m.take_events() == ()
    m.free(req)
    assert m.reset_prefix_cache() is True and m.take_events() == (AllBlocksCleared(),)
    assert all(b.block_hash is None for b in m.block_pool.blocks) and m.block_pool.freeze().cached == ()


def test_freeze_thaw_round_trip():
    m = KVCacheManager(6, 2, 3)
    a, *_ = admit(m, 0, [1, 2, 3, 4, 5])
    admit(m, 1, [1, 2, 3, 4, 6])
    m.free(a)
    state = m.freeze()
    again = KVCacheManager.thaw(state, 2)
    assert again.freeze() == state and hash(again.freeze()) == hash(state)
    assert free_ids(again.block_pool) == free_ids(m.block_pool)


def test_get_new_blocks_refuses_more_than_the_free_queue_holds():
    pool = BlockPool(4)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="Cannot get 2 free blocks"):
        pool.get_new_blocks(2)
    assert free_ids(pool) == [3]


def test_lookahead_slots_are_allocated_and_counted_never_cached():
    """`num_lookahead_tokens`: blocks for the step's tokens and the lookahead ones, counted before any is taken
    (a pool one block short refuses the call), and caching stops at the request's own full blocks."""
    m = KVCacheManager(4, 2, 1)  # 3 usable blocks
    req = Request(0, [1, 2, 3], 3, 0, 2)
    assert m.allocate_slots(req, 3, num_lookahead_tokens=4) is None  # cdiv(3 + 4, 2) = 4 blocks: one short
    assert free_ids(m.block_pool) == [1, 2, 3]
    new = m.allocate_slots(req, 3, num_lookahead_tokens=3)  # cdiv(6, 2) = 3 blocks
    assert ids(new[0]) == [1, 2, 3]
    assert m.coordinator.single_type_managers[0].num_cached_block[0] == 1  # (1, 2) only: 3 is a partial block
    assert [b.block_hash is not None for b in m.block_pool.blocks[1:]] == [True, False, False]
    req.num_computed_tokens = 3
    req.all_token_ids.append(8)
    assert m.allocate_slots(req, 1, num_lookahead_tokens=3) is None  # 4 + 3 tokens: a fourth block, none free
    assert m.allocate_slots(req, 1, num_lookahead_tokens=2) == ([],)  # 4 + 2: the three it holds
    # the decoded token fills block 2, cached now; block 3 holds lookahead slots only
    assert m.coordinator.single_type_managers[0].num_cached_block[0] == 2
    assert [b.block_hash is not None for b in m.block_pool.blocks[1:]] == [True, True, False]


def test_get_num_common_prefix_blocks_is_zero_on_0_33_and_counted_before():
    """0.33.0 answers 0 per group (cascade attention removed); 0.26.0-0.31.0 count the leading blocks every
    request holding blocks holds."""
    m = KVCacheManager(8, 2, 3)
    a, *_ = admit(m, 0, [1, 2, 3, 4, 5])
    m.free(a)
    b, *_ = admit(m, 1, [1, 2, 3, 4, 6])  # hits (1, 2), (3, 4)
    c, *_ = admit(m, 2, [1, 2, 9])  # hits (1, 2)
    assert m.get_num_common_prefix_blocks(1) == [0]
    assert m.get_num_common_prefix_blocks(1, counted=True) == [1]
    m.free(c)
    assert m.get_num_common_prefix_blocks(1, counted=True) == [3]  # alone: every block of its table


def test_chain_order_sorts_hashes_as_they_sort_themselves():
    # chains of several lengths that share a root part, part at some block, or are equal and made apart; and a
    # hybrid pool's (group id, hash) keys
    tokens = [(t, t + 1) for t in range(6)]
    hashes = [request_block_hashes([x for block in tokens[:n] for x in block], 2)[-1] for n in range(1, 7)]
    hashes += [request_block_hashes([x for block in tokens[:n - 1] + [(9, 9)] for x in block], 2)[-1]
               for n in range(1, 7)]
    hashes += [hash_block_tokens(ROOT, (0, 0)), hash_block_tokens(hash_block_tokens(ROOT, (0, 0)), (0, 1))]
    for keys in (hashes, [(g, h) for g in (1, 0) for h in hashes]):
        for shuffled in (keys, keys[::-1], keys[1::2] + keys[::2]):
            assert sorted(shuffled, key=chain_order) == sorted(shuffled)


def test_by_chain_makes_a_key_order_once_while_it_is_met_and_sorts_as_chain_order(monkeypatch):
    """`by_chain` keeps each key's `chain_order` by identity: sorting the same keys again (a map that changed by a
    block) makes no order again; an equal key that is another object, and any key once the memo was emptied at its
    bound, gets its own; the order is `chain_order`'s every time."""
    import random

    from kvsim.models.kv_cache_manager import kv_cache_utils as utils

    made = []
    monkeypatch.setattr(utils, "chain_order", lambda key: made.append(key) or chain_order(key))
    monkeypatch.setattr(utils, "_ORDERS", {})
    monkeypatch.setattr(utils, "ORDERS_KEPT", 40)
    rng = random.Random(2)
    keys = [request_block_hashes([rng.randrange(3) for _ in range(rng.randrange(2, 12))], 2)[-1] for _ in range(30)]
    pairs = [(k, n) for n, k in enumerate(keys)]
    want = tuple(sorted(pairs, key=lambda pair: chain_order(pair[0])))
    assert utils.by_chain(pairs) == want and len(made) == len(keys)
    assert utils.by_chain(pairs[::-1]) == tuple(sorted(pairs[::-1], key=lambda pair: chain_order(pair[0])))
    assert len(made) == len(keys)  # the same keys: no order made again
    copy = ((keys[4][0], tuple(keys[4][1])), 99)  # equal, another object
    assert utils.by_chain(pairs + [copy]) == tuple(sorted(pairs + [copy], key=lambda pair: chain_order(pair[0])))
    assert len(made) == len(keys) + 1
    more = [(request_block_hashes([7, rng.randrange(3)] * 3, 2)[-1], 0) for _ in range(12)]
    assert utils.by_chain(more + pairs) == tuple(sorted(more + pairs, key=lambda pair: chain_order(pair[0])))
    assert len(utils._ORDERS) <= 40  # emptied at its bound, and every order still chain_order's
    hybrid = [((g, k), n) for n, (g, k) in enumerate(zip((1, 0, 1, 0), keys))]  # a hybrid pool's (group, hash) keys
    assert utils.by_chain(hybrid) == tuple(sorted(hybrid, key=lambda pair: chain_order(pair[0])))


def test_a_frozen_pool_and_the_announced_view_sort_long_chains_without_descending_them():
    # chains of twice MAX_CHAIN_BLOCKS one-token blocks that part at their first block: compared as they are, each
    # comparison of two of one length descends both a call a block to the root, and again from every level on the
    # way back (quadratic in the length), here past the interpreter's recursion limit
    def chain(first):
        return request_block_hashes([first] + list(range(1, 2 * MAX_CHAIN_BLOCKS)), 1)

    chains = chain(2)[-3:] + chain(0)[-3:] + chain(1)[-3:]
    pool = BlockPool(len(chains) + 1)
    for k, block_hash in enumerate(chains):
        pool.cached_block_hash_to_block.insert(block_hash, pool.blocks[k + 1])
    want = sorted(chains, key=chain_order)
    assert [key for key, _ in pool.freeze().cached] == want
    view, problem = announce((), [BlockStored(tuple(chains), None, (), 1)])
    assert [key for key, _ in view] == want and problem is None
    # the shorter first, then by the first block's token
    longest = 2 * MAX_CHAIN_BLOCKS
    assert [key[:2] for key in map(chain_order, want)] == \
        [(blocks, (t,)) for blocks in (longest - 2, longest - 1, longest) for t in (0, 1, 2)]
