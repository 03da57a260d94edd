"""pipelined-transfer: sessions, status derivation and the transition system (TensorRT-LLM #15727)."""

import contextlib
import io

import pytest

from kvsim.app import catalog
from kvsim.app.cli import main
from kvsim.engine.actions import decode
from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import explore
from kvsim.engine.runner import run_property
from kvsim.engine.sim import Driver
from kvsim.engine.system import run_actions
from kvsim.models.pipelined_transfer import DESCRIPTOR
from kvsim.models.pipelined_transfer import chunks as ch
from kvsim.models.pipelined_transfer.actions import describe
from kvsim.models.pipelined_transfer.config import PipelinedConfig
from kvsim.models.pipelined_transfer.state import ACTIONS, Frame, Write
from kvsim.models.pipelined_transfer.status import (NEW_TX, KVSendTask, LlmRequestState, SessionStatus, TaskStatus,
                                                    cancel, is_completed, set_exception, tx_status)
from kvsim.models.pipelined_transfer.system import RULES, PipelinedTransfer
from kvsim.models.pipelined_transfer.variants import FIXED, VARIANTS

from toys import alone

REG = catalog.load()
NO_FAULTS = dict(faults="", fault_budget=0)


def _explore(variant=FIXED, only=None, **kw):
    system = PipelinedTransfer(variant, PipelinedConfig(**kw))
    if only is not None:
        alone(system, only)
    result = explore(system)
    assert result.bound_hit is None
    return result, {v.property: v for v in result.violations}


def typed(trace):
    return [decode(a, ACTIONS) for a in trace]


# -- request, task and session states -----------------------------------------------------------------

def test_request_state_values_are_upstream():
    values = {s.name: int(s) for s in LlmRequestState}
    assert values == {"DISAGG_TRANS_ERROR": -1, "DISAGG_CONTEXT_WAIT_SCHEDULER": 7, "DISAGG_GENERATION_INIT": 8,
                      "DISAGG_GENERATION_TRANS_IN_PROGRESS": 9, "CONTEXT_INIT": 10,
                      "DISAGG_CONTEXT_INIT_AND_TRANS": 11, "DISAGG_GENERATION_TRANS_COMPLETE": 12,
                      "GENERATION_IN_PROGRESS": 13, "GENERATION_TO_COMPLETE": 14, "GENERATION_COMPLETE": 20,
                      "DISAGG_CONTEXT_TRANS_IN_PROGRESS": 21, "DISAGG_CONTEXT_COMPLETE": 22,
                      "DISAGG_GENERATION_WAIT_TOKENS": 23}


def test_status_derivation_priority_and_the_17526_subtlety():
    done0 = KVSendTask(0, False, TaskStatus.TRANSFERRED)
    mid = NEW_TX._replace(tasks=(done0,))  # chunk 0 written, chunk 1 not yet submitted
    assert tx_status(NEW_TX) == SessionStatus.READY and tx_status(NEW_TX._replace(ready=False)) == SessionStatus.INIT
    assert tx_status(mid) == SessionStatus.KV_TRANSFERRED
    assert not is_completed(mid, True) and is_completed(mid, False)  # the wait that skips a None aux
    writing = mid._replace(tasks=(done0, KVSendTask(1, True, TaskStatus.TRANSFERRING)))
    assert tx_status(writing) == SessionStatus.TRANSFERRING
    final = mid._replace(tasks=(done0, KVSendTask(1, True, TaskStatus.TRANSFERRED)), final=True,
                         aux=TaskStatus.TRANSFERRED)
    assert tx_status(final) == SessionStatus.FULLY_TRANSFERRED and is_completed(final, True)
    assert tx_status(final._replace(aux=TaskStatus.ERROR)) == SessionStatus.ERROR  # ERROR before transferred
    assert tx_status(cancel(final)) == SessionStatus.CANCELLED and not is_completed(cancel(final), True)
    assert set_exception(cancel(NEW_TX)).terminal == SessionStatus.CANCELLED  # never overrides CANCELLED
    assert cancel(set_exception(NEW_TX)).terminal == SessionStatus.ERROR and cancel(cancel(NEW_TX)) == cancel(NEW_TX)


# -- the transition system ------------------------------------------------------------------------------

def test_fixed_default_configuration_is_clean():
    result, violations = _explore()
    assert violations == {} and result.hang_states == 0 and result.states > 100


