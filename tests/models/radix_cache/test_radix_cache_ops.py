"""radix-cache's ops on hand-built cases; each number is what the 0.5.23 line named beside it gives."""

from __future__ import annotations

from kvsim.models.radix_cache import common
from kvsim.models.radix_cache.allocator import PagedTokenToKVPoolAllocator
from kvsim.models.radix_cache.radix_cache import RadixCache


def pool(num_pages=6, page_size=2, need_sort=False):
    alloc = PagedTokenToKVPoolAllocator(num_pages, page_size, need_sort)
    return alloc, RadixCache(alloc, page_size)


# -- the allocator (allocator/paged.py) ------------------------------------------------------------------------------
def test_page_zero_is_reserved_and_alloc_floors_to_whole_pages():
    alloc, _ = pool()
    # clear(): free_pages = arange(1, num_pages + 1); alloc: num_pages = need_size // page_size
    assert alloc.alloc(5) == (2, 3, 4, 5)
    assert alloc.free_pages == [3, 4, 5, 6] and alloc.available_size() == 8
    assert alloc.alloc(1) == ()  # 1 // 2 pages: nothing, not None
    assert alloc.alloc(10) is None and alloc.free_pages == [3, 4, 5, 6]


def test_freed_pages_go_to_the_front_free_sorted_and_free_segment_as_given():
    alloc, _ = pool()
    alloc.alloc(12)
    # free: torch.unique(free_index // page_size), then _release_page_ids: cat((page_ids, free_pages))
    alloc.free((11, 4, 5, 10))
    assert alloc.free_pages == [2, 5]
    # free_segment: free_index[::page_size] // page_size, in the order given
    alloc.free_segment((12, 13, 6, 7), 0)
    assert alloc.free_pages == [6, 3, 2, 5]
    assert alloc.alloc(2) == (12, 13)
    assert not alloc.problems


def test_need_sort_stages_frees_and_merges_sorted_when_short():
    alloc, _ = pool(num_pages=3, page_size=1, need_sort=True)
    alloc.alloc(3)
    alloc.free_segment((3,), 0)
    alloc.free_segment((1,), 0)
    assert alloc.free_pages == [] and alloc.staged_pages == [3, 1] and alloc.available_size() == 2
    # alloc: num_pages > len(free_pages) -> merge_and_sort_free (torch.sort)
    assert alloc.alloc(1) == (1,) and alloc.free_pages == [3] and alloc.staged_pages == []


def test_a_free_group_holds_frees_until_its_end():
    alloc, _ = pool(num_pages=4, page_size=1)
    alloc.alloc(4)
    alloc.free_group_begin()
    alloc.free((4, 2))
    alloc.free_segment((3,), 0)
    assert alloc.available_size() == 0
    # free_group_end: base's free(cat(pending)) first, then the page-id group in front of it
    alloc.free_group_end()
    assert alloc.free_pages == [3, 2, 4]


def test_double_free_and_unaligned_segment_are_recorded():
    alloc, _ = pool()
    alloc.free_segment((2, 3), 0)
    alloc.free_segment((4,), 1)
    assert alloc.problems == ["page 1 freed while free", "free_segment at 1: expected a page-aligned start "
                              "(page_size 2)", "page 2 freed while free"]


def test_alloc_extend_and_alloc_decode_fill_the_last_page_first():
    alloc, _ = pool(num_pages=4, page_size=4)
    assert alloc.alloc(4) == (4, 5, 6, 7)
    # alloc_extend_naive: prefix 2 (slots 4, 5 on page 1): the page's rest, then new pages, the last partly
    assert alloc.alloc_extend(2, 9, 5) == (6, 7, 8, 9, 10, 11, 12)
    assert alloc.free_pages == [4]
    # alloc_decode_naive: a position that starts a page takes a new page's first slot, else last_loc + 1
    assert alloc.alloc_decode(10, 12) == (13,)
    assert alloc.alloc_decode(13, 15) == (16,) and alloc.free_pages == []
    assert alloc.alloc_decode(17, 19) is None  # get_num_new_pages 1 > 0 free
    alloc.free_segment((4, 5, 6, 7), 0)
    assert alloc.alloc_extend(0, 5, -1) is None  # get_num_new_pages 2 > 1 free


# -- the tree (radix_cache.py) ---------------------------------------------------------------------------------------
def test_match_splits_a_node_and_insert_reports_the_prefix_there():
    _, tree = pool()
    # insert: key page_aligned (5 tokens -> 4), value cut to the key
    assert tree.insert((1, 2, 3, 4, 5), (2, 3, 4, 5, 6))[0] == 0
    # match_prefix: a match ending inside a node splits it (_split_node), on a page boundary
    prefix_len, indices, node = tree.match_prefix((1, 2, 3, 9, 9))
    assert (prefix_len, indices, node.path()) == (2, (2, 3), (1, 2))
    assert [(n.path, n.key_len) for n in tree.freeze().nodes] == [((1, 2), 2), ((1, 2, 3, 4), 2)]
    assert tree.match_prefix((1, 3)) == (0, (), tree.root_node)
    assert tree.match_prefix((1,))[0] == 0  # shorter than a page: aligned to nothing
    assert tree.insert((1, 2, 7, 7), (2, 3, 8, 9))[0] == 2
    assert tree.evictable_size() == 6 and tree.protected_size() == 0


