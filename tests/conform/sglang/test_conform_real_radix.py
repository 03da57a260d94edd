"""SGLang's real RadixCache and paged allocator, imported from the 0.5.23 release (kvsim.conform.installed) with
its two stubs, driven in one child for the module (kvsim.conform.sglang.real_radix). The release tree and its
pinned dependencies are prepared once in the user cache (a failed download fails here with its reason). Every
number below was derived by reading 0.5.23's radix_cache.py and allocator/paged.py."""

from __future__ import annotations

import pytest

from kvsim.conform.installed import MARKER, prepare, stubs
from kvsim.conform.installed_child import shared
from kvsim.engine.conformance.mutants import Mutant
from kvsim.engine.errors import ConfigError

DRIVER = "kvsim.conform.sglang.real_radix:RadixDriver"
RADIX = "sglang/srt/mem_cache/radix_cache.py"


def _child(version):  # type: ignore[no-untyped-def]
    env = prepare("sglang", version)
    assert (env.deps / MARKER).read_text().split() == list(env.pins)
    return shared(env, DRIVER, timeout=600.0)  # one child per release for the session, closed at exit


@pytest.fixture(scope="module")
def child():  # type: ignore[no-untyped-def]
    """0.5.23, the pinned release."""
    return _child("0.5.23")


@pytest.fixture(scope="module", params=("0.5.23", "0.5.14"))
def tree_child(request):  # type: ignore[no-untyped-def]
    """The tree and allocator ops answer the same on 0.5.14 (its own dependency table and stubs: transformers
    5.8.1, the JIT path check in jit_kernel/utils.py, torchvision visible to transformers)."""
    return _child(request.param)


def _nodes(tree):  # type: ignore[no-untyped-def]
    """{id: (key, value, lock_ref)} of every node below the root."""
    out = {}
    for c in tree["children"]:
        out[c["id"]] = (c["key"], c["value"], c["lock_ref"])
        out.update(_nodes(c))
    return out


def _branching_tree(child):  # type: ignore[no-untyped-def]
    """[0..3] -> {[4..7], [30..37]}: node 2 (split off node 1 by a match), its children 1 and 3."""
    child.call("build", size=64, page_size=4)
    a = child.call("alloc", n=12)
    assert a == list(range(4, 16))  # page 0 is the padding slot: pages 1, 2, 3
    # 10 tokens with page 4: the key is cut to 8, the value to its first 8 indices
    assert child.call("insert", tokens=list(range(10)), indices=a[:10]) == {"prefix_len": 0, "node": 1}
    child.call("free", indices=a[8:])  # the caller's tail page: freed pages go to the front
    m = child.call("match", tokens=list(range(6)) + [99], observe=True)
    # the key is cut to one page, matched inside node 1: split, the new node 2 holds the page
    assert m["answer"] == {"prefix_len": 4, "indices": [4, 5, 6, 7], "node": 2}
    assert m["state"]["free_pages"] == [3] + list(range(4, 17))
    b = child.call("alloc", n=8)
    assert b == list(range(12, 20))
    assert child.call("insert", tokens=[0, 1, 2, 3] + list(range(30, 38)), indices=[4, 5, 6, 7] + b) == {
        "prefix_len": 4, "node": 3}


def test_insert_match_split_and_dump(tree_child):  # type: ignore[no-untyped-def]
    state = tree_child.call("build", size=64, page_size=4)
    assert state == {"tree": {"id": 0, "key": [], "value": [], "lock_ref": 1, "children": []},
                     "free_pages": list(range(1, 17)), "staged_pages": [], "requests": {},
                     "req_slots": 4}  # the request pool's rows (build's default 4), all free
    _branching_tree(tree_child)
    dump = tree_child.call("dump")
    assert _nodes(dump["tree"]) == {2: ([0, 1, 2, 3], [4, 5, 6, 7], 0), 1: ([4, 5, 6, 7], [8, 9, 10, 11], 0),
                                    3: (list(range(30, 38)), list(range(12, 20)), 0)}
    assert [c["id"] for c in dump["tree"]["children"][0]["children"]] == [1, 3]
    assert dump["free_pages"] == list(range(5, 17))
    assert tree_child.call("sizes") == {"available": 48, "evictable": 16, "protected": 0}
    # a full match walks both nodes; a 3-token key is less than a page and matches nothing at the root
    assert tree_child.call("match", tokens=list(range(8))) == {"prefix_len": 8, "indices": list(range(4, 12)),
                                                               "node": 1}
    assert tree_child.call("match", tokens=[0, 1, 2]) == {"prefix_len": 0, "indices": [], "node": 0}
    # inserting what is there adds nothing and answers the whole length as present
    assert tree_child.call("insert", tokens=list(range(8)), indices=list(range(40, 48))) == {"prefix_len": 8, "node": 1}
    assert tree_child.call("sizes")["evictable"] == 16


