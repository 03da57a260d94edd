"""pd-staging timed simulation: outcomes, timers, leaks, determinism, replay."""

from kvsim.app import catalog
from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.trace import read_trace

SPEC = catalog.load().model("pd-staging")


def run(variant="fixed", faults=None, seed=0, **params):
    return simulate_model(SPEC, variant, seed, {"requests": 100, **params}, faults)


def test_fixed_without_faults_every_room_succeeds_and_nothing_leaks():
    s = run().summary
    assert s["outcomes"] == {"Success": 100} and s["violations"] == []
    assert s["leaked_slots"] == 0 and s["held_prefill_rooms"] == 0 and s["worst_time_to_conclude"] < 1.0


def test_pre_fix_decode_radix_hit_overwrites_the_shared_prefix():
    s = run("pre_05c7ebf").summary
    assert any(v.startswith("shared_prefix_rows_unchanged") for v in s["violations"])
    # without a decode radix hit the pre-fix path is clean on this workload
    assert run("pre_05c7ebf", decode_prefix_len=0).summary["violations"] == []


def test_lost_messages_conclude_on_fixed_and_hang_before():
    new = run("fixed", "drop=0.02", seed=1, requests=200).summary
    old = run("pre_05c7ebf", "drop=0.02", seed=1, requests=200).summary
    assert "never concluded" not in new["outcomes"] and new["leaked_slots"] == 0
    assert new["worst_time_to_conclude"] <= 600.0 + 1.0  # waiting timeout, then at most the completion deadline
    assert old["outcomes"]["never concluded"] > 0 and old["leaked_slots"] > 0


def test_prefill_death_fails_open_rooms_by_heartbeat():
    s = run(faults="crash=prefill@2").summary
    assert "never concluded" not in s["outcomes"] and s["outcomes"]["Failed: peer death (heartbeat)"] > 0
    assert s["worst_time_to_conclude"] <= 2 * 5.0 + 5.0 + 1.0 and s["leaked_slots"] == 0


def test_duplicated_chunk_ready_scatters_before_all_writers():
    s = run(faults="duplicate=0.05", requests=200, seed=1).summary
    assert any(v.startswith("scatter_after_all_writers") for v in s["violations"])  # the dup-ready finding
    assert run(faults="duplicate=0.05", requests=200, seed=1, writers=1).summary["violations"] == []


def test_trace_replays_and_is_seeded(tmp_path):
    faults = "delay=0.05:0.2"
    a, b, c = run(faults=faults, seed=3), run(faults=faults, seed=3), run(faults=faults, seed=4)
    assert a.digest == b.digest != c.digest
    path = tmp_path / "staging.jsonl"
    a.recorder.write(str(path))
    assert replay_trace(read_trace(str(path)), SPEC).matches