@pytest.mark.parametrize("kw", [
    dict(boundary="B"),
    dict(boundary="B", prefix_hit=1, rx_cached_blocks=1, fault_budget=2),
    dict(ranks=2, faults="fail,cancel,shutdown"),
    dict(requests=2, faults="cancel", prompt_len=4, chunk_tokens=2),
    dict(cancel_final=True, faults="cancel,fail,silent"),
    dict(promotion=True, ranks=2, faults="cancel"),
    dict(goal="release", faults="fail,cancel,shutdown", fault_budget=2),  # E3 under a fair fabric
])
def test_fixed_is_clean_on_more_configurations(kw):
    _, violations = _explore(**kw)
    assert violations == {}


def test_happy_path_completes_both_sides_and_lands_fresh_data():
    system = PipelinedTransfer(FIXED, PipelinedConfig(boundary="B", timeouts=False, **NO_FAULTS))
    driver = Driver(system)
    order = ("compute", "write_done", "deliver", "poll", "gen_release")
    while not system.done(driver.state):
        action = min(driver.enabled(), key=lambda a: order.index(a[0]))
        driver.apply(action)
    s = driver.state
    assert s.reqs[0].ctx == LlmRequestState.DISAGG_CONTEXT_COMPLETE and s.reqs[0].freed == 1
    assert s.rx[0].state == LlmRequestState.DISAGG_GENERATION_TRANS_COMPLETE
    assert s.rx[0].dest == (2, 2, 2) and s.tx[0][0].final and s.tx[0][0].aux == TaskStatus.TRANSFERRED
    assert s.tx[0][0].aux_frees == 1 and s.rx[0].releases == 1  # the aux slot and the destination pages, once
    # revision B sends block 1 twice: stale (1 token of 2) with slice 0, complete with slice 1
    writes = [a for a in driver.actions if a[0] == "write_done"]
    assert len(writes) == 3
    assert run_actions(system, driver.actions)[-1] == s


def test_all_swa_request_sends_no_slice_for_its_non_final_chunk():
    """Issue 30: the window group alone, window 2 < prompt 6: chunk 0 holds no id on the sender, so upstream's
    `_build_prefill_extent` returns None: no slice, no slice id, no result frame. The final chunk is slice 0 on
    every rank, one KV and one aux result frame per rank, and the receiver completes with its window fresh."""
    system = PipelinedTransfer(FIXED, PipelinedConfig(swa_window=2, full_attention=False, ranks=2, timeouts=False,
                                                      **NO_FAULTS))
    assert system.extents[0] is None and system.cells == ((), ((2, 2),))  # cell 2: block 2, the final window
    driver = Driver(system)
    order = ("compute", "write_done", "deliver", "poll", "gen_release")
    frames = []
    while not system.done(driver.state):
        action = min(driver.enabled(), key=lambda a: order.index(a[0]))
        frames += [e.frame for e in driver.apply(action) if e[0] == "frame_sent"]
    s = driver.state
    assert [[t.slice_id for t in tx.tasks] for tx in s.tx[0]] == [[0], [0]]
    assert sorted((f.peer_rank, f.sender_slice_id, f.is_last, f.is_aux) for f in frames) == [
        (0, -1, False, True), (0, 0, True, False), (1, -1, False, True), (1, 0, True, False)]
    assert s.rx[0].state == LlmRequestState.DISAGG_GENERATION_TRANS_COMPLETE and s.rx[0].dest == (0, 0, 2) * 2
    _, violations = _explore(swa_window=2, full_attention=False, ranks=2)
    assert violations == {}
    with pytest.raises(ConfigError, match="full_attention"):
        PipelinedConfig(full_attention=False)


def test_promotion_needs_peer_info_on_every_rank():
    system = PipelinedTransfer(FIXED, PipelinedConfig(promotion=True, ranks=2, **NO_FAULTS))
    s = system.initial_states()[0]
    assert s.reqs[0].ctx == LlmRequestState.DISAGG_CONTEXT_WAIT_SCHEDULER
    assert [a[0] for a in system.enabled(s)] == ["peer_info", "peer_info"]
    s = system.step(s, typed([["peer_info", 0, 1]])[0])
    assert ("promote", 0) not in system.enabled(s)
    s = system.step(s, typed([["peer_info", 0, 0]])[0])
    s = system.step(s, typed([["promote", 0]])[0])
    assert s.reqs[0].ctx == LlmRequestState.CONTEXT_INIT and ("compute", 0) in system.enabled(s)


ALL_FAULTS = "fail,drop,dup,silent,cancel,shutdown,gen_cancel"