def test_lock_protects_the_path_and_evict_frees_leaves_in_lru_order(tree_child):  # type: ignore[no-untyped-def]
    _branching_tree(tree_child)
    assert tree_child.call("lock", node=3) == {"delta": -12}  # node 3 (8) and node 2 (4) move to protected
    assert tree_child.call("sizes") == {"available": 48, "evictable": 4, "protected": 12}
    assert tree_child.call("evict", num_tokens=100) == {"evicted": 4}  # node 1 only; its page 2 goes to the front
    state = tree_child.call("dump")
    assert state["free_pages"] == [2] + list(range(5, 17))
    assert _nodes(state["tree"]) == {2: ([0, 1, 2, 3], [4, 5, 6, 7], 1), 3: (list(range(30, 38)),
                                                                               list(range(12, 20)), 1)}
    assert tree_child.call("evict", num_tokens=100) == {"evicted": 0}
    assert tree_child.call("unlock", node=3) == {"delta": 12}
    # one leaf (node 3, 8 tokens) covers the 4 asked; its pages 3 and 4 go to the front in the value's order
    assert tree_child.call("evict", num_tokens=4) == {"evicted": 8}
    assert tree_child.call("dump")["free_pages"] == [3, 4, 2] + list(range(5, 17))
    state = tree_child.call("evict", num_tokens=1, observe=True)["state"]
    assert state["free_pages"] == [1, 3, 4, 2] + list(range(5, 17))
    assert tree_child.call("sizes") == {"available": 64, "evictable": 0, "protected": 0}

    # LRU: of two unlocked leaves the one touched last is evicted last
    tree_child.call("build", size=64, page_size=4)
    tree_child.call("insert", tokens=list(range(8)), indices=tree_child.call("alloc", n=8))
    tree_child.call("insert", tokens=list(range(100, 108)), indices=tree_child.call("alloc", n=8))
    tree_child.call("match", tokens=list(range(8)))
    assert tree_child.call("evict", num_tokens=4) == {"evicted": 8}
    state = tree_child.call("dump")
    assert _nodes(state["tree"]) == {1: (list(range(8)), list(range(4, 12)), 0)}
    assert state["free_pages"] == list(range(3, 17))


def test_allocator_pages_staging_and_batch_allocations(tree_child):  # type: ignore[no-untyped-def]
    tree_child.call("build", size=16, page_size=4)
    assert tree_child.call("alloc", n=5) == [4, 5, 6, 7]  # whole pages only: 5 // 4, silently
    assert tree_child.call("alloc", n=16) is None  # 4 pages asked, 3 left
    assert tree_child.call("alloc", n=8) == list(range(8, 16))
    tree_child.call("free", indices=[4, 5, 13])  # each page touched, once, in page order, to the front
    assert tree_child.call("dump")["free_pages"] == [1, 3, 4]

    tree_child.call("build", size=16, page_size=4, need_sort=True)
    assert tree_child.call("alloc", n=12) == list(range(4, 16))
    tree_child.call("free", indices=[8])
    state = tree_child.call("free", indices=[4], observe=True)["state"]
    assert (state["free_pages"], state["staged_pages"]) == ([4], [1, 2])
    assert tree_child.call("sizes")["available"] == 12
    # short of pages, alloc merges the staged ones in sorted
    assert tree_child.call("alloc", n=8) == list(range(4, 12))
    assert tree_child.call("dump")["free_pages"] == [4]

    tree_child.call("build", size=64, page_size=4)
    # request 0: 5 new tokens, pages 1 and 2; request 1: 4 cached (a full page), 3 new in page 3
    assert tree_child.call("alloc_extend", prefix_lens=[0, 4], seq_lens=[5, 7], last_locs=[-1, 7]) == [
        4, 5, 6, 7, 8, 12, 13, 14]
    assert tree_child.call("alloc_decode", seq_lens=[6, 8], last_locs=[8, 14]) == [9, 15]  # both inside their page
    assert tree_child.call("alloc_decode", seq_lens=[9], last_locs=[15]) == [16]  # token 9 opens page 4
    assert tree_child.call("dump")["free_pages"] == list(range(5, 17))


