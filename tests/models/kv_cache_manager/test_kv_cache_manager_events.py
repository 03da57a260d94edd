"""The event-stream model (`event_stream`): the wire form of a `KVEventBatch`, what the announced view allows, and
the view's map (equal views are equal values whatever the order of the events that made them)."""

from __future__ import annotations

import random

import pytest

from kvsim.engine.errors import ConfigError
from kvsim.engine.system import replay_actions
from kvsim.models.kv_cache_manager.event_stream import (EMPTY, Cleared, EventStreamConfig, EventStreamSystem, Removed,
                                                          Stored, decode_batch, upstream_form)


def stored(hashes, parent=None, *, size=2, group=0, medium="GPU", rank=None, tokens=None, lora=None,
           kind="full_attention"):
    tokens = list(range(len(hashes) * size)) if tokens is None else tokens
    return Stored(rank, medium, group, tuple(hashes), parent, tuple(tokens), size, lora, kind)


def removed(*hashes, group=0, medium="GPU", rank=None):
    return Removed(rank, medium, group, tuple(hashes))


def run(events, **config):
    return replay_actions(EventStreamSystem(EventStreamConfig(**config)), events)


def test_the_array_form_msgspec_writes_and_the_field_named_form_decode_alike():
    event = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None, "token_ids": [1, 2, 3, 4],
             "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None, None],
             "group_idx": 0, "kv_cache_spec_kind": "full_attention", "a_later_release_field": [1]}
    gone = {"type": "BlockRemoved", "block_hashes": [8], "medium": "GPU", "group_idx": 0}
    array = decode_batch([1.5, [event, gone, {"type": "AllBlocksCleared"}], None])
    assert array == decode_batch([1.5, [event, gone, {"type": "AllBlocksCleared"}]])
    assert array == decode_batch({"ts": 1.5, "events": [event, gone, {"type": "AllBlocksCleared"}]})
    assert array.events == (stored([7, 8], tokens=[1, 2, 3, 4]), removed(8), Cleared(None))
    assert decode_batch([0, [gone], 3]).events == (removed(8, rank=3),)
    assert upstream_form(array.events[1]) == gone


@pytest.mark.parametrize("doc, field, expected", [
    (42, "batch", "a KVEventBatch"),
    ([1.0], "batch", "[ts, events]"),
    (["x", []], "ts", "a number"),
    ([1.0, {}], "events", "a list of events"),
    ([1.0, [], -1], "data_parallel_rank", "an integer >= 0"),
    ({"events": []}, "ts", "a field of KVEventBatch"),
    ([1.0, [7]], "events[0]", "an event object"),
    ([1.0, [{"type": "BlockEvicted"}]], "events[0].type", "BlockStored, BlockRemoved"),
    ([1.0, [{"type": "BlockRemoved"}]], "events[0].block_hashes", "a field of BlockRemoved"),
    ([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]], "events[0].block_hashes[0]", "a block hash"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, "2"],
             "block_size": 2}]], "events[0].token_ids[1]", "an integer"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2],
             "block_size": True}]], "events[0].block_size", "an integer"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2],
             "block_size": 2, "medium": 3}]], "events[0].medium", "a string or null"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2],
             "block_size": 2, "lora_id": "a"}]], "events[0].lora_id", "an integer or null"),
])
def test_a_malformed_batch_names_its_field(doc, field, expected):
    with pytest.raises(ConfigError) as caught:
        decode_batch(doc)
    assert caught.value.field == field and caught.value.expected.startswith(expected), str(caught.value)


def test_a_consistent_stream_is_taken_to_its_end():
    events = [stored([1, 2]), stored([3], parent=2), removed(3), stored([3], parent=2), stored([3], parent=2),
              removed(3), removed(3), removed(2), Cleared(None), stored([1, 2])]
    state, taken, stop = run(events, num_blocks=5, block_size=2)
    assert stop is None and taken == len(events)
    assert state.announced() == 2 and state.pool == ((None, 2),)


