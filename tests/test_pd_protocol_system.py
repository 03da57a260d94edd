"""pd-protocol: the room lifecycle transition system, per backend and variant."""

import pytest

from kvsim.app import catalog
from kvsim.engine.explore import explore
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.engine.system import run_actions
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol.system import PdProtocol, ProtocolConfig
from kvsim.models.pd_protocol import rooms as pd_rooms

REG = catalog.load()


def _violations(backend, variant, **kw):
    result = explore(PdProtocol(ProtocolConfig(backend, **kw), variant))
    assert result.bound_hit is None
    return {v.property: v for v in result.violations}


COMMON_RULE_FINDING = {"failed_is_sticky"}  # the open finding sglang-pd-common-failed-not-sticky


@pytest.mark.parametrize("backend, expected", [("mooncake", COMMON_RULE_FINDING), ("nixl", COMMON_RULE_FINDING),
                                               ("mori", set())])
def test_fixed_holds_every_invariant_but_the_common_rule_finding(backend, expected):
    assert set(_violations(backend, "fixed")) == expected


def test_common_rule_finding_is_a_late_transfer_info_after_a_failure():
    v = _violations("mooncake", "fixed")["failed_is_sticky"]
    assert ["bootstrap_timeout", 0] in v.trace and v.trace[-1] == ["deliver_prefill", ["TINFO", 0]]
    assert "got WaitingForInput" in v.message


@pytest.mark.parametrize("backend, expected", [
    ("mooncake", {"no_field_read_before_assignment", "bootstrap_thread_survives_malformed",
                  "decode_thread_survives_malformed"} | COMMON_RULE_FINDING),
    ("nixl", {"bootstrap_thread_survives_malformed", "decode_thread_survives_malformed", "success_is_sticky"}
     | COMMON_RULE_FINDING),
    ("mori", {"peer_death_fails_unfinished_rooms"}),
])
def test_pre_fix_violations_per_backend(backend, expected):
    assert set(_violations(backend, "pre_35281")) == expected


def test_stale_chunk_flips_success_on_nixl_before_only():
    v = _violations("nixl", "pre_35281")["success_is_sticky"]
    actions = [tuple(a) if not isinstance(a[-1], list) else (a[0], tuple(a[1])) for a in v.trace]
    assert ("duplicate_work", 0) in actions and actions[-1] == ("work",)
    # the same interleaving on fixed drops the stale chunk and keeps Success
    fixed = PdProtocol(ProtocolConfig("nixl"), "fixed")
    final = run_actions(fixed, actions)[-1]
    assert final.prefill[0].status == KVPoll.Success and final.prefill[0].succeeded


def test_worker_step_semantics():
    done = pd_rooms.PrefillRoom(KVPoll.Success, False, False, True)
    assert pd_rooms.worker_step(done, True, "nixl", "pre_35281") == (done._replace(status=KVPoll.Failed), "failed_stale")
    for backend in ("mooncake", "nixl", "mori"):
        assert pd_rooms.worker_step(done, True, backend, "fixed") == (done, "dropped")
    cleared = pd_rooms.clear(done)
    # on a cleared room the catch-all's update_status(Failed) creates nothing (absent + Failed)
    assert pd_rooms.worker_step(cleared, True, "nixl", "pre_35281")[0].status is None


def test_mori_heartbeat_and_node_failure():
    assert not pd_rooms.has_heartbeat_checker("mori", "pre_35281") and pd_rooms.has_heartbeat_checker("mori", "fixed")
    decode = (KVPoll.Success, KVPoll.WaitingForInput, KVPoll.Bootstrapping)
    assert pd_rooms.handle_node_failure(decode) == (KVPoll.Success, KVPoll.Failed, KVPoll.Failed)
    v = _violations("mori", "pre_35281")["peer_death_fails_unfinished_rooms"]
    assert v.trace == [["crash_prefill"], ["heartbeat_miss"], ["heartbeat_miss"]]


def test_init_race_and_the_residual_staging_race():
    pre = _violations("mooncake", "pre_35281")["no_field_read_before_assignment"]
    assert pre.trace[0] == ["init", "start_thread"] and "session_state" in pre.message
    assert set(_violations("mooncake", "fixed", staging=False)) == COMMON_RULE_FINDING
    residual = _violations("mooncake", "fixed", staging=True)["no_field_read_before_assignment"]
    assert "staging_ctx" in residual.message and residual.trace[-1] == ["deliver_prefill", ["WATERMARK"]]


def test_two_rooms_fixed_mori_is_clean():
    result = explore(PdProtocol(ProtocolConfig("mori", rooms=2, chunks=1), "fixed"))
    assert result.violations == [] and result.states > 10_000


def test_invariants_can_fail_on_planted_states():
    system = PdProtocol(ProtocolConfig("mooncake"), "fixed")
    s = system.initial_states()[0]
    resurrected = s._replace(prefill=(pd_rooms.PrefillRoom(KVPoll.Transferring, True, True, False),))
    assert "cleared" in dict((i.name, i.check(resurrected)) for i in system.invariants)["no_resurrection"]


def test_stateful_property_per_backend():
    prop = REG.property("pd-protocol", "protocol_invariants")
    assert run_property(prop, "fixed", max_examples=40, seed=0, params={"backend": "mori"}).status == "passed"
    bad = run_property(prop, "pre_35281", max_examples=200, seed=0, params={"backend": "mori"})
    assert bad.status == "failed" and bad.counterexample["invariant"] == "peer_death_fails_unfinished_rooms"


@pytest.mark.parametrize("bug_id", ["sglang-pr35281-stale-work-flips-success", "sglang-pr35281-mori-no-heartbeat",
                                    "sglang-pr35281-init-race", "sglang-pr35281-staging-ctx-race",
                                    "sglang-pd-common-failed-not-sticky"])
def test_bug_reports_hold(bug_id):
    result = reproduce(REG.bug(bug_id))
    assert result.ok and result.reproduced
