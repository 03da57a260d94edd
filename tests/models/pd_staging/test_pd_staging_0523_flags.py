"""SGLang 0.5.23's further flags in pd-staging: the deferred decode KV release, PP prefill writers and the
transfer worker's whole-chunk re-enqueue (`defer_dst`), with the findings explore settles on them."""

from __future__ import annotations

import pytest

from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.models.pd_staging import DESCRIPTOR
from kvsim.models.pd_staging.actions import Abort, AckMsg, Batch, Deliver, ReleaseTimeout, ReqMsg, Work
from kvsim.models.pd_staging.state import NOT_ALLOCATED

DUP = {"writers": 2, "dsts": 2, "prompt_len": 1, "faults": "defer_dst", "timeouts": 0}
RESEND = {"rooms": 2, "dsts": 2, "prompt_len": 1, "ring_units": 1, "faults": "defer_dst", "timeouts": 0}
STALE = {"rooms": 2, "prompt_len": 1, "ring_units": 1, "faults": "abort", "timeouts": 0}


def _search(variant, params, invariant="suffix_rows_match_prefill"):
    result = explore(DESCRIPTOR.build_system(variant, params), ExploreOptions(symmetry=False))
    assert result.bound_hit is None
    return next((v for v in result.violations if v.property == invariant), None), result.states


def test_dup_ready_through_the_re_enqueue_on_0_5_23():
    hit, states = _search("sglang_0_5_23", DUP)
    assert states == 625 and len(hit.trace) == 7
    assert [a[0] for a in hit.trace] == ["batch", "deliver", "deliver", "defer_dst", "work", "deliver", "deliver"]
    assert "token 0 head 1: stale ring bytes" in hit.message


def test_several_writers_with_several_destinations_need_pp_writers():
    with pytest.raises(ConfigError, match="--param writers: expected 1 when dsts=2 on variant fixed"):
        DESCRIPTOR.build_system("fixed", DUP).initial_states()


@pytest.mark.parametrize("params", [DUP, RESEND])
def test_per_destination_progress_removes_both_findings(params):
    assert _search("proposed_per_dst_retry", params)[0] is None


def test_resend_after_free_on_05c7ebf_needs_a_wrap():
    hit, _ = _search("fixed", RESEND)
    assert len(hit.trace) == 13 and "room 1 decode rows" in hit.message and "room 0 token 0" in hit.message
    assert _search("fixed", {**RESEND, "ring_units": 0})[0] is None


def test_resend_after_free_on_0_5_23_needs_no_ring_pressure():
    params = {**RESEND, "ring_units": 0, "fault_budget": 2}
    hit, _ = _search("sglang_0_5_23", params)
    assert len(hit.trace) == 15 and [a[0] for a in hit.trace].count("defer_dst") == 2


def test_the_deferred_release_fixes_the_stale_write_in_the_default_configuration():
    assert _search("sglang_0_5_23", STALE) == (None, 4343)
    hit, _ = _search("sglang_0_5_23", {**STALE, "deferred_release": 0})  # the environment switch off
    assert len(hit.trace) == 12 and "room 0 token 0 head 0" in hit.message
    assert _search("fixed", STALE)[0] is not None


def test_a_failed_room_holds_its_slot_until_the_abort_ack_or_the_timeout():
    system = DESCRIPTOR.build_system("sglang_0_5_23", {"prompt_len": 1, "faults": "abort,release_timeout",
                                                       "fault_budget": 2})
    s = system.initial_states()[0]
    for a in (Batch(0), Deliver(0, 0, ReqMsg(0, 0, 1, 0)), Abort(0)):
        s, fx = system.transition(s, a)
    d = s.decode[0]
    assert d.held and d.registered and d.infos != (NOT_ALLOCATED,) and s.owners  # the slot is still allocated
    assert ("held", 0) in fx and ReleaseTimeout(0) in system.enabled(s)
    s, _ = system.transition(s, Work(0))  # the chunk has no offset yet: deferred, counted
    abort = s.chans[1][0][-1]
    assert abort[0] == "ABORT"
    s, fx = system.transition(s, Deliver(1, 0, abort))  # the room is Failed but a chunk is outstanding: no ACK yet
    assert s.prefill[0][0].ack and not any(e[0] == "sent" and e[3][0] == "ACK" for e in fx)
    s, fx = system.transition(s, Work(0))  # the skip path drains the room: the ACK goes
    assert ("sent", 0, 0, AckMsg(0, 0)) in fx
    s, _ = system.transition(s, Deliver(0, 0, AckMsg(0, 0)))
    assert not s.decode[0].held and not s.owners  # released on the last ACK


def test_with_pp_writers_staging_rsp_goes_to_the_requester_only():
    system = DESCRIPTOR.build_system("sglang_0_5_23", {"writers": 2, "dsts": 2, "prompt_len": 1, "faults": ""})
    s = system.initial_states()[0]
    s, _ = system.transition(s, Batch(0))
    s, fx = system.transition(s, Deliver(0, 1, ReqMsg(0, 0, 1, 1)))
    assert [e[2] for e in fx if e[0] == "sent"] == [1]
    tp = DESCRIPTOR.build_system("sglang_0_5_23", {"writers": 2, "prompt_len": 1, "faults": ""})
    s = tp.initial_states()[0]
    s, _ = tp.transition(s, Batch(0))
    s, fx = tp.transition(s, Deliver(0, 1, ReqMsg(0, 0, 1, 1)))
    assert [e[2] for e in fx if e[0] == "sent"] == [0, 1]  # TP co-writers: every bootstrap of the room