@pytest.mark.parametrize("events, at, message", [
    ([stored([1]), removed(2)], 1, "BlockRemoved(2): expected a hash a BlockStored announced"),
    ([stored([1]), removed(1), removed(1)], 2, "none live"),
    ([stored([1]), removed(1, group=1)], 1, "in group 1"),
    ([stored([1]), removed(1, medium="CPU")], 1, "medium CPU"),
    ([stored([1]), removed(1, rank=2)], 1, "none live"),
    ([stored([1]), Cleared(None), removed(1)], 2, "none live"),
    ([stored([1]), stored([2], parent=9)], 1, "parent_block_hash 9: expected None or a hash announced"),
    ([stored([1]), stored([2], parent=1, tokens=[5])], 1, "token_ids: expected 1 blocks x block_size 2"),
    ([stored([1, 1])], 0, "a chain of distinct hashes"),
    ([stored([2], parent=2)], 0, "a chain of distinct hashes"),
    ([stored([1], size=0, tokens=[])], 0, "block_size: expected at least 1"),
    ([stored([1], size=4)], 0, "block_size: expected 2 (--block-size)"),
    ([Removed(None, "GPU", 0, ())], 0, "expected at least one hash"),
    ([stored([1, 2]), stored([2], parent=7)], 1, "parent_block_hash 7"),
    ([stored([1, 2]), stored([5]), stored([2], parent=5)], 2, "announced before with parent 1, now 5"),
    ([stored([1]), stored([1], tokens=[9, 9])], 1, "announced before with other token ids"),
    ([stored([1], lora="a"), stored([1])], 1, "announced before with lora_name 'a', now None"),
])
def test_the_first_event_no_state_allows_is_named_with_why(events, at, message):
    state, taken, stop = run(events, block_size=2)
    assert stop is not None and stop.index == taken == at and stop.action == events[at], stop
    assert stop.check == "enabled" and message in stop.message, stop.message


@pytest.mark.parametrize("kind, required", [("full_attention", True), ("mla_attention", True), (None, True),
                                            ("sliding_window", False), ("mamba", False),
                                            ("chunked_local_attention", False)])
def test_the_parent_is_required_where_the_groups_manager_holds_every_block(kind, required):
    """0.33.0 names each BlockStored's group kind: a sliding-window (chunked, Mamba) group frees a request's blocks
    outside its window, which may be evicted before the next block is stored; `parent_groups` overrides."""
    events = [stored([1], group=1, kind=kind), removed(1, group=1), stored([2], parent=1, group=1, kind=kind)]
    stop = run(events)[2]
    assert (stop is not None) == required and (stop is None or stop.index == 2)
    assert run(events, parent_groups=frozenset({0}))[2] is None
    assert run(events, parent_groups=frozenset({1}))[2].index == 2


def test_the_pool_bound_counts_the_block_pool_media_per_rank():
    events = [stored([1, 2, 3]), stored([4], medium="CPU"), stored([1, 2, 3], rank=1), removed(3), stored([5]),
              stored([6])]
    state, taken, stop = run(events, num_blocks=4)
    assert (stop.index, stop.check) == (5, "pool_bound") and "4 blocks announced: expected at most" in stop.message
    assert state.pool == ((None, 4), (1, 3))
    assert run(events[:5], num_blocks=4)[2] is None


def test_a_clear_empties_its_ranks_block_pool_media_only():
    events = [stored([1]), stored([1], medium=None), stored([1], rank=1), stored([1], medium="CPU"), Cleared(None)]
    state, _, stop = run(events)
    assert stop is None and [key for key, _ in state.entries()] == [(1, "GPU", 0, 1), (None, "CPU", 0, 1)]
    assert state.pool == ((1, 1),)


def test_equal_views_are_equal_values_whatever_the_order_of_events():
    system = EventStreamSystem()
    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(300)] + [f"h{i}" for i in range(300)]
    gone = set(keys[:200])
    views = []
    for order in range(3):
        rng.shuffle(keys)
        state = EMPTY
        for h in keys:
            state = system.step(state, stored([h]))
        for h in (h for h in keys if h in gone):
            state = system.step(state, removed(h))
        views.append(state)
    assert views[0] == views[1] == views[2] and hash(views[0]) == hash(views[2])
    assert views[0].announced() == 400 and len(views[0].entries()) == 400
    assert system.step(views[0], stored([keys[0]])) != views[0]


def test_a_clear_builds_the_same_map_as_removing_one_by_one():
    system = EventStreamSystem()
    state = EMPTY
    for h in range(500):
        state = system.step(state, stored([h * 7919], rank=h % 2))
    cleared = system.step(state, Cleared(0))
    one_by_one = state
    for h in range(0, 500, 2):
        one_by_one = system.step(one_by_one, removed(h * 7919, rank=0))
    assert cleared.root == one_by_one.root and cleared.pool == ((1, 250),) and cleared.announced() == 250
    assert system.step(cleared, Cleared(1)) == EMPTY
