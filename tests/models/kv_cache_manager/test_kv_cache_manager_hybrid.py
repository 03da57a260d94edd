"""kv-cache-manager over several KV cache groups: the single-type managers' hits (full attention, sliding window,
chunked local attention, Mamba), the coordinator's reconciled and per-group hits, the blocks a window leaves behind, and the #48195 variant:
the explorer finds the connector handed more local tokens than full attention backs on `pre_48195`, and `fixed`
holds on the same configuration (pinned state counts, with and without the block renaming). Mamba in both
prefix-caching modes: `align` (`fixed`, 0.33.0: one state block per allocation, null padding before it) and `all`
(`mamba_all`, 0.26.0 and 0.27.0's default, removed in 0.33.0)."""

import pytest

from kvsim.engine.explore import ExploreOptions, explore
from kvsim.models.kv_cache_manager import DESCRIPTOR, symmetry
from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager, Request, connector_local_hit

from toys import explores_clean, reachable, rotation, symmetry_breaks

# two groups over an 8-block pool, 5-token prompts sharing their first block (A -> B -> A)
BASE = {"prompt_len": 5, "shared": 2, "num_blocks": 8, "resets": 0}
SWA = {**BASE, "groups": "full,swa"}
MAMBA = {**BASE, "groups": "full,mamba"}

THREE = {**BASE, "groups": "full,swa,mamba", "num_blocks": 10}  # three kinds: 9 blocks for one prompt (`all`)
# equal 3-token prompts, three outputs: under `align` Mamba caches a state only where an allocation ends on a block
# boundary (a decode), so the hits here are a preempted request's recompute
RECOMPUTE = {"groups": "full,mamba", "prompts": (0, 0), "prompt_len": 3, "max_tokens": 3, "num_blocks": 8,
             "resets": 0}

# (variant, parameters, states, states with the block renaming reduced)
CONFIGS = [
    ("fixed", SWA, 622, 158),
    ("fixed", MAMBA, 514, 244),
    ("mamba_all", MAMBA, 722, 263),
    ("fixed", {"groups": "full,swa", "num_blocks": 7}, 3499, 302),
    ("fixed", THREE, 564, 298),
    ("mamba_all", THREE, 666, 193),
    ("fixed", RECOMPUTE, 1166, 337),
    ("mamba_all", RECOMPUTE, 809, 145),
    # two lookahead slots a step: full attention allocates them, Mamba in mode align does not (a larger pool for
    # `all`, which does)
    ("fixed", {**MAMBA, "lookahead": 2}, 504, 188),
    ("mamba_all", {**MAMBA, "lookahead": 1, "num_blocks": 10}, 1649, 609),
]


def system(variant, values):
    return DESCRIPTOR.build_system(variant, dict(values))


def ids(blocks):
    return [b.block_id for b in blocks]


def admit(m, rid, tokens):
    req = Request(rid, list(tokens), len(tokens), 0, m.block_size)
    hit, num_hit = m.get_computed_blocks(req)
    new = m.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return req


@pytest.mark.parametrize("variant, values, states, reduced", CONFIGS)
def test_every_invariant_holds_on_two_groups_in_both_mamba_modes(variant, values, states, reduced):
    explores_clean(system(variant, values), states, reduced)


@pytest.mark.parametrize("symmetry", [False, True])
def test_pre_48195_hands_the_connector_a_hit_full_attention_cannot_back(symmetry):
    """A fills two blocks per group and finishes at once (its Mamba states still cached); B, sharing A's first
    block, takes new blocks from the free queue's front, evicting A's second full-attention block while its Mamba
    state survives behind it; A's prompt again: full attention hits 2 tokens, Mamba 4, and 0.26.0 hands max = 4."""
    (violation,) = explore(system("pre_48195", MAMBA), ExploreOptions(symmetry=symmetry)).violations
    assert violation.property == "hybrid_hit_backed"
    assert violation.trace == [["schedule", 0], ["finish", 0], ["schedule", 1], ["schedule", 2]]
    assert violation.message.startswith("the local hit handed to the connector of 4 tokens: group 0 (full) needs "
                                        "block 1")