@pytest.mark.parametrize("variant, kw, kinds", [
    ("fixed", dict(ranks=2, promotion=1, faults=ALL_FAULTS), {"peer_info", "promote", "write_fail"}),
    ("fixed", dict(requests=2, rx_pages=3, fifo=0, faults=ALL_FAULTS), {"gen_post", "shutdown", "dup_frame"}),
    ("proposed_drain_deadline", dict(faults="silent,drop", fault_budget=2), {"fence", "drop_ack"}),
    ("proposed_rx_deadline", dict(faults="drop,gen_cancel", fault_budget=2),
     {"rx_timeout", "drop_cancel", "remote_cancel", "gen_cancel"}),
])
def test_allows_is_membership_in_enabled(variant, kw, kinds):
    """Each rule's precondition (read by `allows`) is the condition `enabled` lists its action under."""
    system = PipelinedTransfer(VARIANTS[variant], PipelinedConfig(**kw))
    actions, wrong = RULES.disagreements(system)
    assert kinds <= {a.tag for a in actions}
    assert not wrong


def test_transition_effects_name_what_happened():
    system = PipelinedTransfer(FIXED, PipelinedConfig(**NO_FAULTS))
    s0 = system.initial_states()[0]
    s1, fx = system.transition(s0, typed([["compute", 0]])[0])
    assert fx == (("dispatched", 0, 0, Write(0, False, False, ((0, 2),))),)
    s2, fx = system.transition(s1, typed([["write_done", 0, 0, 0]])[0])
    assert fx[-1] == ("frame_sent", 0, 0, Frame(0, 0, 0, False, False, True))


@pytest.mark.parametrize("boundary", ["A", "B"])
@pytest.mark.parametrize("name", ["S3_no_early_completion", "S5_content_fresh"])
def test_s3_and_s5_fail_without_fifo_and_hold_with_it(boundary, name):
    """Part 3 of the research note: the properties are validated by failing once writes may reorder."""
    _, bad = _explore(only=name, fifo=False, boundary=boundary, **NO_FAULTS)
    assert name in bad
    _, good = _explore(only=name, fifo=True, boundary=boundary, **NO_FAULTS)
    assert good == {}


def test_stale_b_write_landing_last_is_what_s5_sees():
    _, bad = _explore(fifo=False, boundary="B", **NO_FAULTS)  # S3 sees the unwritten slice first
    v = bad["S5_content_fresh"]
    assert "block 1 of rank 0 holds 1 of 2 tokens" in v.message
    assert v.trace[-3] == ["write_done", 0, 0, 0]  # slice 0's stale copy lands after slice 1's complete one


def test_silent_peer_ends_as_a_reported_stall_not_a_release():
    result, violations = _explore(faults="silent", goal="settle")
    assert violations == {}
    _, violations = _explore(faults="silent", goal="release")
    assert violations["E3_every_cancel_releases"].kind == "hang"


def test_duplicate_final_result_overshoots_the_completion_count():
    """Model finding: `last_slice_count == expected_transfers` never holds after a duplicated final result."""
    _, violations = _explore(ranks=2, faults="dup")
    hang = violations["E4_every_request_settles"]
    assert hang.trace[-1][0] == "dup_frame" and set(violations) == {"E4_every_request_settles"}
    assert hang.state.rx[0].state == LlmRequestState.DISAGG_GENERATION_TRANS_IN_PROGRESS
    frames = hang.state.frames[0][hang.trace[-1][2]]
    assert frames[0] == frames[1] and frames[0].is_last  # the final-slice result, about to count twice
    _, violations = _explore(VARIANTS["proposed_dedupe_results"], ranks=2, faults="dup")
    assert violations == {}


def test_invariants_fail_on_planted_states():
    system = PipelinedTransfer(FIXED, PipelinedConfig(**NO_FAULTS))
    s = system.initial_states()[0]
    checks = {i.name: i for i in system.invariants}
    assert all(i.check(s) is None for i in system.invariants)
    q, rx = s.reqs[0], s.rx[0]
    w = Write(0, False, False, ((0, 2),))
    tx = NEW_TX._replace(tasks=(KVSendTask(0, False, TaskStatus.TRANSFERRING),), credits=1)
    flying = s._replace(flight=(((w,),),), tx=((tx,),))
    assert checks["S1_no_use_after_free"].check(flying) is None
    assert "pages [0] freed" in checks["S1_no_use_after_free"].check(flying._replace(reqs=(q._replace(freed=1),)))
    assert "has_inflight_transfer False" in checks["S2_ownership_covers_flight"].check(
        flying._replace(tx=((tx._replace(in_map=False),),)))
    assert "credits 0" in checks["S2_ownership_covers_flight"].check(flying._replace(tx=((tx._replace(credits=0),),)))
    complete = s._replace(rx=(rx._replace(state=LlmRequestState.DISAGG_GENERATION_TRANS_COMPLETE),))
    assert "holds 0 of 2" in checks["S5_content_fresh"].check(complete)
    assert "generation state 12" in checks["S3_no_early_completion"].check(complete)
    twice = NEW_TX._replace(tasks=(KVSendTask(0, True, TaskStatus.TRANSFERRED), KVSendTask(1, True, 2)))
    assert "is_last at [0, 1]" in checks["S6_slice_ids"].check(s._replace(tx=((twice,),)))
    assert "emitted no final slice" in checks["S7_final_slice_always"].check(s._replace(reqs=(q._replace(computed=2),)))
    ctx_done = s._replace(reqs=(q._replace(ctx=LlmRequestState.DISAGG_CONTEXT_COMPLETE),), tx=((cancel(NEW_TX),),))
    assert "cancelled or failed" in checks["S8_consensus"].check(ctx_done)
    assert "released 2 times" in checks["E1_released_once"].check(s._replace(reqs=(q._replace(freed=2),)))
    assert "pins" in checks["E1_released_once"].check(s._replace(reqs=(q._replace(freed=1, pinned=True),)))
    assert checks["S9_outcome_stable"].check(s._replace(flags=(("S9_outcome_stable", "x"),))) == "x"


