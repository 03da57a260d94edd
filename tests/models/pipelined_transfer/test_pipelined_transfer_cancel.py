"""pipelined-transfer: the generation side's cancel and release (RemoteCancel), the receiver's page pool with
reallocation (S1 across reuse), and the aux slot (E1)."""

import pytest

from kvsim.engine.actions import decode
from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.models.pipelined_transfer.config import PipelinedConfig
from kvsim.models.pipelined_transfer.state import ACTIONS, Write
from kvsim.models.pipelined_transfer.status import NEW_TX, KVSendTask, LlmRequestState, SessionStatus, TaskStatus
from kvsim.models.pipelined_transfer.system import PipelinedTransfer
from kvsim.models.pipelined_transfer.variants import FIXED, VARIANTS

S = LlmRequestState
DRAIN = VARIANTS["proposed_rx_release_after_drain"]


def system(variant=FIXED, **kw):
    return PipelinedTransfer(variant, PipelinedConfig(**kw))


def run(sys_, *actions):
    s = sys_.initial_states()[0]
    for a in actions:
        a = decode(list(a), ACTIONS)
        assert a in sys_.enabled(s), (a, sys_.enabled(s))
        s = sys_.step(s, a)
    return s


def run_from(sys_, s, *actions):
    for a in actions:
        a = decode(list(a), ACTIONS)
        assert a in sys_.enabled(s), (a, sys_.enabled(s))
        s = sys_.step(s, a)
    return s


def violations(sys_, **kw):
    result = explore(sys_, ExploreOptions(**kw))
    assert result.bound_hit is None
    return result, {v.property: v for v in result.violations}


def test_gen_cancel_in_fixed_releases_the_destination_under_a_write():
    _, bad = violations(system(faults="gen_cancel"))
    v = bad["S1_no_use_after_free"]
    assert v.trace == [["compute", 0], ["gen_cancel", 0], ["gen_release", 0]]
    assert "destination page 0 (block 0) released by the receiver (free)" in v.message


@pytest.mark.parametrize("kw", [
    dict(faults="gen_cancel"),
    dict(faults="gen_cancel,cancel,fail,silent", fault_budget=2),
    dict(faults="gen_cancel,cancel,shutdown", fault_budget=2, goal="release"),  # E3: every cancel releases
    dict(faults="gen_cancel,fail", ranks=2, boundary="B"),
    dict(faults="gen_cancel,cancel", promotion=True, ranks=2, fault_budget=2),
])
def test_release_after_drain_holds_s1_and_settles(kw):
    _, bad = violations(system(DRAIN, **kw))
    assert bad == {}


def test_a_cancel_before_the_session_exists_is_remembered():
    two = system(DRAIN, faults="gen_cancel", ranks=2, timeouts=False)
    s = run(two, ("gen_cancel", 0), ("remote_cancel", 0, 0))
    pre = s.tx[0][0]
    assert pre is not None and not pre.in_map and pre.terminal == SessionStatus.CANCELLED  # a pre-cancel
    assert ("gen_release", 0) not in two.enabled(s)  # rank 1 has not heard and may still send: not drained
    assert ("cancel_ack", 0, 0) in two.enabled(s) and ("cancel_ack", 0, 1) not in two.enabled(s)
    s = two.step(s, decode(["remote_cancel", 0, 1], ACTIONS))
    assert ("cancel_ack", 0, 1) in two.enabled(s)  # no rank can send any more: each acknowledges
    s = run_from(two, s, ("cancel_ack", 0, 0))
    assert ("gen_release", 0) not in two.enabled(s)  # one cancel-ACK still missing
    s = run_from(two, s, ("cancel_ack", 0, 1))
    assert ("gen_release", 0) in two.enabled(s)
    sys_ = system(DRAIN, faults="gen_cancel", timeouts=False)
    s = run(sys_, ("gen_cancel", 0), ("remote_cancel", 0, 0), ("compute", 0))
    assert s.tx[0][0].in_map and s.tx[0][0].tasks == () and not any(s.flight[0])  # created cancelled, nothing sent
    s = sys_.step(s, decode(["poll", 0], ACTIONS))
    assert s.reqs[0].retired and s.reqs[0].freed == 1 and s.reqs[0].ctx == S.DISAGG_TRANS_ERROR
    s = run_from(sys_, s, ("cancel_ack", 0, 0), ("gen_release", 0))
    assert sys_.done(s) and s.rx[0].releases == 1


