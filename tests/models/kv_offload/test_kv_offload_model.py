"""kv-offload model: the pinned upstream traces, the #35846 flag, the usage gauge, ARC details, the naming
adapters, and the value form (freeze/thaw)."""

import pytest

from kvsim.models.kv_offload import DESCRIPTOR, VARIANTS
from kvsim.models.kv_offload.manager import CPUOffloadingManager
from kvsim.models.kv_offload.names import NEW_NAMES, OLD_NAMES, NamedManager, observe, trace
from kvsim.models.kv_offload.policies import ARCCachePolicy
from kvsim.models.kv_offload.status import CPUOffloadingMetrics as M
from kvsim.models.kv_offload.status import LookupResult, OffloadingEvent, PrepareStoreOutput
from kvsim.properties.kv_offload.cases import (ALREADY_STORED, ALREADY_STORED_PRE_FIX, PREPARE_LOAD_ORDER,
                                               TEST_CPU_MANAGER, USAGE_GAUGE, OpsCase, new_manager, pinned_case,
                                               run_ops)

FIXED, PRE = VARIANTS["fixed"], VARIANTS["pre_already_stored_fix"]


def test_cpu_manager_trace_step_by_step():
    """tests/v1/kv_offload/cpu/test_manager.py::test_cpu_manager, every call's result (research note 3.4)."""
    steps = run_ops(pinned_case(TEST_CPU_MANAGER))
    assert [s.op for s in steps] == [op for op, _ in TEST_CPU_MANAGER]
    for step, (op, expected) in zip(steps, TEST_CPU_MANAGER):
        assert step.result == expected, op
    # the numbers of the table, spelled out
    results = [s.result for s in steps]
    assert results[0] == PrepareStoreOutput((1, 2), (0, 1), ())
    assert results[9] == PrepareStoreOutput((3, 4, 5), (2, 3, 0), (1,))
    assert results[11] is None and results[20] is None  # no space; then the loads pin 2 and 3
    assert results[19] == (1, 2)
    assert results[22] == PrepareStoreOutput((6, 7, 8), (3, 2, 1), (2, 3, 4))
    assert results[25] == PrepareStoreOutput((9,), (1,), (8,))
    stores = [set(e.keys) for e in results[-1] if not e.removed]
    evictions = [set(e.keys) for e in results[-1] if e.removed and not e.metadata_only]
    assert stores == [{3, 4, 5}, {6, 7, 8}] and evictions == [{2, 3, 4}, {8}]
    # 0.33.0 adds the failed store's metadata-only release of 9 (key 7, ready, is unaffected)
    assert results[-1][-1] == OffloadingEvent((9,), removed=True, metadata_only=True)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_already_stored_key_survives_prepare_store(policy):
    """test_already_stored_block_not_evicted_during_prepare_store, for LRU and ARC: key 1 goes, key 2 stays."""
    steps = run_ops(pinned_case(ALREADY_STORED, policy=policy))
    assert [s.result for s in steps] == [expected for _, expected in ALREADY_STORED]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_before_35846_the_already_stored_key_is_evicted(policy):
    steps = run_ops(pinned_case(ALREADY_STORED, policy=policy), PRE)
    for i, (_, expected) in enumerate(ALREADY_STORED):
        assert steps[i].result == ALREADY_STORED_PRE_FIX.get(i, expected), i
    assert steps[3].result.evicted_keys == (2,) and steps[5].result is LookupResult.MISS


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_prepare_load_preserves_key_order(policy):
    steps = run_ops(pinned_case(PREPARE_LOAD_ORDER, policy=policy))
    assert [s.result for s in steps] == [expected for _, expected in PREPARE_LOAD_ORDER]


def test_the_variant_flag_is_read_where_prepare_store_builds_the_protected_set():
    assert [v.protect_input_keys for v in VARIANTS.values()] == [True, False]
    assert DESCRIPTOR.variant("pre_already_stored_fix") is PRE


@pytest.mark.parametrize("capacity, ops, usage, write, read", USAGE_GAUGE)
def test_usage_gauge(capacity, ops, usage, write, read):
    """0.0 at capacity 0, 0.5 at 2 of 4 slots in use, 1.0 full; write and read usage split it."""
    m = new_manager(OpsCase(capacity, "lru", ()))
    run_ops(OpsCase(capacity, "lru", ops), manager=m)
    gauges = m.get_stats()["gauges"]
    assert (gauges[M.CPU_CACHE_USAGE_PERC], gauges[M.CPU_CACHE_WRITE_USAGE_PERC],
            gauges[M.CPU_CACHE_READ_USAGE_PERC]) == (usage, write, read)