def test_stateful_property_passes_on_fixed_and_finds_early_completion():
    prop = REG.property("pipelined-transfer", "transfer_invariants")
    assert run_property(prop, FIXED, max_examples=40, seed=0).status == "passed"
    bad = run_property(prop, VARIANTS["pre_17526"], max_examples=200, seed=0, params=NO_FAULTS)
    assert bad.status == "failed" and bad.counterexample["invariant"] == "S3_no_early_completion"


def test_bad_parameters_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="faults"):
        PipelinedConfig(faults="bogus")
    with pytest.raises(ConfigError, match="prefix_sent"):
        PipelinedConfig(prefix_sent=True)
    with pytest.raises(ConfigError, match="at most 4 prefill chunks"):
        PipelinedConfig(prompt_len=10, chunk_tokens=1)
    with pytest.raises(ConfigError, match="prefix_hit"):
        DESCRIPTOR.build_system("fixed", {"prefix_hit": 6})
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["explore", "pipelined-transfer", "--param", "boundary=C"])
    assert code == 2 and "Traceback" not in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1


def test_cli_explore_runs():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explore", "pipelined-transfer", "--json"])
    assert code == 0 and '"complete": true' in out.getvalue()


def test_every_action_and_effect_has_words():
    seen = set()
    for config in (PipelinedConfig(promotion=True, faults="fail,drop,dup,silent,cancel,shutdown,gen_cancel"),
                   PipelinedConfig(requests=2, rx_pages=3, faults="gen_cancel,drop", fault_budget=2)):
        _walk(PipelinedTransfer(VARIANTS["proposed_drain_deadline"], config), seen)
    assert seen >= {"peer_info", "promote", "compute", "write_done", "write_fail", "deliver", "drop_frame",
                    "dup_frame", "poll", "timeout", "stall_report", "fence", "silent", "cancel", "shutdown",
                    "gen_post", "gen_cancel", "remote_cancel", "drop_cancel", "gen_release"}


def _walk(system, seen):
    frontier, visited = list(system.initial_states()), set()
    while frontier and len(visited) < 3000:
        state = frontier.pop(0)
        for action in system.enabled(state):
            nxt, effects = system.transition(state, action)
            if nxt not in visited:
                visited.add(nxt)
                frontier.append(nxt)
            if action[0] in seen:
                continue
            seen.add(action[0])
            for record in (action, *effects):
                text = describe(record)
                assert text == "" or not text.startswith(("(", "'")), record


def test_saved_counterexamples_replay(tmp_path):
    for variant, params in (("pre_15519", ["faults=", "fault_budget=0"]),
                            ("final_chunk_clock", ["faults=silent,cancel", "fault_budget=2"])):
        path = str(tmp_path / f"{variant}.json")
        args = ["explore", "pipelined-transfer", "--variant", variant, "--save", path]
        for p in params:
            args += ["--param", p]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(args) == 1
            assert main(["replay", path]) == 0


def test_swa_group_travels_only_with_the_final_slice(monkeypatch):
    system = PipelinedTransfer(FIXED, PipelinedConfig(swa_window=2, **NO_FAULTS))
    assert system.cells == (((0, 2),), ((1, 2), (2, 2), (5, 2)))  # group 1 (cells 3..5): its window block 2 only
    _, violations = _explore(swa_window=2)
    assert violations == {}
    # planted: pipeline the window group like a full one; its early blocks land where nothing may
    monkeypatch.setattr(ch, "is_pipelined_group", lambda prompt_len, window: True)
    _, violations = _explore(swa_window=2, **NO_FAULTS)
    assert "(layer group 1)" in violations["S5_content_fresh"].message
