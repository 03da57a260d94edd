"""pd-protocol timed simulation: outcomes, the P8 bound, determinism, replay."""

import pytest

from kvsim.app import catalog
from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.trace import read_trace

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
