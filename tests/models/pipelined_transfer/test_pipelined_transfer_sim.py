"""pipelined-transfer: the timed simulation (research note section 1.10) against its closed form and bounds."""

import os
import subprocess
import sys

import pytest

from kvsim.app import catalog
from kvsim.app.simulate import simulate_model
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.runner import run_property
from kvsim.engine.sim import FaultPlan
from kvsim.engine.system import run_actions
from kvsim.models.pipelined_transfer import DESCRIPTOR
from kvsim.models.pipelined_transfer import sim as pt_sim
from kvsim.models.pipelined_transfer.timing import exposed_by_recursion, exposed_closed_form
from kvsim.models.pipelined_transfer.variants import FIXED
from kvsim.properties.pipelined_transfer import timing as timing_props

REG = catalog.load()
MB_8192_FP8 = 8192 * 35136  # DeepSeek-V3 MLA, FP8: 61 layers x 576 values per token


def run(params=(), faults=None, seed=0):
    return simulate_model(DESCRIPTOR, "fixed", seed, list(params), faults)


def test_closed_form_pinned_examples():
    # every t_j <= p_{j+1}: only the final transfer is exposed (the PR's claim)
    assert exposed_closed_form([1.0, 2.0, 3.0], [0.5, 0.5, 0.25]) == 0.25
    # a backlog: t_j > p_{j+1}
    assert exposed_closed_form([1.0, 2.0, 3.0], [2.0, 2.0, 1.0]) == 3.0
    assert exposed_by_recursion([1.0, 2.0, 3.0], [2.0, 2.0, 1.0], 0.1) == pytest.approx(3.0)


def test_deepseek_sizes_from_the_research_note():
    """8192 tokens x 35,136 B in FP8 is ~288 MB: ~5.8 ms at 50 GB/s, ~23 ms at 12.5 GB/s (plus L)."""
    assert MB_8192_FP8 == 287_834_112
    result = run(["requests=1"])
    row = result.summary["per_request"][0]
    assert row["baseline_exposed"] == pytest.approx(10e-6 + MB_8192_FP8 / 50e9, abs=1e-12)
    assert row["exposed"] == pytest.approx(10e-6 + MB_8192_FP8 / 4 / 50e9, abs=1e-12)  # t_N: the last quarter
    slow = run(["requests=1", "bandwidth_gbs=12.5"]).summary["per_request"][0]
    assert slow["baseline_exposed"] == pytest.approx(10e-6 + 0.023026729, abs=1e-9)


def test_swa_window_bytes_move_into_the_final_transfer():
    """A 4096-token window group (half the bytes per token): 64 window blocks ride with the final slice."""
    row = run(["requests=1", "swa_window=4096"]).summary["per_request"][0]
    per_block = 64 * 35136 / 50e9
    assert row["exposed"] == pytest.approx(10e-6 + (32 * 0.5 + 64 * 0.5) * per_block, abs=1e-12)
    assert row["baseline_exposed"] == pytest.approx(10e-6 + (128 * 0.5 + 64 * 0.5) * per_block, abs=1e-12)


def test_default_run_checks_every_request_against_the_closed_form():
    s = run().summary
    assert s["violations"] == [] and s["completed"] == s["requests"] == s["closed_form_checked"]
    assert s["closed_form_worst_error_s"] < 1e-12
    assert s["mean_exposed_s"] < s["mean_baseline_exposed_s"]


def test_backlog_and_tiny_prefill():
    backlog = run(["requests=1", "bandwidth_gbs=5", "compute_us_per_token=0.05"]).summary
    row = backlog["per_request"][0]
    assert backlog["violations"] == [] and row["exposed"] > 10e-6 + MB_8192_FP8 / 4 / 5e9 * 1.5  # more than t_N
    # prefill nearly free: pipelining pays L per transfer and loses to the baseline, by at most (N-1) L
    tiny = run(["requests=1", "compute_us_per_token=0.000001", "context_slowdown=0", "latency_us=1000"]).summary
    r = tiny["per_request"][0]
    assert tiny["violations"] == [] and 0 < r["unblocked"] - r["baseline_unblocked"] <= 3 * 1000e-6 + 1e-12


def test_many_requests_share_the_nic():
    s = run(["requests=60", "arrival_rate=400", "ranks=2", "boundary=B", "chunk_tokens=1000", "bandwidth_gbs=2",
             "prefix_hit=500", "rx_cached_blocks=2"]).summary
    assert s["violations"] == [] and s["completed"] == 60
    shared = [r for r in s["per_request"] if not r["free_link"]]
    assert shared and all("closed_form" not in r for r in shared)  # the closed form is for a free link only


def test_recorded_actions_replay_to_the_drivers_state():
    result = run(["requests=20", "arrival_rate=200", "ranks=2"], faults="drop=0.05,duplicate=0.05")
    driver = result.driver
    assert run_actions(driver.system, driver.actions)[-1] == driver.state


def test_same_seed_same_digest_under_any_hash_seed():
    code = ("from kvsim.app.simulate import simulate_model; from kvsim.models.pipelined_transfer import DESCRIPTOR;"
            "print(simulate_model(DESCRIPTOR, 'fixed', 3, ['requests=10'], 'drop=0.1').digest)")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": h}).stdout for h in ("0", "1")}
    assert len(digests) == 1 and run(["requests=10"], "drop=0.1", seed=3).digest == digests.pop().strip()


