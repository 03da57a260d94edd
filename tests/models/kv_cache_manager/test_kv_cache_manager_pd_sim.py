"""kv-cache-manager-pd's timed simulation (`kvsim simulate kv-cache-manager-pd`): a timing policy over
`ProducerSchedulerSystem`.

Its recorded actions replay through the transition system (each enabled where it was taken) to the driver's state,
with every invariant holding on every state of a `fixed` run that preempts producers with their final step in
flight; the same seeded workload on `pre_50297` finishes such a producer with no blocks, reported with its time; on
`pre_55055` with an MTP drafter the first hand-off carries draft KV; the explorer's bound on requests stays three.
Same seed, same digest under any PYTHONHASHSEED, and bad parameters as one-line errors: `test_kv_cache_manager_sim`,
parametrized over both simulations of the package.
"""

import pytest
from toys import recorded_actions

from kvsim.app.simulate import simulate_model
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import first_violation, run_actions
from kvsim.models.kv_cache_manager import PD_DESCRIPTOR
from kvsim.models.kv_cache_manager.scheduler import ACTIONS, DONE, ProducerSchedulerConfig

WORKLOAD = {"requests": 60}  # the defaults' pool (23 usable blocks) is under pressure at 40 arrivals per second


def _recorded(result):
    return recorded_actions(result, ACTIONS)


def test_invariants_hold_along_a_run_that_preempts_in_flight_producers_on_fixed():
    result = simulate_model(PD_DESCRIPTOR, "fixed", 0, WORKLOAD)
    s = result.summary
    assert s["violations"] == [] and s["violation_time"] is None and result.complete
    assert s["done"] == 60 and s["handed_off"] == s["delivered"] == s["producers"] == 25
    # the race's window is reached: preempted with an output in flight, the stale output dropped (#50297's fix)
    assert s["preempted_in_flight"] == s["dropped_outputs"] == 7
    assert s["awaiting_delivery_peak"] == 8 and s["free_blocks_min"] == 0
    recorded = _recorded(result)
    assert recorded == result.driver.actions
    assert {a[0] for a in recorded} == {"schedule", "decode", "output", "preempt", "deliver"}
    system = result.driver.system
    states = run_actions(system, recorded)
    assert states[-1] == result.driver.state
    for i, state in enumerate(states):
        assert first_violation(system, state) is None, (i, recorded[i - 1] if i else None)
    assert all(r.status == DONE for r in states[-1].requests)


def test_the_pre_50297_race_shows_up_in_the_seeded_workload():
    result = simulate_model(PD_DESCRIPTOR, "pre_50297", 0, WORKLOAD)
    s = result.summary
    assert s["violation_time"] == pytest.approx(1.44) and len(s["violations"]) == 1
    assert s["violations"][0].startswith("finished_into_producer_owns_blocks: request 24 finished into the producing "
                                         "connector: request_finished got [], expected the 4 block(s)")
    assert s["dropped_outputs"] == 0 and s["preempted_in_flight"] == 4 and s["done"] < s["requests"]
    states = run_actions(result.driver.system, _recorded(result))
    assert states[-1] == result.driver.state
    assert first_violation(result.driver.system, states[-1])[0] == "finished_into_producer_owns_blocks"
    assert all(first_violation(result.driver.system, state) is None for state in states[:-2])


def test_the_pre_55055_draft_kv_is_handed_with_an_mtp_drafter():
    params = {**WORKLOAD, "mtp_lookahead": 3}
    s = simulate_model(PD_DESCRIPTOR, "pre_55055", 0, params).summary
    assert s["violations"][0].startswith("no_unverified_draft_kv_handed: request 2 hands the KV of 16 of its 16 "
                                         "prompt tokens")
    assert s["handed_off"] == 1
    assert simulate_model(PD_DESCRIPTOR, "fixed", 0, params).summary["violations"] == []


def test_the_explorer_keeps_its_three_requests():
    with pytest.raises(ConfigError, match="one to 3 requests in all"):
        ProducerSchedulerConfig(producers=3, local=1)