def test_a_request_prefilled_checkpointed_decoded_and_released(child):  # type: ignore[no-untyped-def]
    """The scheduler's calls on a Req: 10 tokens with page 4 take 3 pages, the tree keeps the 8 of whole pages."""
    child.call("build", size=64, page_size=4)
    assert child.call("prefill", request="a", tokens=list(range(10))) == {"prefix_len": 0,
                                                                          "indices": list(range(4, 14)), "node": 0}
    assert child.call("sizes") == {"available": 52, "evictable": 0, "protected": 0}
    assert child.call("checkpoint", request="a") == {"protected_len": 8, "node": 1}
    assert child.call("sizes") == {"available": 52, "evictable": 0, "protected": 8}  # a holds its lock on it
    assert child.call("decode", request="a", token=77) == 14  # position 10: the third page's third slot
    # finished: the 11 tokens' two whole pages are in the tree already; the row past them (page 3) is freed
    assert child.call("release", request="a") == {"available": 56, "evictable": 8, "protected": 0}

    b = child.call("prefill", request="b", tokens=list(range(10)), observe=True)
    assert b["answer"] == {"prefix_len": 8, "indices": list(range(4, 14)), "node": 1}  # page 3 again, at the front
    assert b["state"]["requests"] == {"b": {"row": list(range(4, 14)), "protected_len": 8}}
    assert b["state"]["req_slots"] == 3  # b holds one of the request pool's four rows
    assert child.call("sizes") == {"available": 52, "evictable": 0, "protected": 8}
    assert child.call("release", request="b", checkpoint=False) == {"available": 56, "evictable": 8, "protected": 0}
    state = child.call("dump")
    assert _nodes(state["tree"]) == {1: (list(range(8)), list(range(4, 12)), 0)} and state["requests"] == {}
    assert state["req_slots"] == 4  # every release (with checkpoint or not) gives the row back
    # released without checkpoint, a request's tokens never reach the tree: its whole row is freed
    child.call("prefill", request="d", tokens=list(range(200, 208)))
    assert child.call("release", request="d", checkpoint=False) == {"available": 56, "evictable": 8, "protected": 0}
    with pytest.raises(ConfigError, match="request: expected a request prefilled"):
        child.call("release", request="b")

    # a prefill short of pages evicts the tree first (the conservative demand: its tokens and a page per request)
    child.call("build", size=16, page_size=4)
    child.call("prefill", request="a", tokens=list(range(8)))
    assert child.call("release", request="a") == {"available": 8, "evictable": 8, "protected": 0}
    c = child.call("prefill", request="c", tokens=list(range(100, 116)), observe=True)
    assert c["answer"] == {"prefix_len": 0, "indices": list(range(4, 20)), "node": 0}
    assert _nodes(c["state"]["tree"]) == {} and c["state"]["free_pages"] == []


def test_stubs_refusals_and_a_planted_regression(child):  # type: ignore[no-untyped-def]
    assert [s.module for s in stubs("sglang", "0.5.23")] == ["sglang.kernels.jit.utils.compile.paths", "torchvision"]
    with pytest.raises(ConfigError, match="op: expected one of build"):
        child.call("reset")
    child.call("build", size=16, page_size=4)
    with pytest.raises(ConfigError, match="node: expected a handle"):
        child.call("lock", node=7)
    with pytest.raises(ConfigError, match="the arguments the op takes"):
        child.call("evict", tokens=4)

    # dec_lock_ref decrementing only the end of the path: node 2 stays locked and is never evicted (the leaves 1
    # and 3 are: 12 of 16 tokens)
    text = child.env.source.file(RADIX).read_text()
    original = "node.lock_ref -= 1"
    start = text.index(original)
    mutant = Mutant(RADIX, "RadixCache.dec_lock_ref", "planted", text.count("\n", 0, start) + 1, start,
                    start + len(original), original, "node.lock_ref -= int(not node.children)")
    for planted, evicted in ((None, 16), (mutant, 12)):
        child.configure(planted)
        try:
            _branching_tree(child)
            child.call("lock", node=3)
            child.call("unlock", node=3)
            assert child.call("evict", num_tokens=100) == {"evicted": evicted}
        finally:
            child.configure(None)
