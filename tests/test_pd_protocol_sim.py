"""pd-protocol timed simulation: outcomes, the P8 bound, determinism, replay."""

import pytest

from kvsim.app import catalog
from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.actions import decode
from kvsim.engine.system import run_actions
from kvsim.engine.trace import read_trace
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol import VARIANTS
from kvsim.models.pd_protocol.actions import ACTIONS
from kvsim.models.pd_protocol.sim import system_for

SPEC = catalog.load().model("pd-protocol")
CRASH = "drop=0.01,garble=0.01,duplicate=0.02,reorder=0.05,crash=prefill@20"


def run(backend, variant, faults, requests=100, seed=0):
    return simulate_model(SPEC, variant, seed, {"backend": backend, "requests": requests}, faults)


@pytest.mark.parametrize("backend", ["mooncake", "nixl", "mori"])
def test_fixed_meets_p8_under_faults_and_a_prefill_death(backend):
    result = run(backend, "fixed", CRASH)
    s = result.summary
    assert s["violations"] == [] and s["rooms"] == 100 and s["rooms_past_bound"] == 0
    assert sum(s["outcomes"].values()) == 100 and "never concluded" not in s["outcomes"]
    assert s["worst_time_to_conclude"] <= 300.0


def test_mori_without_heartbeat_waits_the_full_timeout():
    s = run("mori", "pre_35281", CRASH).summary
    assert s["violations"][0].startswith("P8:") and s["worst_time_to_conclude"] == pytest.approx(300.0)
    assert s["rooms_past_bound"] > 0 and "Failed: peer death (heartbeat)" not in s["outcomes"]


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_one_garbled_frame_stalls_every_later_room_before_the_fix(backend):
    old = run(backend, "pre_35281", "garble=0.02").summary
    new = run(backend, "fixed", "garble=0.02").summary
    assert any(v.startswith("P3/P7") for v in old["violations"]) and new["violations"] == []
    assert old["outcomes"]["Failed: waiting timeout"] > 10 * new["outcomes"].get("Failed: waiting timeout", 1)


def test_trace_replays_and_is_seeded(tmp_path):
    a, b, c = run("nixl", "fixed", CRASH, seed=3), run("nixl", "fixed", CRASH, seed=3), run("nixl", "fixed", CRASH, seed=4)
    assert a.digest == b.digest != c.digest
    path = tmp_path / "pd.jsonl"
    a.recorder.write(str(path))
    assert replay_trace(read_trace(str(path)), SPEC).matches


@pytest.mark.parametrize("backend", ["mooncake", "nixl", "mori"])
@pytest.mark.parametrize("variant, faults", [
    ("fixed", None),
    ("fixed", CRASH),
    ("pre_35281", "drop=0.01,garble=0.01,crash=prefill@30"),
    ("pre_35281", "duplicate=0.05,reorder=0.1,delay=0.1:0.5,garble=0.02"),
])
def test_recorded_actions_replay_to_the_drivers_state(tmp_path, backend, variant, faults):
    """The actions in the trace, decoded and replayed through `run_actions` on the same system, reach the
    state the simulation's driver ended in: the simulation changed the model only through its actions."""
    result = run(backend, variant, faults, requests=60, seed=5)
    path = tmp_path / "pd.jsonl"
    result.recorder.write(str(path))
    steps = read_trace(str(path)).steps
    actions = [decode(step["data"], ACTIONS) for step in steps if step["event"] == "action"]
    assert actions == result.driver.actions and len(actions) > 300
    system = system_for(VARIANTS[variant], SPEC.build_sim_config({"backend": backend, "requests": 60}))
    final = run_actions(system, actions)[-1]
    assert final == result.driver.state
    # and the summary's outcomes are the model's: every concluded room is terminal in the final state
    assert sum(1 for d in final.decode if d in (KVPoll.Success, KVPoll.Failed)) >= \
        sum(n for o, n in result.summary["outcomes"].items() if o != "never concluded")