def test_locks_move_sizes_along_the_path():
    _, tree = pool()
    tree.insert((1, 2, 3, 4), (2, 3, 4, 5))
    tree.insert((1, 2, 7, 7), (2, 3, 8, 9))
    leaf = tree.node_at((1, 2, 3, 4))
    # inc_lock_ref: every node on the path whose count leaves 0 moves its key length to protected
    assert tree.inc_lock_ref(leaf) == -4 and (tree.evictable_size(), tree.protected_size()) == (2, 4)
    assert tree.inc_lock_ref(tree.node_at((1, 2, 7, 7))) == -2
    assert tree.evict(10) == 0  # every leaf locked
    assert tree.dec_lock_ref(leaf) == 2 and (tree.evictable_size(), tree.protected_size()) == (2, 4)


def test_freeze_lists_the_nodes_in_path_order_with_each_path_its_walk_up():
    """freeze walks from the root, children by key, each path built on its parent's once and kept on the node: the
    nodes as sorting them by path gives (the value form's order), each path as the node's walk up gives it, after
    every op of random inserts, matches (splits), locks and evictions at page sizes 1 and 2, and on a thaw."""
    import random

    from kvsim.models.radix_cache.radix_cache import NodeState

    def by_definition(tree):
        rank = {t: i for i, t in enumerate(sorted({n.last_access_time for n in tree.all_nodes()}))}
        return tuple(sorted(NodeState(n.path(), len(n.key), n.value, n.lock_ref, rank[n.last_access_time])
                            for n in tree.all_nodes()))

    rng = random.Random(5)
    for trial in range(200):
        page_size = 1 + trial % 2
        _, tree = pool(num_pages=64, page_size=page_size)
        for _ in range(rng.randrange(1, 12)):
            tokens = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 9)))
            op = rng.random()
            if op < 0.5:
                tree.insert(tokens, tuple(range(100, 100 + len(tokens))))
            elif op < 0.8:
                _, _, node = tree.match_prefix(tokens)
                if rng.random() < 0.5:
                    tree.inc_lock_ref(node)
            else:
                tree.evict(rng.randrange(1, 6))
            frozen = tree.freeze()
            assert frozen.nodes == by_definition(tree), (trial, frozen.nodes)
        assert RadixCache.thaw(frozen, None, page_size).freeze() == frozen


def test_evict_takes_the_least_recently_used_leaf_then_its_parent():
    alloc, tree = pool(num_pages=6, page_size=1)
    slots = alloc.alloc(6)
    tree.insert((1, 2, 3), slots[:3])
    tree.insert((1, 2, 4), slots[:2] + slots[3:4])
    tree.insert((5, 6), slots[4:])
    tree.match_prefix((1, 2, 3))  # (1,2,3) is now the most recent; (1,2,4) the least
    # evict: heap on last_access_time; a parent left childless and unlocked is pushed
    assert tree.evict(1) == 1 and alloc.free_pages == [4]
    assert tree.evict(3) == 3 and alloc.free_pages == [3, 5, 6, 4]  # (5,6), then (1,2,3)'s leaf, each in front
    assert tree.evict(2) == 2 and [n.path for n in tree.freeze().nodes] == []
    assert alloc.free_pages == [1, 2, 3, 5, 6, 4] and not tree.problems


# -- the request life cycle (common.py) ------------------------------------------------------------------------------
def test_checkpoint_frees_the_duplicates_and_release_the_unaligned_tail():
    alloc, tree = pool(num_pages=7, page_size=2)
    a, b = common.Req(0, (1, 2, 3, 4, 5)), common.Req(1, (1, 2, 3, 4, 5))
    # a and b both admitted before either is in the tree: no hit, 5 slots each (3 pages; the demand 5 + 2 fits)
    assert common.admit(tree, alloc, a) == (0, (2, 3, 4, 5, 6))
    assert common.admit(tree, alloc, b) == (0, (8, 9, 10, 11, 12))
    assert common.checkpoint(tree, alloc, a, 5) == 0  # up to the extend's end: 4 tokens (2 pages) in the tree
    assert a.cache_protected_len == 4 and a.lock.path() == (1, 2, 3, 4)
    # b's insert finds a's 4 tokens: its own slots for them (pages 4, 5) are freed, its row repointed at a's
    assert common.checkpoint(tree, alloc, b, 5) == 4
    assert alloc.free_pages == [4, 5, 7] and b.row == [2, 3, 4, 5, 12]
    assert tree.node_at((1, 2, 3, 4)).lock_ref == 2 and tree.protected_size() == 4
    # release without checkpoint: row past cache_protected_len (the tail's page 6) freed whole, unlocked
    common.release_kv_cache(tree, alloc, b, checkpointed=False)
    assert alloc.free_pages == [6, 4, 5, 7] and tree.node_at((1, 2, 3, 4)).lock_ref == 1
    assert not alloc.problems and not tree.problems