def test_pre_48195_is_the_fix_on_full_attention_and_sliding_window():
    """Upstream's per-group path (both releases) is taken only with Mamba layers: without, the two variants agree."""
    assert explore(system("pre_48195", SWA)).violations == []


def test_the_per_group_hits_part_and_the_connector_hit_per_variant():
    m = KVCacheManager(8, 2, 3, ("full", "mamba"), mamba_cache_mode="all")  # 0.26.0 and 0.27.0's default mode
    a = admit(m, 0, [1, 1, 2, 2, 2])
    m.free(a)
    admit(m, 1, [1, 1, 3, 3, 3])
    c = Request(2, [1, 1, 2, 2, 2], 5, 0, 2)
    blocks, hits = m.coordinator.find_longest_cache_hit_per_group(c.block_hashes, 4)
    assert hits == (2, 4) and len(blocks[0]) == 1 and ids(blocks[1])[0] == 0  # Mamba: a null block, then the state
    hit, num_hit = m.get_computed_blocks(c)
    assert num_hit == 2 and [len(b) for b in hit] == [1, 1]  # reconciled: what both back
    assert connector_local_hit(m, c, True)[1] == 2  # 0.27.0+: a group hit deeper, so the reconciled hit
    assert connector_local_hit(m, c, False)[1] == 4  # 0.26.0: max(per_group_hits)


def test_mamba_align_takes_one_state_block_per_allocation_and_frees_the_hit_past_the_gap():
    """`align` (0.33.0): a prompt's table is null padding and one state block, cached only where the allocation
    ends on a block boundary; a hit's state sits before a padded block and the next step frees it past the gap.
    `all` takes a block per two tokens and its removal stops at the first null block."""
    align, every = KVCacheManager(8, 2, 3, ("full", "mamba")), KVCacheManager(8, 2, 3, ("full", "mamba"), 0, "all")
    a = admit(align, 0, [1, 1, 2, 2])
    admit(every, 0, [1, 1, 2, 2])
    state = align.get_block_ids(0)[1]
    assert state[0] == 0 and state[1] != 0 and 0 not in every.get_block_ids(0)[1]
    align.free(a)
    b = Request(1, [1, 1, 2, 2, 3, 3, 3], 7, 0, 2)
    hit, num_hit = align.get_computed_blocks(b)
    assert num_hit == 4 and ids(hit[1]) == [0, state[1]]  # A's state at 4 tokens
    # full attention: 2 new blocks and its 2 free hit blocks; Mamba: one new block (of 4 - 2 wanted) and its hit's
    assert align.coordinator.get_num_blocks_to_allocate(1, 7, hit, 4, 7) == (2 + 2) + (1 + 1)
    (full, mamba) = align.allocate_slots(b, 3, 4, hit)
    assert len(full) == 2 and ids(mamba)[0] == 0 and len(mamba) == 2  # the padding, then the one new block
    assert align.get_block_ids(1)[1][:3] == [0, state[1], 0]
    b.num_computed_tokens = 7
    b.all_token_ids.append(6)
    before = align.block_pool.get_num_free_blocks()
    assert align.allocate_slots(b, 1) == ([], [])  # in the last block: nothing new; the hit's state is freed
    assert align.get_block_ids(1)[1][:3] == [0, 0, 0] and align.block_pool.get_num_free_blocks() == before + 1