def test_faults_end_as_stalls_or_waiting_receivers():
    crashed = run(["requests=10", "timeout_s=1"], faults="crash=receiver@1.5").summary
    assert crashed["stalled"] > 0 and crashed["violations"] == []
    dropped = run(["requests=40"], faults="drop=0.2").summary
    assert dropped["waiting_receivers"] > 0  # #17665: a lost notification leaves the receiver waiting


def test_bad_fault_kinds_are_refused():
    with pytest.raises(ConfigError, match="faults"):
        run(faults="reorder=0.1")
    with pytest.raises(ConfigError, match="crash"):
        run(faults="crash=sender@1")


@pytest.mark.parametrize("name", ["max_plus_closed_form_is_the_recursion", "simulation_matches_closed_form"])
def test_timing_properties_pass(name):
    result = run_property(REG.property("pipelined-transfer", name), FIXED, max_examples=25, seed=0)
    assert result.status == "passed", result.message


def test_simulation_property_fails_on_a_planted_closed_form(monkeypatch):
    monkeypatch.setattr(pt_sim, "exposed_closed_form", lambda ends, ts: ts[-1])  # the PR's claim, always
    case = timing_props.WorkloadCase(pt_sim.SimConfig(requests=1, bandwidth_gbs=5, compute_us_per_token=0.05), 0)
    with pytest.raises(PropertyViolation, match="closed form"):
        timing_props.simulation_matches_closed_form(case, FIXED)


def test_max_plus_property_fails_on_a_planted_recursion(monkeypatch):
    monkeypatch.setattr(timing_props, "exposed_by_recursion", lambda ends, ts, h: ts[-1])
    with pytest.raises(PropertyViolation, match="closed form"):
        timing_props.max_plus_closed_form_is_the_recursion(
            timing_props.MaxPlusCase((1.0, 1.0), (3.0, 1.0), 0.0), FIXED)
    assert FaultPlan.parse("drop=0.1").kinds == ("drop",)


def test_the_workload_holds_its_chunk_costs_once_and_each_request_reads_them_scaled(monkeypatch):
    """Every request reads the one list of unscaled chunk costs times its jitter factor (5,000 requests of 131,072
    one-token chunks each held their own, 655 M floats): the same floats as a cost computed with the factor last,
    so the same digests."""
    made = []
    real = pt_sim.chunk_costs
    monkeypatch.setattr(pt_sim, "chunk_costs", lambda params: made.append(params) or real(params))
    result = simulate_model(DESCRIPTOR, "fixed", 0, {"requests": 30, "chunk_tokens": 512})
    assert len(made) == 1 and result.complete and result.summary["per_request"][29]["chunks"] == len(real(made[0]))
    params = made[0]
    for scale in (0.9, 1.0, 1.0731):
        scaled = pt_sim.Scaled(real(params), scale)
        chunks = pt_sim.prefill_chunks(params.prompt_len, params.prefix_hit, params.chunk_tokens)
        expected = [(end - start) * params.compute_us_per_token * pt_sim.US
                    * (1 + params.context_slowdown * mid / 1000) * scale
                    for start, end, mid in ((s, e, (s + e) / 2) for s, e in chunks)]
        assert [scaled[i] for i in range(len(scaled))] == list(scaled) == expected and len(expected) > 10


def test_the_baseline_sums_the_costs_of_the_requests_it_reaches_only(monkeypatch):
    """The baseline's one chunk a request is the sum of its costs, taken when the baseline first reads it: a run
    an event budget ends sums a few (every request's sum was taken before the first event)."""
    summed = []
    real = pt_sim.Total.__getitem__
    monkeypatch.setattr(pt_sim.Total, "__getitem__", lambda self, i: (summed.append(self.total is None),
                                                                        real(self, i))[1])
    result = simulate_model(DESCRIPTOR, "fixed", 0, {"requests": 200, "chunk_tokens": 512}, max_events=60)
    assert not result.complete and 0 < summed.count(True) < 20
    costs = pt_sim.Scaled(pt_sim.chunk_costs(pt_sim.SimConfig()), 1.0731)
    total = pt_sim.Total(costs)
    assert len(total) == 1 and total[0] == total[-1] == sum(list(costs)) and total.total is not None
    with pytest.raises(IndexError):
        total[1]


def test_a_workload_past_the_cells_a_state_holds_is_a_one_line_error():
    """requests x ranks x destination cells past `MAX_CELLS` is refused before anything is built (5,000 requests of
    131,072 one-token blocks on 8 ranks built for minutes and took gigabytes); the most it holds is accepted."""
    from kvsim.models.pipelined_transfer.config import MAX_CELLS

    most = {"ranks": 8, "prompt_len": 131072, "tokens_per_block": 1, "chunk_tokens": 131072 // 4}
    fits = MAX_CELLS // (8 * 131072)
    with pytest.raises(ConfigError) as err:
        pt_sim.model_config(DESCRIPTOR.build_sim_config({**most, "requests": fits + 1}), FaultPlan())
    assert str(err.value) == (f"param requests: expected at most {fits} requests of 1048576 destination cells (8 ranks "
                              f"x 131072: a state holds at most {MAX_CELLS} cells), got {fits + 1}")
    assert pt_sim.model_config(DESCRIPTOR.build_sim_config({**most, "requests": fits}), FaultPlan()).requests == fits
