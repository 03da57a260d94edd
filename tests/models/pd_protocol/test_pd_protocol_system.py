"""pd-protocol: the room lifecycle transition system, per backend and variant."""

import pytest

from kvsim.engine.actions import decode
from kvsim.engine.canon import to_jsonable

from kvsim.app import catalog
from kvsim.engine.explore import explore
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.engine.system import run_actions
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol import FIXED, VARIANTS
from kvsim.models.pd_protocol import rooms as pd_rooms
from kvsim.models.pd_protocol.actions import (ACTIONS, Concluded, CrashPrefill, DecodeInit, DeliverPrefill,
                                              DuplicateWork, HeartbeatMiss, Init, PrefillDied, Queued, Sent,
                                              Tinfo, Work)
from kvsim.models.pd_protocol.config import ProtocolConfig
from kvsim.models.pd_protocol.system import RULES, PdProtocol

REG = catalog.load()
PRE = VARIANTS["pre_35281"]


def _violations(backend, variant, **kw):
    result = explore(PdProtocol(ProtocolConfig(backend, **kw), VARIANTS[variant]))
    assert result.bound_hit is None
    return {v.property: v for v in result.violations}


COMMON_RULE_FINDING = {"failed_is_sticky"}  # sglang-pd-common-failed-not-sticky (fixed upstream in 0.5.20)


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
    actions = decode(v.trace, ACTIONS)
    assert DuplicateWork(0) in actions and actions[-1] == Work() and isinstance(actions[-1], Work)
    # the same interleaving on fixed drops the stale chunk and keeps Success
    fixed = PdProtocol(ProtocolConfig("nixl"), FIXED)
    final = run_actions(fixed, actions)[-1]
    assert final.prefill[0].status == KVPoll.Success and final.prefill[0].succeeded


def test_worker_step_semantics():
    done = pd_rooms.PrefillRoom(KVPoll.Success, False, False, True)
    assert pd_rooms.worker_step(done, True, "nixl", PRE) == (done._replace(status=KVPoll.Failed), "failed_stale")
    for backend in ("mooncake", "nixl", "mori"):
        assert pd_rooms.worker_step(done, True, backend, FIXED) == (done, "dropped")
    cleared = pd_rooms.clear(done)
    # on a cleared room the catch-all's update_status(Failed) creates nothing (absent + Failed)
    assert pd_rooms.worker_step(cleared, True, "nixl", PRE)[0].status is None


def test_mori_heartbeat_and_node_failure():
    assert not pd_rooms.has_heartbeat_checker("mori", PRE) and pd_rooms.has_heartbeat_checker("mori", FIXED)
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
    result = explore(PdProtocol(ProtocolConfig("mori", rooms=2, chunks=1), FIXED))
    assert result.violations == [] and result.states > 10_000


def test_invariants_can_fail_on_planted_states():
    system = PdProtocol(ProtocolConfig("mooncake"), FIXED)
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


@pytest.mark.parametrize("backend", ["mooncake", "nixl", "mori"])
@pytest.mark.parametrize("variant", ["fixed", "pre_35281"])
def test_allows_is_membership_in_enabled(backend, variant):
    system = PdProtocol(ProtocolConfig(backend, rooms=2, chunks=1, faults=2), VARIANTS[variant])
    actions, wrong = RULES.disagreements(system, limit=3000)
    assert len(actions) > 20
    assert not wrong


def test_transition_reports_what_the_step_did():
    system = PdProtocol(ProtocolConfig("mori", rooms=2), FIXED)
    s = system.initial_states()[0]
    s, fx = system.transition(s, DecodeInit(1))
    assert [e.tag for e in fx] == ["sent", "sent"] and fx[-1] == Sent("prefill", Tinfo(1))
    for step in system.init:
        s, fx = system.transition(s, Init(step))
    s, fx = system.transition(s, DeliverPrefill(Tinfo(1)))
    s, fx = system.transition(s, ("enqueue", 1))
    assert fx == (Queued(1, 0),)
    s, fx = system.transition(s, CrashPrefill())
    assert fx == (PrefillDied(),) and s.peer_dead and s.queue == ()
    s, _ = system.transition(s, HeartbeatMiss())
    s, fx = system.transition(s, HeartbeatMiss())
    assert set(fx) == {Concluded(0, KVPoll.Failed, "peer death (heartbeat)"),
                       Concluded(1, KVPoll.Failed, "peer death (heartbeat)")}
    assert system.step(system.initial_states()[0], DecodeInit(1)) == system.transition(
        system.initial_states()[0], DecodeInit(1))[0]


def test_actions_round_trip_through_json():
    actions, _ = RULES.disagreements(PdProtocol(ProtocolConfig("nixl", rooms=2, chunks=1, faults=2), PRE), limit=500)
    for a in actions:
        back = decode(to_jsonable(a), ACTIONS)
        assert back == a and type(back) is type(a) and to_jsonable(back) == to_jsonable(a)


def test_unbounded_fault_budget_never_runs_out():
    system = PdProtocol(ProtocolConfig("mooncake", faults=-1), FIXED)
    s = system.initial_states()[0]
    for _ in range(5):
        s = system.step(s, ("garbage", "decode"))
    assert s.faults_left == -1 and ("garbage", "decode") in system.enabled(s)
    assert len(s.to_decode) == 5


