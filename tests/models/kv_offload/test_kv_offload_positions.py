"""Recorded key positions (vLLM 0.33.0, issue 30): the model's position-aware LRU and ARC on small directed
sequences, and the two eviction-order properties, each passing and failing on a planted change."""

import pytest

from kvsim.app import catalog
from kvsim.engine.runner import run_property
from kvsim.models.kv_offload import context, policies
from kvsim.models.kv_offload.manager import CPUOffloadingManager

PROPS = {p.name: p for p in catalog.load().properties_of("kv-offload")}
POSITIONAL = ["lru_evicts_a_request_tail_first", "arc_finishes_in_position_order"]


def run(name, n=40, shrink=True):
    return run_property(PROPS[name], "fixed", max_examples=n, derandomize=True, shrink=shrink)


def stored(policy, capacity, keys_by_req, positions):
    """A manager whose requests store (and complete) their keys in turn; `positions[req]`: the key -> end token
    its context records."""
    m = CPUOffloadingManager(capacity, policy)
    for req, keys in keys_by_req:
        ctx = m.req_context(req)
        for key, end in positions.get(req, {}).items():
            ctx.set_offload_key_position(key, end)
        m.prepare_store(keys, req)
        m.complete_store(keys)
    return m


def test_lru_ranks_one_request_tail_first_and_by_counter_without_positions():
    ends = {0: 16, 1: 32, 2: 48}
    with_positions = stored("lru", 3, [(0, [0, 1, 2])], {0: ends})
    assert list(with_positions.resident()) == [2, 1, 0]
    assert with_positions.prepare_store([3], 1).evicted_keys == (2,)
    without = stored("lru", 3, [(0, [0, 1, 2])], {})
    assert list(without.resident()) == [0, 1, 2] and without.prepare_store([3], 1).evicted_keys == (0,)


def test_lru_request_access_raises_an_older_key_to_the_request_rank():
    m = stored("lru", 3, [(1, [1]), (1, [2]), (0, [0])], {0: {0: 16, 1: 32}})
    m.prepare_store([1], 0)  # request 0 sees key 1 (stored by request 1, older): raised to (request 0's rank, -32)
    assert list(m.resident()) == [2, 1, 0]
    assert m.prepare_store([3], 1).evicted_keys == (2,)


def test_arc_finishes_a_request_in_position_order_and_thaws_with_its_ranks():
    m = stored("arc", 2, [(0, [2]), (0, [0])], {0: {0: 16, 2: 48}})
    m.on_request_finished(0)
    assert list(m._policy.t1) == [2, 0]  # tail to head: the head is the most recent
    assert stored("arc", 2, [(0, [2]), (0, [0])], {}).freeze().requests[0][1][1] == (2, 0)  # first seen order
    lru = stored("lru", 3, [(0, [0, 1]), (1, [2])], {0: {0: 16, 1: 32}})
    again = CPUOffloadingManager.thaw(lru.freeze(), 3)
    assert again.freeze() == lru.freeze() and again.prepare_store([3], 0) == lru.prepare_store([3], 0)


def test_without_positions_the_value_form_is_the_one_before_positions():
    m = stored("lru", 3, [(0, [0, 1]), (1, [2])], {})
    assert m.freeze().policy == ("lru", ((0, 0, 0), (1, 0, 1), (2, 0, 2)))
    assert all(len(entry) == 2 for entry in m.freeze().requests)


@pytest.mark.parametrize("name", POSITIONAL)
def test_position_property_holds(name):
    result = run(name)
    assert result.status == "passed" and result.examples >= 40, result.message


def test_planted_head_first_rank_breaks_the_lru_property(monkeypatch):
    real = context.ReqContext.get_offload_key_position

    def head_first_insert(self, key, chunk, req_context):  # a request's keys ranked (request_rank, +position)
        self.chunks[key] = chunk
        position = real(req_context, key)
        if position is None:
            self._next_rank += 1
            self._ranks[key] = (self._next_rank, 0)
        else:
            self._ranks[key] = (self._get_request_rank(req_context), position)
            self._reorder()

    monkeypatch.setattr(policies.LRUCachePolicy, "insert", head_first_insert)
    result = run("lru_evicts_a_request_tail_first", n=200, shrink=False)
    assert result.status == "failed" and "later keys" in result.message, result.message


def test_planted_first_seen_finish_breaks_the_arc_property(monkeypatch):
    monkeypatch.setattr(policies, "order_request_keys", lambda groups, ctx: [k for g in groups for k in g])
    monkeypatch.setattr(CPUOffloadingManager, "on_request_finished", planted_finish)
    result = run("arc_finishes_in_position_order", n=200, shrink=False)
    assert result.status == "failed" and "not tail to head" in result.message, result.message


def planted_finish(self, req):
    """on_request_finished without the position sort (first-seen order)."""
    state = self._requests.get(req)
    if state is None or state.cache_generation != self._cache_generation or state.finished:
        return
    state.finished = True
    self._policy.on_request_finished((tuple(state.seen_keys),), state.inserted_keys - state.reused_keys,
                                     set(state.reused_keys), self.req_context(req))
