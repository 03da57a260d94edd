"""kv-offload simulation: deterministic, a timing policy over the transition system (its recorded actions
replay through `run_actions`), its trace replays, and LRU and ARC see the same stream."""

import pytest

from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.system import run_actions
from kvsim.engine.trace import read_trace
from kvsim.models.kv_offload import DESCRIPTOR
from kvsim.models.kv_offload.sim import trace_actions


@pytest.mark.parametrize("policy, variant, seed", [("lru", "fixed", 0), ("arc", "fixed", 3),
                                                   ("lru", "pre_already_stored_fix", 5)])
def test_simulation_actions_replay_through_the_transition_system(policy, variant, seed):
    result = simulate_model(DESCRIPTOR, variant, seed, {"requests": 60, "num_chunks": 12, "cache_policy": policy,
                                                        "store_failure_rate": 0.1})
    recorded = trace_actions(result.recorder.steps)
    assert recorded == result.driver.actions and len(recorded) > 3 * 60
    states = run_actions(result.driver.system, recorded)
    assert states[-1] == result.driver.state
    assert result.summary["violations"] == [] and result.summary["failed_stores"] > 0


def test_same_seed_same_run_and_the_trace_replays(tmp_path):
    params = {"requests": 80, "num_chunks": 16}
    a, b = simulate_model(DESCRIPTOR, "fixed", 7, params), simulate_model(DESCRIPTOR, "fixed", 7, params)
    assert a.summary == b.summary and a.recorder.digest() == b.recorder.digest()
    path = tmp_path / "offload.jsonl"
    a.recorder.write(str(path))
    replayed = replay_trace(read_trace(str(path)), DESCRIPTOR)
    assert replayed.matches and replayed.digest == a.recorder.digest()


def test_lru_and_arc_see_the_same_stream():
    runs = {p: simulate_model(DESCRIPTOR, "fixed", 1, {"cache_policy": p}).summary for p in ("lru", "arc")}
    assert runs["lru"]["chunks_offered"] == runs["arc"]["chunks_offered"] == 899
    for s in runs.values():
        assert 0 < s["chunk_hits"] < s["chunks_offered"] and s["evictions"] > 0 and s["violations"] == []
        assert s["hit_rate"] == round(s["chunk_hits"] / s["chunks_offered"], 6)
        assert 0 < s["peak_pending_writes"] <= 32


def test_a_cache_with_no_slots_stores_nothing_and_hits_nothing():
    s = simulate_model(DESCRIPTOR, "fixed", 2, {"requests": 30, "num_chunks": 0}).summary
    assert s["chunk_hits"] == s["chunks_stored"] == s["evictions"] == 0 and s["refused_stores"] == 30
