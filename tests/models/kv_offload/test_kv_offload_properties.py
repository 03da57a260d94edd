"""kv-offload properties: each passes on `fixed`, the #35846 one fails on its variant, and every property that
holds on both variants by construction fails on a planted mutation; explore and the bug report."""

import pytest
from toys import kept_walk

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.engine.explore import explore
from kvsim.engine.runner import run_property
from kvsim.models.kv_offload import DESCRIPTOR, manager as manager_module, names, policies
from kvsim.models.kv_offload.status import CPUOffloadingMetrics
from kvsim.engine.errors import PropertyViolation
from kvsim.models.kv_offload.system import RULES, OffloadSystem, OffloadSystemConfig
from kvsim.models.kv_offload.variants import FIXED, VARIANTS
from kvsim.properties.kv_offload.cases import OpsCase

REG = catalog.load()
PROPS = {p.name: p for p in REG.properties_of("kv-offload")}
OURS = ["capacity_and_free_list_hold", "counters_match_ref_counts", "prepare_store_never_evicts_an_input_key",
        "prepare_store_semantics", "prepare_load_in_key_order", "failed_store_recovers",
        "old_and_new_names_trace_equal", "metric_names_are_the_new_strings", "offload_system_invariants"]


def run(name, variant="fixed", n=60, use_examples=True):
    result = run_property(PROPS[name], variant, max_examples=n, derandomize=True, use_examples=use_examples)
    return result


def test_every_property_is_registered():
    assert set(OURS) <= set(PROPS)
    assert list(REG.bugs["vllm-35846-already-stored-evicted"].upstream_files)


@pytest.mark.parametrize("name", OURS)
def test_property_holds_on_fixed(name):
    result = run(name)
    assert result.status == "passed", result.message
    assert result.examples >= 60


@pytest.mark.parametrize("name", [n for n in OURS if n not in ("prepare_store_never_evicts_an_input_key",
                                                               "offload_system_invariants")])
def test_by_construction_properties_hold_on_the_pre_fix_variant_too(name):
    assert run(name, "pre_already_stored_fix", n=30).status == "passed"


def test_the_35846_property_fails_on_its_variant_from_search_alone():
    result = run("prepare_store_never_evicts_an_input_key", "pre_already_stored_fix", n=300, use_examples=False)
    assert result.status == "failed" and "evicted input keys" in result.message


def test_the_stateful_property_fails_on_the_pre_fix_variant():
    result = run("offload_system_invariants", "pre_already_stored_fix", n=200)
    assert result.status == "failed" and result.message.startswith("no_input_key_evicted")


@pytest.mark.parametrize("variant, policy", [("fixed", "lru"), ("fixed", "arc"), ("pre_already_stored_fix", "lru")])
def test_allows_is_membership_in_enabled(variant, policy):
    """Each rule's precondition (read by `allows`) is the condition `enabled` lists its action under."""
    system = OffloadSystem(VARIANTS[variant], OffloadSystemConfig(cache_policy=policy, resets=1))
    actions, wrong = RULES.disagreements(system)
    assert {a.tag for a in actions} == {"store", "complete_store", "load", "complete_load", "touch", "finish", "reset"}
    assert not wrong


# -- planted mutations: each by-construction property must catch its own ------------------------------
# (on upstream's pinned traces, the property's examples; the free-list one by search alone too)

def _double_free(self, chunk):  # a freed slot is pushed twice
    self._free_list.extend((chunk.chunk_id, chunk.chunk_id))


def _complete_load_forgets_the_count(self, keys):
    for key in keys:
        chunk = self._policy.get(key)
        chunk.ref_cnt -= 1
        if chunk.ref_cnt == 0:
            self._policy.mark_evictable(key)  # the evictable count is not raised


def _evict_ignores_pins(self, n, protected):
    chosen = [(k, c) for k, c in self.chunks.items() if k not in protected][:n]
    if len(chosen) < n:
        return None
    for k, _ in chosen:
        del self.chunks[k]
    return chosen


def _prepare_load_sorted(original):
    def prepare_load(self, keys, req):
        return tuple(sorted(original(self, keys, req)))
    return prepare_load


def _failure_drops_ready_keys(original):
    def complete_store(self, keys, success=True):
        if not success:
            for key in keys:
                chunk = self._policy.get(key)
                if chunk is not None and chunk.ref_cnt == 0:  # a ready key in the failed call is dropped too
                    self._policy.remove(key)
                    self._num_evictable_cache_chunks -= 1
                    self._free_chunk(chunk)
        return original(self, keys, success)
    return complete_store


def test_planted_double_free_breaks_the_free_list_algebra(monkeypatch):
    monkeypatch.setattr(manager_module.CPUOffloadingManager, "_free_chunk", _double_free)
    result = run("capacity_and_free_list_hold", n=20)
    assert result.status == "failed" and ("free list" in result.message or "both live and free" in result.message)


def test_planted_double_free_is_found_by_search_alone(monkeypatch):
    monkeypatch.setattr(manager_module.CPUOffloadingManager, "_free_chunk", _double_free)
    assert run("capacity_and_free_list_hold", use_examples=False, n=100).status == "failed"


def test_planted_count_slip_breaks_the_counters(monkeypatch):
    monkeypatch.setattr(manager_module.CPUOffloadingManager, "complete_load", _complete_load_forgets_the_count)
    result = run("counters_match_ref_counts", n=20)
    assert result.status == "failed" and "_num_evictable_cache_chunks" in result.message