def test_a_remote_cancel_mid_write_waits_for_the_drain():
    sys_ = system(DRAIN, faults="gen_cancel", timeouts=False)
    s = run(sys_, ("compute", 0), ("gen_cancel", 0), ("remote_cancel", 0, 0))
    assert s.tx[0][0].terminal == SessionStatus.CANCELLED and s.flight[0][0]  # the write keeps running
    assert s.rx[0].state == S.DISAGG_TRANS_ERROR and ("gen_release", 0) not in sys_.enabled(s)
    assert ("compute", 0) not in sys_.enabled(s) or sys_.step(s, decode(["compute", 0], ACTIONS)).flight[0][0] == \
        s.flight[0][0]
    s = sys_.step(s, decode(["write_done", 0, 0, 0], ACTIONS))
    assert ("gen_release", 0) not in sys_.enabled(s)  # sealed and settled: the cancel-ACK is sent, not yet here
    s = run_from(sys_, s, ("cancel_ack", 0, 0))
    assert ("gen_release", 0) in sys_.enabled(s)
    fixed = system(FIXED, faults="gen_cancel", timeouts=False)
    early = run(fixed, ("compute", 0), ("gen_cancel", 0))
    assert ("gen_release", 0) in fixed.enabled(early)  # fixed: at once, the write still in flight


def test_a_lost_cancel_session_is_released_after_the_context_completes():
    sys_ = system(DRAIN, faults="gen_cancel,drop", fault_budget=2, timeouts=False)
    s = run(sys_, ("gen_cancel", 0), ("drop_cancel", 0, 0), ("compute", 0), ("write_done", 0, 0, 0),
            ("compute", 0))
    assert ("gen_release", 0) not in sys_.enabled(s)  # the context side never heard: it keeps sending
    for a in (("write_done", 0, 0, 0), ("write_done", 0, 0, 0), ("poll", 0)):
        s = sys_.step(s, decode(list(a), ACTIONS))
    assert s.reqs[0].ctx == S.DISAGG_CONTEXT_COMPLETE and s.rx[0].state == S.DISAGG_TRANS_ERROR  # stays cancelled
    s = run_from(sys_, s, ("cancel_ack", 0, 0))  # the drained rank's answer
    assert ("gen_release", 0) in sys_.enabled(s)


def test_shared_pool_reallocates_released_pages_and_s1_holds_across_reuse():
    sys_ = system(DRAIN, requests=2, rx_pages=1, prompt_len=2, chunk_tokens=1, faults="gen_cancel")
    result, bad = violations(sys_, symmetry=False)
    assert bad == {}
    store = result._store
    reused = [st for st in map(store.state, range(len(store)))
              if st.rx[0].releases and st.rx[1].held and st.rx[1].pages == st.rx[0].pages]
    assert reused and any(any(st.flight[1]) for st in reused)  # request 1 writes into request 0's old pages
    s = sys_.initial_states()[0]
    assert [rx.state for rx in s.rx] == [S.DISAGG_GENERATION_INIT] * 2 and s.reqs[0].ctx == \
        S.DISAGG_CONTEXT_WAIT_SCHEDULER
    assert [a[0] for a in sys_.enabled(s)] == ["gen_post", "gen_post"]  # nothing else until posted


def test_shared_pool_in_fixed_frees_pages_under_the_write():
    _, bad = violations(system(FIXED, requests=2, rx_pages=1, prompt_len=2, chunk_tokens=1, faults="gen_cancel"))
    assert "released by the receiver" in bad["S1_no_use_after_free"].message


def test_s1_names_a_page_reallocated_to_another_request():
    sys_ = system(requests=2, rx_pages=3, faults="")
    check = next(i for i in sys_.invariants if i.name == "S1_no_use_after_free").check
    s = sys_.initial_states()[0]
    w = Write(0, False, False, ((1, 2),))
    rx0 = s.rx[0]._replace(state=S.DISAGG_TRANS_ERROR, pages=(0, 1, 2), releases=1)
    rx1 = s.rx[1]._replace(state=S.DISAGG_GENERATION_TRANS_IN_PROGRESS, pages=(0, 1, 2))
    planted = s._replace(rx=(rx0, rx1), flight=(((w,),), ((),)))
    assert "destination page 1 (block 1) released by the receiver (reallocated to request 1)" in check(planted)
    assert check(planted._replace(flight=(((),), ((),)))) is None
    assert check(planted._replace(rx=(rx0._replace(releases=0), rx1))) == (
        "receiver pages [0, 0, 1, 1, 2, 2]: a page allocated to two requests at once: expected each once")


def test_aux_slot_freed_once_after_its_write_and_never_leaked():
    sys_ = system(faults="")
    e1 = next(i for i in sys_.invariants if i.name == "E1_released_once").check
    e2 = next(i for i in sys_.invariants if i.name == "E2_cancel_true_once").check
    s = sys_.initial_states()[0]
    tx = NEW_TX._replace(tasks=(KVSendTask(0, True, TaskStatus.TRANSFERRED),), final=True,
                         aux=TaskStatus.TRANSFERRING, credits=1)
    aux_write = Write(-1, False, True, ())
    held = s._replace(tx=((tx,),), flight=(((aux_write,),),))
    assert e1(held) is None
    assert "aux slot freed while the aux write reads it" in e1(held._replace(tx=((tx._replace(aux_frees=1),),)))
    assert "aux slot freed 2 times" in e1(s._replace(tx=((tx._replace(aux_frees=2, credits=0),),)))
    leaked = s._replace(tx=((tx._replace(credits=0, in_map=False),),), reqs=(s.reqs[0]._replace(freed=1),))
    assert "a leak" in e1(leaked)
    assert "released 2 times" in e1(s._replace(rx=(s.rx[0]._replace(releases=2),)))
    retired = s._replace(tx=((tx._replace(credits=0),),), reqs=(s.reqs[0]._replace(retired=True),))
    assert "still in the send-session map" in e2(retired)