@pytest.mark.parametrize("flag", sorted(FIXED.flags()))
def test_each_flag_alone_changes_something(flag):
    """Every flag of ProtocolVariant is read: turning it off alone, on the newest record that has it, changes a result."""
    import dataclasses

    from kvsim.models.pd_protocol.mori_layout import LayoutCase, chosen_descriptors
    from kvsim.models.pd_protocol.wire import encode_abort, handle_bootstrap, handle_decode, status_update

    base = FIXED if FIXED.flags()[flag] else VARIANTS["sglang_0_5_23"]  # the flags of releases after the PR
    assert base.flags()[flag] is True
    off = dataclasses.replace(base, name="probe", **{flag: False})
    probes = [lambda v, b=b: explore(PdProtocol(ProtocolConfig(b), v)).violations for b in ("mooncake", "nixl", "mori")]
    probes += [lambda v, b=b, f=f: handle_bootstrap(f, {1: KVPoll.Transferring}, b, v)
               for b in ("mooncake", "nixl", "mori") for f in ((), encode_abort(1))]
    probes += [lambda v, b=b: handle_decode((), {}, b, v).alive for b in ("mooncake", "nixl")]
    probes += [lambda v, c=c: chosen_descriptors(c, v) for c in (
        LayoutCase(4, 1, 0, 1, False, "mha"), LayoutCase(8, 2, 1, 0, True, "mla"), LayoutCase(4, 1, 0, 0, False, "hybrid_mla"),
        LayoutCase(32, 3, 1, 1, False, "mha", layer_ids=True))]
    probes += [lambda v: [status_update(c, n, "mooncake", v) for c in (None, KVPoll.Failed) for n in KVPoll]]
    assert any(repr(p(base)) != repr(p(off)) for p in probes), flag


def test_many_rooms_step_replaces_one_room_not_the_tuple_of_all():
    """Past `Rooms.B` rooms (the timed simulation) the per-room fields are trees a step updates in O(log rooms);
    up to it they stay plain tuples, so explore's states and fingerprints are what they were."""
    from kvsim.models.pd_common.rooms import Rooms
    small = PdProtocol(ProtocolConfig("mooncake", rooms=3), FIXED).initial_states()[0]
    assert type(small.prefill) is type(small.decode) is type(small.sent) is tuple
    system = PdProtocol(ProtocolConfig("mooncake", rooms=1000, faults=-1), FIXED)
    s0 = system.initial_states()[0]
    assert type(s0.prefill) is type(s0.decode) is type(s0.sent) is Rooms
    s1, fx = system.transition(s0, DecodeInit(700))
    assert s1.decode[700] == KVPoll.WaitingForInput and s0.decode[700] == KVPoll.Bootstrapping
    assert list(s1.decode) == [KVPoll.WaitingForInput if r == 700 else KVPoll.Bootstrapping for r in range(1000)]
    assert s1.decode.root[0] is s0.decode.root[0]  # untouched subtrees are shared, not copied
    assert s1.prefill is s0.prefill and fx[-1] == Sent("prefill", Tinfo(700))


def test_message_bag_stays_the_sorted_multiset():
    """The bags in flight are found and updated by bisection; they are still the sorted tuples they were."""
    from kvsim.models.pd_protocol.actions import Abort, GarbageFrame, Status
    from kvsim.models.pd_protocol.system import _add, _holds, _remove
    bag = ()
    msgs = [Tinfo(3), Status(1, 2), GarbageFrame(), Tinfo(3), Abort(0), Status(1, 1), GarbageFrame()]
    for i, m in enumerate(msgs):
        bag = _add(bag, m) if i % 2 else _add(bag, m, Tinfo(9))
        assert list(bag) == sorted(bag)
    assert bag == tuple(sorted(msgs + [Tinfo(9)] * 4))
    assert _holds(bag, Tinfo(3)) and not _holds(bag, Tinfo(4)) and not _holds((), Tinfo(3))
    assert _remove(bag, Tinfo(3)).count(Tinfo(3)) == 1
    with pytest.raises(ValueError):
        _remove(bag, Abort(5))


@pytest.mark.parametrize("backend", ["mooncake", "nixl", "mori"])
def test_sglang_0_5_23_holds_every_invariant(backend):
    """0.5.20's update_status (early return on Failed, only opening statuses create a room) removes the finding."""
    assert set(_violations(backend, "sglang_0_5_23")) == set()


def test_failed_not_sticky_is_a_seed_bug_fixed_in_0_5_20():
    from kvsim.app.report_md import fix_run

    bug = REG.bug("sglang-pd-common-failed-not-sticky")
    assert bug.status == "reproducible" and bug.fix_variant == "sglang_0_5_23"
    verdicts = {v.release: v for v in bug.verdicts}
    assert verdicts["0.5.19"].state == "present" and verdicts["0.5.20"].state == "fixed"
    assert verdicts["0.5.23"].fixed_in == "0.5.20"
    assert fix_run(bug, reproduce(bug)) == ("sglang_0_5_23", True)
    from kvsim.conform.releases import SEED_BUGS
    row = next(r for r in SEED_BUGS if r.bug == bug.id)
    assert (row.before, row.after, row.property) == ("0.5.19", "0.5.20", bug.invariant)


def test_transfer_info_on_a_failed_room_per_variant():
    failed = pd_rooms.PrefillRoom(KVPoll.Failed, False, False, False)
    assert pd_rooms.on_transfer_info(failed, "mooncake", FIXED).status == KVPoll.WaitingForInput  # max(0, 2)
    assert pd_rooms.on_transfer_info(failed, "mooncake", VARIANTS["sglang_0_5_23"]).status == KVPoll.Failed
    assert pd_rooms.on_transfer_info(failed, "mori", FIXED).status == KVPoll.Failed