def test_the_pinned_eviction_case_passes_unplanted():
    case = OpsCase(2, "lru", (("store", 0, (0, 1)), ("complete_pending", 0, True), ("load", 0, (0,)),
                              ("store", 0, (2,))))
    PROPS["prepare_store_semantics"](case, FIXED)  # the real policy evicts key 1, the idle one


def test_planted_eviction_of_pinned_chunks_breaks_store_semantics(monkeypatch):
    monkeypatch.setattr(policies.LRUCachePolicy, "evict", _evict_ignores_pins)
    # key 0 is loading (oldest), key 1 idle: one new key needs one victim, and the plant takes key 0
    case = OpsCase(2, "lru", (("store", 0, (0, 1)), ("complete_pending", 0, True), ("load", 0, (0,)),
                              ("store", 0, (2,))))
    with pytest.raises(PropertyViolation, match="expected only idle chunks"):
        PROPS["prepare_store_semantics"](case, FIXED)


def test_planted_sorted_load_spec_breaks_key_order(monkeypatch):
    original = manager_module.CPUOffloadingManager.prepare_load
    monkeypatch.setattr(manager_module.CPUOffloadingManager, "prepare_load", _prepare_load_sorted(original))
    result = run("prepare_load_in_key_order", n=20)
    assert result.status == "failed" and "in key order" in result.message


def test_planted_failure_that_drops_ready_keys_breaks_recovery(monkeypatch):
    original = manager_module.CPUOffloadingManager.complete_store
    monkeypatch.setattr(manager_module.CPUOffloadingManager, "complete_store", _failure_drops_ready_keys(original))
    result = run("failed_store_recovers", n=20)
    assert result.status == "failed" and "not pending in the failed store" in result.message


def test_planted_missed_rename_breaks_trace_equality(monkeypatch):
    """An old-names caller reading a renamed counter through getattr with a default sees 0, not the count."""
    original = names.NamedManager.__getattr__

    def stale(self, name):
        if name == "_num_evictable_cache_blocks":
            return 0  # getattr(manager, "_num_evictable_cache_blocks", 0) on a manager that renamed it
        return original(self, name)

    monkeypatch.setattr(names.NamedManager, "__getattr__", stale)
    result = run("old_and_new_names_trace_equal", n=100)
    assert result.status == "failed" and "old names give" in result.message


def test_planted_old_metric_string_breaks_the_metric_names(monkeypatch):
    monkeypatch.setattr(CPUOffloadingMetrics, "CPU_ALLOCATION_SIZE", "vllm:kv_offload_cpu_block_allocation_size")
    result = run("metric_names_are_the_new_strings", n=30)
    assert result.status == "failed" and "vllm:kv_offload_cpu_block_allocation_size" in result.message


# -- explore and the bug report ----------------------------------------------------------------------

@pytest.mark.parametrize("policy, states", [("lru", 653), ("arc", 4175)])
def test_explore_fixed_holds_every_invariant_and_liveness(policy, states):
    result = explore(DESCRIPTOR.build_system("fixed", {"cache_policy": policy}))
    assert result.bound_hit is None and result.violations == [] and result.states == states


def test_explore_finds_the_already_stored_eviction_in_three_steps():
    result = explore(DESCRIPTOR.build_system("pre_already_stored_fix"))
    (violation,) = result.violations
    assert violation.property == "no_input_key_evicted"
    assert violation.trace == [["store", 1], ["complete_store", 1, True], ["store", 0]]


def test_planted_lost_completion_is_a_hang(monkeypatch):
    """Liveness: a store completion that never becomes enabled leaves the request unable to finish."""
    original = OffloadSystem.enabled
    monkeypatch.setattr(OffloadSystem, "enabled",
                        lambda self, s: [a for a in original(self, s) if a[0] != "complete_store"])
    result = explore(DESCRIPTOR.build_system("fixed"))
    assert [v.property for v in result.violations] == ["every_job_concludes"] and result.hang_states > 0


def test_repro_of_the_bug_report():
    result = reproduce(REG.bug("vllm-35846-already-stored-evicted"))
    assert result.reproduced and result.fixed_passes, result
    assert result.counterexample == {"trace": [["store", 1], ["complete_store", 1, True], ["store", 0]],
                                     "kind": "invariant"}


@pytest.mark.parametrize("variant,params", [
    ("fixed", {"cache_policy": "lru", "num_chunks": 3, "requests": 3, "prompt_len": 3, "resets": 2}),
    ("fixed", {"cache_policy": "arc", "num_chunks": 3, "requests": 3, "prompt_len": 3, "store_failures": 2}),
    ("fixed", {"cache_policy": "lru", "num_chunks": 2, "requests": 3, "store_threshold": 2}),  # counts: not kept
    ("pre_already_stored_fix", {"cache_policy": "arc", "num_chunks": 2, "requests": 3, "prompt_len": 3}),
])
def test_a_kept_manager_steps_as_a_thawed_one(variant, params):
    """`kvsim.engine.system.Thawed`: the manager a transition left, taken by the next step from the state it froze
    to, steps as one thawed afresh (`toys.kept_walk`), and freezes to the successor's manager."""
    config = OffloadSystemConfig(**params)
    kept = kept_walk(lambda: OffloadSystem(VARIANTS[variant], config), 600, 3, lambda m, frozen: m.freeze() == frozen)
    assert (kept == 0) if params.get("store_threshold", 1) > 1 else kept > 200
