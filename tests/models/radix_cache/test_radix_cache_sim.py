"""radix-cache's timed simulation (`kvsim simulate radix-cache`): a timing policy over `RadixCacheSystem`.

Its recorded actions replay through the transition system to the driver's state, with every invariant holding on
every state of a run that retracts, with and without speculative decoding (whose pre-#31616 allocation length is
caught at the first verify); each retraction takes the request `retract_decode` pops first; the same seed
gives the same digest under any PYTHONHASHSEED; a planted lock leak in the cache ends the run at the step that
breaks an invariant; bad parameters are one-line errors; the explorer's bound on requests stays three.
"""

import subprocess
import sys

import pytest
from clihelp import kvsim_json
from toys import recorded_actions

from kvsim.app.simulate import simulate_model
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import first_violation, run_actions
from kvsim.models.radix_cache import DESCRIPTOR
from kvsim.models.radix_cache.radix_cache import RadixCache
from kvsim.models.radix_cache.request_loop import RUNNING
from kvsim.models.radix_cache.system import ACTIONS, RadixCacheConfig

# a small workload under pressure: 40 requests, a pool for about three of them at once
PRESSED = {"requests": 40, "num_pages": 40, "arrival_rate": 40.0}


def test_invariants_hold_along_a_run_that_retracts():
    result = simulate_model(DESCRIPTOR, "fixed", 0, PRESSED)
    summary = result.summary
    assert summary["violations"] == [] and summary["finished"] == 40 and result.complete
    assert summary["retractions"] > 0 and summary["deferrals"] > 0 and summary["free_pages_min"] == 0
    assert 0 < summary["hit_rate"] < 1 and summary["prefill_steps"] > 0 and summary["decode_steps"] > 0
    recorded = recorded_actions(result, ACTIONS)
    assert recorded == result.driver.actions and {a[0] for a in recorded} == {"admit", "decode", "retract"}
    states = run_actions(result.driver.system, recorded)
    assert states[-1] == result.driver.state
    for i, state in enumerate(states):
        assert first_violation(result.driver.system, state) is None, (i, recorded[i - 1] if i else None)
    system = result.driver.system
    retracted = 0
    for state, action in zip(states, recorded):
        if action[0] != "retract":
            continue
        retracted += 1
        running = [r for r, req in enumerate(state.requests) if req.status == RUNNING]
        allowed = [r for r in running if ("retract", r) in [tuple(a) for a in system.enabled(state)]]
        fewest = min(len(state.requests[r].output_ids) for r in allowed)
        assert len(state.requests[action.req].output_ids) == fewest, (action, allowed)
        assert len(running) >= 2  # retract_decode keeps one request
    assert retracted == summary["retractions"]


def test_speculative_decoding_runs_clean_on_fixed_and_pre_31616_is_caught_at_the_first_verify():
    params = {**PRESSED, "num_draft_tokens": 3, "page_size": 4}
    result = simulate_model(DESCRIPTOR, "fixed", 0, params)
    summary = result.summary
    assert summary["violations"] == [] and summary["finished"] == 40 and summary["retractions"] > 0
    assert 1 < summary["accepted_per_verify"] < 3
    recorded = recorded_actions(result, ACTIONS)
    assert {a[0] for a in recorded} == {"admit", "verify", "retract"}
    assert {a.accepted for a in recorded if a[0] == "verify"} == {1, 2, 3}
    assert run_actions(result.driver.system, recorded)[-1] == result.driver.state
    bad = simulate_model(DESCRIPTOR, "pre_31616", 0, params)
    assert bad.summary["crashed"] and bad.summary["violations"][0].startswith("kv_allocated_whole_pages: request ")
    verifies = [a for a in recorded_actions(bad, ACTIONS) if a[0] == "verify"]
    assert len(verifies) == 1  # the first verify's unaligned allocation length


def test_same_seed_same_digest_under_any_hash_seed():
    digests = {kvsim_json("simulate", "radix-cache", "--seed", "3", "--param", "requests=30", "--param",
                          "num_pages=30", env={"PYTHONHASHSEED": h})["digest"] for h in ("0", "1")}
    params = {"requests": 30, "num_pages": 30}
    assert digests == {simulate_model(DESCRIPTOR, "fixed", 3, params).digest}
    assert simulate_model(DESCRIPTOR, "fixed", 4, params).digest not in digests


def test_a_lock_leak_ends_the_run_at_the_step_that_breaks_an_invariant(monkeypatch):
    """A planted regression: `dec_lock_ref` that leaves the counts (a lock never released)."""
    monkeypatch.setattr(RadixCache, "dec_lock_ref", lambda self, node: 0)
    result = simulate_model(DESCRIPTOR, "fixed", 0, PRESSED)
    summary = result.summary
    assert summary["crashed"] and len(summary["violations"]) == 1 and summary["finished"] < 40
    assert summary["violations"][0].startswith("lock_refs: ")
    assert result.recorder.steps[-1]["event"] == "crash"


@pytest.mark.parametrize("param,expected", [
    ("shared=40", "param shared: expected at most prompt_len (32), got 40"),
    ("requests=0", "param requests: expected an integer (>= 1 and <= 20000), got 0"),
])
def test_bad_params_are_one_line_errors(param, expected):
    with pytest.raises(ConfigError) as err:
        simulate_model(DESCRIPTOR, "fixed", 0, [param])
    assert str(err.value) == expected


def test_the_cli_prints_a_pool_too_small_on_one_line():
    out = subprocess.run([sys.executable, "-m", "kvsim", "simulate", "radix-cache", "--param", "num_pages=8"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["kvsim: error: --param num_pages: expected room for a request's longest input "
                                       "(47 tokens) and the page the scheduler's demand adds (or its drafts' reserve): 13 pages or "
                                       "more, got 8"]


def test_the_explorer_keeps_its_three_requests():
    with pytest.raises(ConfigError, match="one to 3 requests"):
        RadixCacheConfig(prompts=(0, 1, 0, 1))