def test_a_sliding_window_hit_is_its_window_with_null_blocks_before_it():
    m = KVCacheManager(12, 2, 2, ("full", "swa"), sliding_window=3)
    a = admit(m, 0, list(range(9)))  # 4 full blocks
    assert 0 not in m.get_block_ids(0)[1]  # prefill: nothing freed yet
    a.all_token_ids.append(9)
    assert m.allocate_slots(a, 1) is not None
    # the next allocation frees what the window of 3 tokens left behind: after 9 computed, tokens 0..6 (3 blocks)
    assert m.get_block_ids(0)[1][:4].count(0) == 3 and 0 not in m.get_block_ids(0)[0]
    m.free(a)
    b = Request(1, list(range(9)) + [50], 10, 0, 2)
    (full, swa), num_hit = m.get_computed_blocks(b)
    # full attention hits 4 blocks, the window needs cdiv(3 - 1, 2) = 1 cached block at the end: block 3
    assert num_hit == 8 and len(full) == 4 and ids(swa)[:3] == [0, 0, 0] and ids(swa)[3] != 0


def test_a_chunked_local_hit_is_its_chunk_with_null_blocks_before_it():
    """Chunks of 8 tokens, blocks of 4 (upstream's own examples): a hit up to 15 tokens reads the chunk of tokens
    8..15, so blocks 0 and 1 are null and block 2 is looked up; a hit up to 16 tokens starts a new chunk (four null
    blocks). Allocation frees the blocks of every earlier chunk: after 13 tokens, 8 are skipped."""
    m = KVCacheManager(20, 4, 2, ("full", "local"), attention_chunk_size=8)
    local = m.coordinator.single_type_managers[1]
    assert [local.get_num_skipped_tokens(n) for n in (7, 8, 13, 16)] == [0, 8, 8, 16]
    a = admit(m, 0, list(range(17)))  # 4 full blocks and one token
    assert 0 not in m.get_block_ids(0)[1]  # prefill: nothing freed yet
    a.all_token_ids.append(17)
    assert m.allocate_slots(a, 1) is not None
    assert m.get_block_ids(0)[1].count(0) == 4  # 17 computed: the chunks of tokens 0..15 freed
    blocks, hit = local.find_longest_cache_hit(a.block_hashes, 15)
    assert hit == 12 and ids(blocks)[:2] == [0, 0] and ids(blocks)[2] != 0  # block 2 was cached before it was freed
    blocks, hit = local.find_longest_cache_hit(a.block_hashes, 16)
    assert hit == 16 and ids(blocks) == [0, 0, 0, 0]
    m.free(a)
    b = Request(1, list(range(12)) + [50], 13, 0, 4)
    (full, chunk), num_hit = m.get_computed_blocks(b)
    # full attention hits 3 blocks, the chunk of tokens 8..15 needs block 2 cached (the group's own): 12 tokens
    assert num_hit == 12 and len(full) == 3 and ids(chunk)[:2] == [0, 0] and ids(chunk)[2] not in (0, ids(full)[2])


def test_renaming_the_blocks_is_a_symmetry_on_two_groups():
    for values in (SWA, MAMBA):
        s = system("fixed", values)
        states = reachable(s)
        assert len(states) > 100
        perm = rotation(s.cfg.num_blocks)
        assert symmetry_breaks(s, states, lambda state: symmetry.relabel(state, perm)) is None


def test_lookahead_slots_are_attention_s_and_mamba_all_s_not_align_s():
    """`num_lookahead_tokens`: full attention and Mamba in mode `all` give them slots; `align` allocates for the main
    model's tokens alone (0.33.0's `MambaManager`: a lookahead slot would break the alignment)."""
    for mode, mamba_blocks in (("align", 3), ("all", 4)):
        m = KVCacheManager(10, 2, 1, ("full", "mamba"), mamba_cache_mode=mode)
        req = Request(0, [1, 2, 3, 4, 5], 5, 0, 2)
        full, mamba = m.allocate_slots(req, 5, num_lookahead_tokens=2)  # 7 slots: 4 blocks; the main model's 5: 3
        assert len(full) == 4 and len(mamba) == mamba_blocks, (mode, ids(full), ids(mamba))
        # cached: the request's two full blocks in each group, no lookahead slot
        assert [mgr.num_cached_block[0] for mgr in m.coordinator.single_type_managers] == [2, 2]
