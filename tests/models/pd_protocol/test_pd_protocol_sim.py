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


# digests and event counts of the timed simulation before it was made cheaper per step (a per-room tree, one
# state rebuild per step, bisection in the bags): making it faster must not change what it computes
PINS = {
    'mooncake/fixed/None/0': ('8f3bff61b4583d817670e081f5e270df789d88600e7c87b1e73438e4e95f73d7', 2615),
    'mooncake/fixed/drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02/1': ('9affac7ca4b4f6df6ad6cb0a1ef3fae87c1a4b42580e0021ac9d25ae6eab1dba', 2643),
    'mooncake/fixed/drop=0.01,garble=0.01,crash=prefill@30/0': ('fd39f2f77406abb3d80a4916467de69c52eaf441d602b5d2ff880c002f248174', 1437),
    'mooncake/pre_35281/None/0': ('06b4bcf75ce8a5f5c9d9bf4df0ba4bfd65b06bd345364738a779a56c8ea6c9ac', 2615),
    'mooncake/pre_35281/drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02/1': ('44a1702bd22d476ccb73892d2c172e38eab24a0af692a31aff7fbdfb1eafd994', 1900),
    'mooncake/pre_35281/drop=0.01,garble=0.01,crash=prefill@30/0': ('3a861eb9a919d1fd4f10e78e00375008db1a669368a6aef109213ff0265d7cf2', 1275),
    'nixl/fixed/None/0': ('474f1d7eccaf25eab701991c7fae8e7e1a2d54fb51ecda64ede1ff71c8c7cc34', 2615),
    'nixl/fixed/drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02/1': ('b174706f53214cd60e1cdfa394b8f8d2c866ad0b4583bc0f939b5be31ebf9fa9', 2643),
    'nixl/fixed/drop=0.01,garble=0.01,crash=prefill@30/0': ('0a76d41875491a3d9b515a3923a9bbf61b134c3d9bb79b243f8e203e4d6e6a30', 1437),
    'nixl/pre_35281/None/0': ('402e5569d0577144803fc00959d9d859dcd2c8b97c39b0338c035e83b3a9870e', 2615),
    'nixl/pre_35281/drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02/1': ('012f6b6315af19726f0b4d9f29f8629c8f6cae957ea43979112761d65a278bee', 1900),
    'nixl/pre_35281/drop=0.01,garble=0.01,crash=prefill@30/0': ('7c60051aa00d89b64f45274acd3db0036c9813ab185e235e36297282dbf0e539', 1275),
    'mori/fixed/None/0': ('5571ed808ff99e1bb986dc61dfeb545d25fc5f969ea194fd9dfb9093ad03db5f', 2615),
    'mori/fixed/drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02/1': ('8718b789944d973d8d51afe8e19867e4cd86679d12540ecfde78dbfc63b79d08', 2643),
    'mori/fixed/drop=0.01,garble=0.01,crash=prefill@30/0': ('9cfcd1f8cf47972603abff9d7966879fb963531d536507b646383b167e31dfac', 1437),
    'mori/pre_35281/None/0': ('e39259ca969485965a5e756f6969cc41b09d9f8b88888730e4084cb8ff6b18c3', 2615),
    'mori/pre_35281/drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02/1': ('a21661f58ae2745617f159083c9e3f6e4bb62429a5ddb1135cbfdde9991a2cd2', 2643),
    'mori/pre_35281/drop=0.01,garble=0.01,crash=prefill@30/0': ('9182c702810d32f7a495e5274f04345cba9fa17bf69af8d128618aeadd689188', 1834),
}


@pytest.mark.parametrize("backend", ["mooncake", "nixl", "mori"])
@pytest.mark.parametrize("variant", ["fixed", "pre_35281"])
def test_digests_are_pinned(backend, variant):
    for faults, seed in ((None, 0), ("drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02", 1),
                         ("drop=0.01,garble=0.01,crash=prefill@30", 0)):
        r = simulate_model(SPEC, variant, seed, {"backend": backend, "requests": 200}, faults)
        assert (r.recorder.digest(), r.events) == tuple(PINS[f"{backend}/{variant}/{faults}/{seed}"])