def test_get_stats_drains_the_batch_and_counts_skipped_stores():
    m = CPUOffloadingManager(4, "lru", store_threshold=2, max_tracker_size=8)
    assert m.prepare_store([1, 2], 0) == PrepareStoreOutput((), (), ())  # first offer: under the threshold
    assert m.prepare_store([1, 2], 0) == PrepareStoreOutput((1, 2), (0, 1), ())
    assert m.prepare_store([5, 6, 7], 0) == PrepareStoreOutput((), (), ())  # three more under the threshold
    stats = m.get_stats()
    assert stats["counters"] == {M.STORES_SKIPPED: 5}
    assert stats["histograms"][M.CPU_ALLOCATION_SIZE] == (2,)
    again = m.get_stats()
    assert again["counters"] == {M.STORES_SKIPPED: 0} and again["histograms"][M.CPU_ALLOCATION_SIZE] == ()


def test_a_refused_store_still_observes_its_allocation_size():
    """Upstream appends the allocation size before the None returns (a refused attempt is observed)."""
    m = CPUOffloadingManager(1, "lru")
    m.prepare_store([1], 0)
    assert m.prepare_store([2], 0) is None  # key 1 write-pending: nothing evictable
    assert m.get_stats()["histograms"][M.CPU_ALLOCATION_SIZE] == (1, 1)


def test_free_list_is_lifo_after_the_high_water_mark():
    m = CPUOffloadingManager(3, "lru")
    m.prepare_store([0, 1, 2], 0)
    m.complete_store([0, 1, 2], success=False)  # slots 0, 1, 2 pushed in that order
    assert m._free_list == [0, 1, 2] and m._num_allocated_chunks == 3
    assert m.prepare_store([5, 6], 0).chunk_ids == (2, 1)


def test_arc_touch_promotes_ready_keys_and_ghost_hits_move_the_target():
    m = CPUOffloadingManager(2, "arc")
    policy = m._policy
    assert isinstance(policy, ARCCachePolicy)
    m.prepare_store([1, 2], 0)
    m.touch([1])  # pending: stays in T1
    assert list(policy.t1) == [2, 1] and not policy.t2
    m.complete_store([1, 2])
    m.touch([1])
    assert list(policy.t1) == [2] and list(policy.t2) == [1]
    assert m.prepare_store([3], 0).evicted_keys == (2,)  # T1 (size 1) >= target 0: from T1, into B1
    assert list(policy.b1) == [2]
    m.touch([2])  # a B1 ghost hit: the target grows by max(1, |B2| / |B1|)
    assert policy.target_t1_size == 1.0


def test_arc_evict_falls_back_to_t1_when_t2_has_no_idle_key():
    """0.30.0 and later: T1 below the target and T2 all pinned, a T1 key is taken (0.29.0 returned None)."""
    m = CPUOffloadingManager(3, "arc")
    for ops in ([0, 1, 2], [3], [4]):
        m.prepare_store(ops, 0)
        m.complete_store(ops)
    m.touch([0, 1])  # two B1 ghost hits: target 2
    m.touch([3, 4])  # 3, 4 to T2
    m.prepare_load([3, 4], 0)
    assert m._policy.target_t1_size == 2.0 and list(m._policy.t1) == [2]
    assert m.prepare_store([5], 0) == PrepareStoreOutput((5,), (2,), (2,))


def test_freeze_thaw_round_trip():
    m = CPUOffloadingManager(3, "arc", store_threshold=2, max_tracker_size=3)
    run_ops(OpsCase(3, "arc", (("store", 0, (1, 2)), ("store", 0, (1, 2)), ("complete_store", 0, (1,), True),
                               ("load", 1, (1,)), ("touch", 0, (1, 2, 3)))), manager=m)
    state = m.freeze()
    again = CPUOffloadingManager.thaw(state, 3, 2, 3)
    assert again.freeze() == state and hash(state) == hash(again.freeze())


def test_finished_request_sees_no_new_keys():
    m = CPUOffloadingManager(2, "lru")
    m.prepare_store([1], 7)
    m.on_request_finished(7)
    with pytest.raises(AssertionError, match="after request finalization"):
        m.prepare_store([2], 7)


def test_naming_adapters_answer_only_by_their_own_names():
    old = NamedManager(OLD_NAMES, num_blocks=4)
    new = NamedManager(NEW_NAMES, num_chunks=4)
    old.prepare_store([1, 2], 0)
    assert old._num_allocated_blocks == 2 and getattr(old.status(1), "block_id") == 0
    with pytest.raises(AttributeError, match="_num_allocated_chunks"):
        getattr(old, "_num_allocated_chunks")
    with pytest.raises(AttributeError, match="_num_blocks"):
        getattr(new, "_num_blocks")
    with pytest.raises(KeyError):
        NamedManager(OLD_NAMES, num_chunks=4)  # the old constructor argument is num_blocks
    ops = [("prepare_store", [1, 2], 0), ("complete_store", [1, 2], True), ("prepare_load", [2, 1], 0)]
    assert trace(OLD_NAMES, ops, range(4), num_blocks=4) == trace(NEW_NAMES, ops, range(4), num_chunks=4)
    assert observe(old, range(4))["slots"] == {1: 0, 2: 1}