def test_shutdown_concludes_requests_never_posted():
    sys_ = system(requests=2, rx_pages=3, faults="shutdown")
    s = run(sys_, ("gen_post", 0), ("shutdown",))
    assert s.rx[1].state == S.DISAGG_TRANS_ERROR and s.reqs[1].freed == 1 and not s.rx[1].pages
    assert s.reqs[0].stopping and sys_.rx_done(s, 1) and sys_.ctx_done(s, 1)


def test_rx_pages_smaller_than_one_request_is_a_config_error():
    with pytest.raises(ConfigError, match="rx_pages"):
        PipelinedConfig(rx_pages=2)


# -- the cancel-ACK as a message ----------------------------------------------------------------------

def test_a_lost_cancel_ack_holds_the_pages_and_ends_as_a_reported_stall():
    """Rank 0 drained after a context cancel, but its ACK is lost: the receiver never releases; its deadline
    reports the stall (settled for E4, not released for E3); without timeouts it is a silent hang."""
    sys_ = system(faults="cancel,drop", fault_budget=2)
    s = run(sys_, ("cancel", 0))
    assert s.rx[0].state == S.DISAGG_TRANS_ERROR and s.rx[0].held
    s = run_from(sys_, s, ("poll", 0))  # nothing in flight: retired and freed on the context side
    assert s.reqs[0].freed == 1 and ("gen_release", 0) not in sys_.enabled(s)
    assert {("cancel_ack", 0, 0), ("drop_ack", 0, 0)} <= set(sys_.enabled(s))
    lost = run_from(sys_, s, ("drop_ack", 0, 0))
    assert ("gen_release", 0) not in sys_.enabled(lost) and not sys_.done(lost)
    stalled = run_from(sys_, lost, ("rx_stall", 0))
    assert sys_.done(stalled) and stalled.rx[0].held and stalled.rx[0].releases == 0
    acked = run_from(sys_, s, ("cancel_ack", 0, 0), ("gen_release", 0))
    assert sys_.done(acked) and acked.rx[0].releases == 1


@pytest.mark.parametrize("kw,found", [
    (dict(faults="cancel,drop", fault_budget=2, timeouts=False), {"E4_every_request_settles"}),  # silent hang
    (dict(faults="cancel,drop", fault_budget=2, goal="release"), {"E3_every_cancel_releases"}),  # stall, no release
    (dict(faults="cancel,drop", fault_budget=2), set()),  # the deadline reports the stall: settled
])
def test_a_lost_cancel_ack_is_a_hang_without_the_receivers_deadline(kw, found):
    """proposed_rx_deadline: a lost final result (#17665) is taken care of, so only the lost ACK is left."""
    result, bad = violations(system(VARIANTS["proposed_rx_deadline"], **kw))
    assert set(bad) == found


def test_every_acknowledged_cancel_releases_after_the_drain():
    _, bad = violations(system(DRAIN, faults="gen_cancel,cancel", ranks=2, fault_budget=2, goal="release"))
    assert bad == {}


# -- a failed rank never reports success afterwards (upstream aborts its later writes) ------------------

def test_a_write_after_a_failed_one_is_aborted_and_reported_failed_and_last():
    sys_ = system(faults="fail", timeouts=False)
    s = run(sys_, ("compute", 0), ("compute", 0), ("write_fail", 0, 0, 0))
    assert s.tx[0][0].terminal == SessionStatus.ERROR and len(s.flight[0][0]) == 2  # slice 1 and aux queued
    dest = s.rx[0].dest
    s = run_from(sys_, s, ("write_done", 0, 0, 0))  # slice 1: aborted, nothing written
    assert s.rx[0].dest == dest and s.tx[0][0].tasks[1].status == TaskStatus.ERROR
    failed, aborted = s.frames[0][0]
    assert not failed.ok and not aborted.ok and aborted.is_last and aborted.sender_slice_id == 1
    s = run_from(sys_, s, ("write_done", 0, 0, 0))  # the aux write is not checked upstream: it lands
    assert s.frames[0][0][-1].is_aux and s.frames[0][0][-1].ok


def test_a_dropped_failed_result_cannot_let_the_receiver_complete():
    """The finding left open: a lost FAILED frame and the same rank's later success. Upstream the later writes
    are aborted (FAILED, is_last), so the receiver fails: no S3 (it was a model artefact)."""
    _, bad = violations(system(ranks=2, faults="fail,drop", fault_budget=2), check_liveness=False)
    assert bad == {}
