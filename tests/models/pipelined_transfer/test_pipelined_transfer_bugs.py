"""pipelined-transfer: the bug reports of section 1.12 reproduce on their variant and pass on `fixed` (or, for the
open ones, on the proposed-fix variant); their counterexamples replay."""

import pytest

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.engine.actions import decode
from kvsim.engine.explore import explore
from kvsim.engine.system import run_actions
from kvsim.models.pipelined_transfer import DESCRIPTOR
from kvsim.models.pipelined_transfer.state import ACTIONS
from kvsim.models.pipelined_transfer.status import LlmRequestState

REG = catalog.load()
BUGS = ("trtllm-15519-slice-id-crash", "trtllm-17526-early-completion", "trtllm-15727-final-chunk-clock",
        "trtllm-15727-cancel-drain-no-deadline", "trtllm-17665-dropped-notification",
        "trtllm-15727-retire-without-quiescence", "trtllm-15727-final-chunk-into-retired-session",
        "trtllm-15727-duplicated-final-result", "trtllm-15727-duplicated-results-complete-early",
        "trtllm-rx-cancel-releases-early")


@pytest.mark.parametrize("bug_id", BUGS)
def test_bug_reports_hold(bug_id):
    bug = REG.bug(bug_id)
    result = reproduce(bug)
    assert result.ok and result.reproduced and result.counterexample["trace"]
    if bug.fix_variant is not None:  # an open one: the proposed fix passes the same search
        fixed = explore(DESCRIPTOR.build_system(bug.fix_variant, dict(bug.params)))
        assert bug.invariant not in {v.property for v in fixed.violations}


def _trace(bug_id):
    bug = REG.bug(bug_id)
    result = reproduce(bug)
    system = DESCRIPTOR.build_system(bug.variant, dict(bug.params))
    return result, run_actions(system, [decode(a, ACTIONS) for a in result.counterexample["trace"]])[-1]


def test_slice_id_crash_is_the_second_chunks_result():
    result, state = _trace("trtllm-15519-slice-id-crash")
    assert "names receiver slice 1" in result.message and state.rx[0].crashed
    assert result.counterexample["trace"][-1] == ["deliver", 0, 0]


def test_early_completion_frees_pages_mid_prefill():
    result, state = _trace("trtllm-17526-early-completion")
    assert result.counterexample["trace"] == [["compute", 0], ["write_done", 0, 0, 0], ["poll", 0]]
    assert state.reqs[0].ctx == LlmRequestState.DISAGG_CONTEXT_COMPLETE and state.reqs[0].computed == 1
    assert "final slice submitted False" in result.message


def test_final_chunk_clock_hangs_without_a_timeout():
    result, state = _trace("trtllm-15727-final-chunk-clock")
    assert result.counterexample["kind"] == "hang"
    assert state.reqs[0].silent and state.reqs[0].stopping and not state.reqs[0].clock


def test_retire_without_quiescence_frees_pages_under_a_write():
    result, state = _trace("trtllm-15727-retire-without-quiescence")
    assert "rank 1" in result.message and state.reqs[0].freed == 1 and state.flight[0][1]


def test_final_chunk_into_retired_session_stays_pinned():
    result, state = _trace("trtllm-15727-final-chunk-into-retired-session")
    system = DESCRIPTOR.build_system("retired_unchecked", {"cancel_final": 1, "timeouts": 0, "faults": "cancel"})
    # from the hang state every run ends with the request pinned in DISAGG_CONTEXT_TRANS_IN_PROGRESS
    s = state
    while system.enabled(s):
        s = system.step(s, system.enabled(s)[0])
    assert s.reqs[0].pinned and s.reqs[0].retired and s.reqs[0].ctx == LlmRequestState.DISAGG_CONTEXT_TRANS_IN_PROGRESS


def test_open_findings_reproduce_on_fixed():
    drain, state = _trace("trtllm-15727-cancel-drain-no-deadline")
    assert drain.bug.status == "open upstream" and drain.counterexample["trace"] == [["silent", 0]]
    dropped, state = _trace("trtllm-17665-dropped-notification")
    assert dropped.counterexample["trace"][-1] == ["drop_frame", 0, 0]
    assert state.rx[0].state == LlmRequestState.DISAGG_GENERATION_TRANS_IN_PROGRESS and state.reqs[0].freed


def test_final_chunk_clock_needs_the_skipped_final_chunk():
    params = {"faults": "silent,cancel", "fault_budget": 2}
    older = explore(DESCRIPTOR.build_system("final_chunk_clock", {**params, "cancel_final": 1}))
    assert older.violations == []  # the unconditional final chunk arms the clock
    shutdown = explore(DESCRIPTOR.build_system("final_chunk_clock", {**params, "faults": "silent,shutdown"}))
    assert [v.property for v in shutdown.violations] == ["E4_every_request_settles"]


def test_duplicated_results_complete_before_the_other_rank_wrote():
    result, state = _trace("trtllm-15727-duplicated-results-complete-early")
    assert [a[0] for a in result.counterexample["trace"]].count("dup_frame") == 2
    system = DESCRIPTOR.build_system("fixed", dict(REG.bug("trtllm-15727-duplicated-results-complete-early").params))
    s5 = next(i for i in system.invariants if i.name == "S5_content_fresh")
    assert "destination block 0 of rank 1 holds 0 of 2 tokens" in s5.check(state)  # the data is missing too
