"""The second load mode on vLLM: the released `KVCacheManager` imported for real (kvsim.conform.installed), driven
in its child process (kvsim.conform.vllm.real_manager). The release tree and its pinned dependencies are prepared
once in the user cache (a failed download fails here with its reason); one child per release for the module."""

from __future__ import annotations

import pytest

from kvsim.conform.installed import MARKER, prepare
from kvsim.conform.installed_child import shared
from kvsim.engine.conformance.answers import Answered
from kvsim.engine.errors import ConfigError

DRIVER = "kvsim.conform.vllm.real_manager:ManagerDriver"
# 0.33.0, the pinned release; 0.26.0, the release before the #48195 and #50297 fixes (the same table)
RELEASES = ("0.33.0", "0.26.0")


@pytest.fixture(scope="module", params=RELEASES)
def child(request):  # type: ignore[no-untyped-def]
    env = prepare("vllm", request.param)
    assert (env.deps / MARKER).read_text().split() == list(env.pins)
    return shared(env, DRIVER, timeout=600.0)  # the release's one child for the session, closed at exit


def _ref_counts(state):  # type: ignore[no-untyped-def]
    return [count for _, count, _ in state["blocks"]]


def test_prefix_hits_ref_counts_and_the_lru_free_queue(child):  # type: ignore[no-untyped-def]
    state = child.call("build", num_blocks=10, block_size=4, events=True)
    assert state == {"blocks": [[i, 0, False] for i in range(10)], "free": list(range(1, 10)), "tables": {},
                     "common": {}, "events": []}
    assert child.call("computed", request="a", tokens=list(range(10))) == {"blocks": [], "hit": 0}
    a = child.call("allocate", request="a", new_tokens=10, observe=True)
    # block 0 is the null block; two full blocks are hashed, the third holds 2 tokens
    assert a["answer"] == {"blocks": [1, 2, 3], "held": [1, 2, 3]}
    assert a["state"]["blocks"][:5] == [[0, 0, False], [1, 1, True], [2, 1, True], [3, 1, False], [4, 0, False]]
    assert a["state"]["free"] == [4, 5, 6, 7, 8, 9]
    (stored,) = a["state"]["events"]
    assert stored["type"] == "BlockStored" and stored["token_ids"] == list(range(8))
    assert stored["parent_block_hash"] is None and stored["block_size"] == 4 and len(stored["block_hashes"]) == 2

    b = child.call("computed", request="b", tokens=list(range(8)) + [50, 51, 52])  # shares 8 tokens with a
    assert b == {"blocks": [1, 2], "hit": 8}
    assert child.call("allocate", request="b", new_tokens=3, computed_tokens=8) == {"blocks": [4], "held": [1, 2, 4]}
    seen = child.call("observe")
    assert _ref_counts(seen) == [0, 2, 2, 1, 1, 0, 0, 0, 0, 0]
    assert seen["tables"] == {"a": [1, 2, 3], "b": [1, 2, 4]}
    # cascade attention's common prefix (before 0.32.0): the two blocks both requests hold; zeros from 0.32.0
    counted = child.env.source.version == "0.26.0"
    assert seen["common"] == ({"a": [2], "b": [2]} if counted else {"a": [0], "b": [0]})

    assert child.call("free", request="a") == [1, 2, 3]
    state = child.call("free", request="b", observe=True)["state"]
    assert _ref_counts(state) == [0] * 10
    assert [hashed for _, _, hashed in state["blocks"]] == [False, True, True] + [False] * 7
    # the LRU order upstream defines: a request's blocks are freed tail first; a block without a hash goes to the
    # front (evicted first), a cached one to the back, so the cached prefix [1, 2] is evicted last, 1 after 2
    assert state["free"] == [4, 3, 5, 6, 7, 8, 9, 2, 1]
    assert state["events"] == []

    # a new 36-token request takes the nine free blocks in the queue's order, evicting the cached two last
    c = child.call("computed", request="c", tokens=list(range(100, 136)))
    assert c == {"blocks": [], "hit": 0}
    c = child.call("allocate", request="c", new_tokens=36, observe=True)
    assert c["answer"]["blocks"] == [4, 3, 5, 6, 7, 8, 9, 2, 1]
    assert c["state"]["free"] == [] and _ref_counts(c["state"]) == [0] + [1] * 9
    kinds = [e["type"] for e in c["state"]["events"]]
    removed = [h for e in c["state"]["events"] if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert sorted(removed) == sorted(stored["block_hashes"]), c["state"]["events"]
    assert kinds.count("BlockStored") >= 1 and kinds[-1] == "BlockStored"
    # a prefix of the evicted request no longer hits
    assert child.call("computed", request="d", tokens=list(range(10)))["hit"] == 0


def test_refusals_and_engine_raises_are_answers(child):  # type: ignore[no-untyped-def]
    child.call("build", num_blocks=4, block_size=4)
    with pytest.raises(ConfigError, match="op: expected one of build"):
        child.call("evict_everything")
    with pytest.raises(ConfigError, match="request first seen with its tokens"):
        child.call("free", request="never-seen")
    with pytest.raises(ConfigError, match="the arguments the op takes"):
        child.call("computed", request="x", tokens=list(range(8)), max_cache_hit_length=3)
    assert child.call("computed", request="x", tokens=list(range(8))) == {"blocks": [], "hit": 0}
    with pytest.raises(Answered) as raised:  # the block pool asserts a positive block count
        child.call("build", num_blocks=0, block_size=4)
    answer = raised.value.answer
    assert answer.type == "AssertionError" and answer.origin == "upstream"
    assert answer.where.startswith(str(child.env.source.root / "vllm" / "v1" / "core" / "block_pool.py")), answer
    # the child still answers after a raise, with the manager it had
    assert child.call("allocate", request="x", new_tokens=8)["blocks"] == [1, 2]


def test_without_caching_nothing_is_hashed_or_hit_and_freed_blocks_are_reused_first(child):  # type: ignore[no-untyped-def]
    child.call("build", num_blocks=10, block_size=4, enable_caching=False, events=True)
    child.call("computed", request="a", tokens=list(range(10)))
    assert child.call("allocate", request="a", new_tokens=10)["blocks"] == [1, 2, 3]
    state = child.call("free", request="a", observe=True)["state"]
    assert state["blocks"] == [[i, 0, False] for i in range(10)] and state["events"] == []
    # uncached blocks are prepended, tail first: the request's last block is the next one handed out (LIFO)
    assert state["free"] == [3, 2, 1, 4, 5, 6, 7, 8, 9]
    assert child.call("computed", request="b", tokens=list(range(10))) == {"blocks": [], "hit": 0}


def test_the_scheduler_ops_decode_preempt_and_reset(child):  # type: ignore[no-untyped-def]
    """The lockstep's vocabulary: schedule (hit + allocate), sample and decode, preempt (free, recompute from token
    0 with the tokens kept), reset_prefix_cache refused while a block is held and done once all are free."""
    child.call("build", num_blocks=6, block_size=2, events=True)
    assert child.call("schedule", request="a", tokens=[1, 1, 2]) == {"hit": [], "hit_tokens": 0, "new": [1, 2],
                                                                     "held": [1, 2]}
    assert child.call("sample", request="a", token=8) == 4
    assert child.call("decode", request="a") == {"new": [], "held": [1, 2]}  # the 4th token fills block 2
    state = child.call("observe")
    assert [e["type"] for e in state["events"]] == ["BlockStored", "BlockStored"]
    assert state["events"][1]["token_ids"] == [2, 8]
    assert child.call("reset") is False  # a's blocks are held
    assert child.call("preempt", request="a") == [1, 2]
    state = child.call("observe")
    assert state["tables"] == {} and state["free"] == [3, 4, 5, 2, 1]
    # rescheduled: its four tokens (prompt and output) hit the first block only (the last token is recomputed,
    # in a new block from the queue's front)
    assert child.call("schedule", request="a", tokens=[]) == {"hit": [1], "hit_tokens": 2, "new": [3],
                                                              "held": [1, 3]}
    assert child.call("free", request="a") == [1, 3]
    assert child.call("reset") is True
    assert child.call("observe")["events"][-1] == {"type": "AllBlocksCleared"}
    with pytest.raises(ConfigError, match="op: expected one of build, computed, allocate, free, observe, schedule"):
        child.call("evict")
