"""pd-staging timed simulation: outcomes, timers, leaks, determinism, replay, and the actions it took."""

import json

import pytest

from kvsim.app import catalog
from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import run_actions
from kvsim.engine.trace import read_trace
from kvsim.models.pd_staging import DESCRIPTOR
from kvsim.models.pd_staging.sim import trace_actions

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


# -- what the simulation advertises it accepts -----------------------------------------------------------

@pytest.mark.parametrize("writers", [4, DESCRIPTOR.sim_config.__dataclass_fields__["writers"].default])
def test_every_advertised_writer_count_simulates(writers):
    """`--param writers=4` was advertised (1..8) and refused (<= 2): the bound is now written once."""
    spec = next(s for s in SPEC.sim_params if s.name == "writers")
    assert spec.minimum <= writers <= spec.maximum
    s = run(writers=writers, requests=30).summary
    assert s["outcomes"] == {"Success": 30} and s["violations"] == []


def test_largest_advertised_writer_count_simulates():
    top = next(s for s in SPEC.sim_params if s.name == "writers").maximum
    s = simulate_model(SPEC, "fixed", 0, [f"writers={top}", "requests=10"]).summary
    assert s["outcomes"] == {"Success": 10} and s["violations"] == []
    with pytest.raises(ConfigError, match="writers"):
        simulate_model(SPEC, "fixed", 0, [f"writers={top + 1}"])


def test_every_numeric_param_has_a_maximum():
    for spec in SPEC.params + SPEC.sim_params:
        if spec.kind in ("int", "float", "ints"):
            assert spec.maximum is not None, spec.name


# -- the simulation is a timing policy: its recorded actions replay through the transition system ---------

@pytest.mark.parametrize("variant, seed, faults", [
    ("fixed", 0, None),
    ("fixed", 3, "drop=0.02,delay=0.1:0.5,duplicate=0.02"),
    ("pre_05c7ebf", 1, "drop=0.05,reorder=0.1"),
    ("fixed", 2, "duplicate=0.05,crash=prefill@1.5"),
    ("sglang_0_5_23", 3, "drop=0.02,delay=0.1:0.5,duplicate=0.02"),  # frees that empty the ring start a fresh round
])
def test_recorded_actions_replay_to_the_drivers_state(variant, seed, faults):
    result = run(variant, faults, seed, requests=25)
    steps = [json.loads(line) for line in result.recorder.lines()[1:-1]]  # through JSON, as a trace file holds them
    actions = trace_actions(steps)
    assert actions == result.driver.actions and len(actions) > 100
    assert type(actions[0]) is type(result.driver.actions[0])  # decoded to the typed record, not a plain tuple
    states = run_actions(result.driver.system, actions)
    assert states[-1] == result.driver.state
