"""pd-staging: the staging transfer transition system (SGLang 05c7ebf), scenarios A-D, bugs and findings."""

import pytest

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.engine.actions import decode
from kvsim.engine.canon import to_jsonable
from kvsim.engine.explore import explore
from kvsim.engine.runner import run_property
from kvsim.engine.system import first_violation, run_actions
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_staging import DESCRIPTOR, data
from kvsim.models.pd_staging.actions import ACTIONS, DOWN, UP
from kvsim.models.pd_staging.data import StagingSystemConfig
from kvsim.models.pd_staging.system import RULES, PdStaging
from kvsim.models.pd_staging.variants import FIXED, VARIANTS

REG = catalog.load()
PRE = VARIANTS["pre_05c7ebf"]


def Config(faults=(), **kw):
    """The system config with no fault kinds unless named (the explore default names three)."""
    return StagingSystemConfig(faults=",".join(faults), **kw)


def typed(actions):
    """Actions written as plain tuples, as the system's typed records (what `enabled` lists)."""
    return [decode(to_jsonable(a), ACTIONS) for a in actions]
PRIORITY = ("deliver", "scatter_done", "batch", "work", "clear")  # no timeouts, no faults


def happy_path(system, limit=5000):
    """Fault-free run, messages delivered as soon as sent; stops at the first violation."""
    state = system.initial_states()[0]
    for _ in range(limit):
        bad = first_violation(system, state)
        if bad or system.done(state):
            return state, bad
        actions = sorted((a for a in system.enabled(state) if a[0] in PRIORITY), key=lambda a: PRIORITY.index(a[0]))
        for action in actions:
            nxt = system.step(state, action)
            if nxt != state:
                state = nxt
                break
        else:
            return state, None
    raise AssertionError("happy path did not conclude")


def _explore(variant, **kw):
    result = explore(PdStaging(variant, Config(**kw)))
    assert result.bound_hit is None
    return result, {v.property: v for v in result.violations}


# -- section 2.9 shared setup: ps 16, cps 256 (G 256, F 16), L 1000 ------------------------------------

SETUP = dict(page_size=16, chunked_prefill_size=256, prompt_len=1000, timeouts=False)


def test_scenario_a_prefill_radix_hit_llama_4_to_2():
    """A: prefill hit 608. Fixed: slots 0..3 of 16, 16, 16, 15 pages, each sent once, KV equal to the prefill's."""
    fixed = PdStaging(FIXED, Config(writers=2, prefill_hit=608, **SETUP))
    assert fixed.slot_pages == (16, 16, 16, 15)
    sends = [(c.page_start, c.num_pages, c.chunk_idx) for g in fixed.groups for c in g]
    assert sends == [(0, 16, 0), (16, 16, 1), (32, 16, 2), (48, 15, 3)]
    state, bad = happy_path(fixed)
    assert bad is None and state.decode[0].status == KVPoll.Success
    assert data.row_mismatches(state.decode[0].rows, fixed.cfg, 0, allow_unwritten=False) == []
    assert state.ring.allocations == () and fixed.done(state)
    # before the fix (P_tp 4 > D_tp 2): one 54-page send does not fit the one-slot prefill buffer: the room fails
    pre = PdStaging(PRE, Config(writers=2, prefill_hit=608, **SETUP))
    assert [(c.page_start, c.num_pages, c.chunk_idx) for g in pre.groups for c in g] == [(0, 54, 0), (54, 9, 3)]
    state, bad = happy_path(pre)
    assert bad is None and state.decode[0].status == KVPoll.Failed


def test_scenario_a_one_writer_overruns_before_the_fix():
    """A with P_tp < D_tp (one writer, a quarter of its heads): the 54-page send fits the buffer, overruns slot 0."""
    state, bad = happy_path(PdStaging(PRE, Config(writers=1, prefill_hit=608, **SETUP)))
    assert bad[0] == "slot_writes_within_size" and "54 pages" in bad[1] and "slot 0" in bad[1]


def test_scenario_b_decode_radix_hit():
    """B: D 512. Before: slot 0 is scattered into rows [0, 256), the shared prefix. After: rows [512, 768)."""
    cfg = Config(decode_prefix_len=512, **SETUP)
    state, bad = happy_path(PdStaging(PRE, cfg))
    assert bad[0] == "shared_prefix_rows_unchanged" and "token 0 head 0: room 0 token 512" in bad[1]
    fixed = PdStaging(FIXED, cfg)
    state, bad = happy_path(fixed)
    assert bad is None and state.decode[0].status == KVPoll.Success and state.prefix == data.initial_prefix(cfg)
    assert state.decode[0].rows[0] == data.value(0, 512, 0)


def test_scenario_c_reordered_chunk_keeps_room_open():
    """C: chunk 0 deferred (no STAGING_RSP yet), the last chunk transfers; fixed keeps outstanding = 1."""
    trace = [("batch", 0), ("batch", 0), ("work", 0),
             ("deliver", UP, 0, ("REQ", 0, 0, 1, 0)), ("deliver", UP, 0, ("REQ", 0, 1, 1, 0)),
             ("deliver", DOWN, 0, ("RSP", 0, 0, 0, 0, 0, 0, 1)), ("deliver", DOWN, 0, ("RSP", 0, 1, 0, 1, 1, 0, 2)),
             ("work", 0)]
    cfg = Config(chunked_prefill_size=1, prompt_len=2, timeouts=False)
    fixed = PdStaging(FIXED, cfg)
    after = run_actions(fixed, typed(trace))[-1]
    room = after.prefill[0][0]
    assert room.status == KVPoll.Success and room.outstanding == 1 and room.infos
    assert ("clear", 0, 0) not in fixed.enabled(after)  # poll says Transferring
    after = fixed.step(after, typed([("work", 0)])[0])  # the deferred chunk transfers, then teardown
    assert after.prefill[0][0].outstanding == 0 and not after.prefill[0][0].infos
    pre = PdStaging(PRE, cfg)
    states = run_actions(pre, typed(trace))
    assert first_violation(pre, states[-1])[0] == "no_early_teardown"
    dropped = pre.step(states[-1], typed([("work", 0)])[0])
    assert dropped.queues == ((),) and dropped.memory[0] == data.GARBAGE  # slot 0 never written


def test_scenario_d_unaligned_decode_prefix():
    """D: D 500 at ps 16. Fixed fails the room at registration, scatters nothing; before, it scattered."""
    cfg = Config(decode_prefix_len=500, **SETUP)
    fixed = PdStaging(FIXED, cfg)
    init = fixed.initial_states()[0]
    assert init.decode[0].status == KVPoll.Failed and init.chans[DOWN][0] == (("ABORT", 0, 0),)
    state, bad = happy_path(fixed)
    assert bad is None and fixed.done(state) and set(state.decode[0].rows) == {data.UNWRITTEN}
    state, bad = happy_path(PdStaging(PRE, cfg))
    assert bad[0] == "unaligned_prefix_fails_room"


# -- exhaustive search -----------------------------------------------------------------------------

def test_fixed_default_configuration_is_clean():
    system = DESCRIPTOR.build_system(FIXED, {p.name: p.default for p in REG.model("pd-staging").params})
    result = explore(system)
    assert result.violations == [] and result.bound_hit is None and result.states > 1000


def test_l1_without_faults_every_room_succeeds_on_both_sides():
    result, violations = _explore(FIXED, rooms=2, prompt_len=1, timeouts=False)
    assert violations == {}
    store = result._store
    finals = [s for s, done in zip(store.states, store.done) if done]
    assert finals and all(d.status == KVPoll.Success for s in finals for d in s.decode)
    assert all(p.outcome == KVPoll.Success for s in finals for rooms in s.prefill for p in rooms)


def test_pre_fix_violations_on_the_default_configuration():
    _, violations = _explore(PRE, faults=("drop_ready", "abort", "peer_death"))
    assert set(violations) == {"no_early_teardown", "every_room_concludes"}


def test_deadline_fails_the_room_after_a_lost_chunk_ready():
    """L2: all ranks succeeded, slot 0's CHUNK_READY was lost; fixed fails the room at the deadline."""
    cfg = Config(chunked_prefill_size=1, prompt_len=2, faults=("drop_ready",))
    ready0, ready1 = ("READY", 0, 0, 0, 1, 0), ("READY", 0, 1, 1, 1, 0)
    trace = [("batch", 0), ("batch", 0),
             ("deliver", UP, 0, ("REQ", 0, 0, 1, 0)), ("deliver", UP, 0, ("REQ", 0, 1, 1, 0)),
             ("deliver", DOWN, 0, ("RSP", 0, 0, 0, 0, 0, 0, 1)), ("deliver", DOWN, 0, ("RSP", 0, 1, 0, 1, 1, 0, 2)),
             ("work", 0), ("work", 0), ("drop", UP, 0, ready0), ("deliver", UP, 0, ready1),
             ("deliver", UP, 0, ("STATUS", 0, 0, int(KVPoll.Success))), ("scatter_done", 0, 1)]
    fixed = PdStaging(FIXED, cfg)
    stuck = run_actions(fixed, typed(trace))[-1]
    assert stuck.decode[0].all_success and ("deadline", 0) in fixed.enabled(stuck)
    assert fixed.step(stuck, typed([("deadline", 0)])[0]).decode[0].status == KVPoll.Failed


@pytest.mark.parametrize("bug_id", [
    "sglang-05c7ebf-staging-prefix-overwrite", "sglang-05c7ebf-staging-blind-tail",
    "sglang-05c7ebf-staging-early-teardown", "sglang-05c7ebf-staging-no-deadline",
    "sglang-05c7ebf-staging-unaligned-prefix", "sglang-05c7ebf-staging-lost-req-success",
    "sglang-05c7ebf-staging-dup-ready", "sglang-05c7ebf-staging-skip-pop",
    "sglang-05c7ebf-staging-stale-write-after-release", "sglang-05c7ebf-staging-lost-watermark",
    "sglang-05c7ebf-staging-late-req-realloc"])
def test_bug_reports_hold(bug_id):
    bug = REG.bug(bug_id)
    result = reproduce(bug)
    assert result.ok
    if bug.status != "not reproducible":
        assert result.reproduced and result.counterexample["trace"]


def test_blind_tail_counterexample_is_the_tail_scatter():
    bug = REG.bug("sglang-05c7ebf-staging-blind-tail")
    result = reproduce(bug)
    assert result.counterexample["trace"][-1] == ["reorder", UP, 0, ["STATUS", 0, 0, int(KVPoll.Success)]]
    assert "token 1 head 0: room 0 token 2" in result.message and "stale ring bytes" in result.message


def test_open_findings_counterexamples():
    lost = reproduce(REG.bug("sglang-05c7ebf-staging-lost-req-success"))
    assert ["drop", UP, 0, ["REQ", 0, 0, 1, 0]] in lost.counterexample["trace"]
    assert "never written" in lost.message
    dup = reproduce(REG.bug("sglang-05c7ebf-staging-dup-ready"))
    assert dup.counterexample["trace"][-3][0] == "duplicate" and "head 1: stale ring bytes" in dup.message
    # one lost STAGING_REQ is masked when two writers prefetch the same slot
    _, violations = _explore(FIXED, writers=2, prompt_len=2, chunked_prefill_size=1, faults=("drop_req",),
                             timeouts=False)
    assert "success_commits_prefill_kv" not in violations


def test_stale_write_after_release_needs_a_wrapped_ring():
    bad = reproduce(REG.bug("sglang-05c7ebf-staging-stale-write-after-release"))
    assert ["abort", 0] in bad.counterexample["trace"] and "room 1" in bad.message and "room 0 token 0" in bad.message
    # with room for both slots there is no wrap, and no stale write lands in another room's slot
    _, violations = _explore(FIXED, rooms=2, prompt_len=1, faults=("abort",), timeouts=False)
    assert violations == {}
    # the waiting timeout does the same as the abort
    _, violations = _explore(FIXED, rooms=2, prompt_len=1, ring_units=1)
    assert "suffix_rows_match_prefill" in violations


# -- invariants can fail; stateful property ---------------------------------------------------------

def test_invariants_fail_on_planted_states():
    system = PdStaging(FIXED, Config(decode_prefix_len=1, prompt_len=3))
    s = system.initial_states()[0]
    checks = {i.name: i for i in system.invariants}
    assert all(i.check(s) is None for i in system.invariants)
    assert "expected unchanged" in checks["shared_prefix_rows_unchanged"].check(s._replace(prefix=(7,)))
    d = s.decode[0]
    wrong = s._replace(decode=(d._replace(rows=(data.value(0, 2, 0),) + d.rows[1:]),))
    assert "token 1 head 0: room 0 token 2" in checks["suffix_rows_match_prefill"].check(wrong)
    done = s._replace(decode=(d._replace(status=KVPoll.Success),))
    assert "never written" in checks["success_commits_prefill_kv"].check(done)
    leak = s._replace(decode=(d._replace(registered=False),), owners=((0, 0),))
    assert "slots [0]" in checks["no_room_state_after_teardown"].check(leak)
    flagged = s._replace(flags=(("outstanding_never_negative", "got -1"),))
    assert checks["outstanding_never_negative"].check(flagged) == "got -1"


def test_stateful_property():
    prop = REG.property("pd-staging", "staging_invariants")
    assert run_property(prop, FIXED, max_examples=60, seed=0).status == "passed"
    bad = run_property(prop, PRE, max_examples=500, seed=0,
                       params=dict(REG.bug("sglang-05c7ebf-staging-prefix-overwrite").params))
    assert bad.status == "failed" and bad.counterexample["invariant"] == "shared_prefix_rows_unchanged"


@pytest.mark.parametrize("variant, kw", [
    ("fixed", dict(rooms=2, faults=("drop_ready", "abort", "peer_death", "reorder", "dup_req"))),
    ("sglang_0_5_23", dict(writers=2, dsts=2, prompt_len=3, faults=("defer_dst", "release_timeout", "drop_ack"))),
    ("pre_05c7ebf", dict(faults=("drop_req", "drop_status"))),
])
def test_is_enabled_is_membership_in_enabled(variant, kw):
    """Each rule's precondition (read by `is_enabled`) is the condition `enabled` lists its action under."""
    actions, wrong = RULES.disagreements(PdStaging(VARIANTS[variant], Config(**kw)))
    assert len({a.tag for a in actions}) >= 6
    assert not wrong


def test_bad_fault_kind_is_a_config_error():
    with pytest.raises(ValueError, match="faults"):
        DESCRIPTOR.build_system(FIXED, {**{p.name: p.default for p in REG.model("pd-staging").params}, "faults": "meteor"})


def test_state_records_replace_fields_as_namedtuple_does():
    """The state records' one-call `_replace` (`state._fast_replace`): each field, and several at once, replaced
    as namedtuple's own `_replace` would (the same type, the other fields kept); an unknown field refused."""
    from kvsim.models.pd_staging.state import Chunk, DecodeRoom, PrefillRoom, StagingState

    for cls in (Chunk, PrefillRoom, DecodeRoom, StagingState):
        fields = cls._fields
        record = cls._make(f"{f}-old" for f in fields)
        for i, f in enumerate(fields):
            new = record._replace(**{f: "new"})
            assert type(new) is cls and list(new) == [("new" if j == i else v) for j, v in enumerate(record)]
        both = record._replace(**{fields[0]: 1, fields[-1]: 2})
        assert both == cls._make([1, *record[1:-1], 2]) and record._replace() == record
        with pytest.raises(TypeError):
            record._replace(not_a_field=1)


def test_state_field_setters_are_replace():
    """`state.field_setter` (a step's hot path) is `_replace` of that one field, for every field of the state and
    of a prefill room."""
    from kvsim.models.pd_staging.state import PrefillRoom, StagingState, field_setter, set_chans, set_offsets

    for cls in (StagingState, PrefillRoom):
        record = cls._make(f"{f}-old" for f in cls._fields)
        for f in cls._fields:
            new = field_setter(cls, f)(record, "new")
            assert type(new) is cls and new == record._replace(**{f: "new"})
    state = StagingState._make(StagingState._fields)
    assert set_chans(state, "c") == state._replace(chans="c")
    room = PrefillRoom._make(PrefillRoom._fields)
    assert set_offsets(room, "o") == room._replace(offsets="o")


def test_send_each_is_a_send_per_message():
    """`_send_each` (one state built for a message to each writer) is `_send` of each message in turn: the same
    state and the same effects, writers in any order and twice; a dead prefill sends nothing up."""
    system = PdStaging(FIXED, StagingSystemConfig(rooms=2, writers=3))
    s0 = next(iter(system.initial_states()))
    s0 = system._send(s0, DOWN, 1, [], ("WM", 1, 0, 0))
    sends = [(2, ("WM", 2, 0, 1)), (0, ("WM", 0, 0, 1)), (2, ("WM", 2, 0, 2))]
    for side, state in ((DOWN, s0), (UP, s0), (UP, s0._replace(dead=True))):
        fx_each, fx_one = [], []
        s_one = state
        for w, m in sends:
            s_one = system._send(s_one, side, w, fx_one, m)
        assert system._send_each(state, side, fx_each, sends) == s_one and fx_each == fx_one
    assert system._send_each(s0, DOWN, [], []) is s0


def test_remove_takes_the_first_occurrence():
    """`state.remove`: the head taken at once, else the first equal item (the channel's delivery either way)."""
    from kvsim.models.pd_staging.state import remove

    seq = (("A", 1), ("B", 2), ("A", 1), ("C", 3))
    for item in set(seq):
        i = seq.index(item)
        assert remove(seq, item) == seq[:i] + seq[i + 1:]
    assert remove((("A", 1),), ("A", 1)) == ()
    with pytest.raises(ValueError):
        remove((), ("A", 1))


def test_row_mismatches_names_each_cell_that_is_not_the_rooms_kv():
    """A room's rows compared in one pass first (`data._expected_rows`), then cell by cell where they differ."""
    cfg = StagingSystemConfig(rooms=3, writers=2, prompt_len=10, decode_prefix_len=4, page_size=2)
    d, w = cfg.decode_prefix_len, cfg.writers
    good = [data.value(2, t, h) for t in range(d, cfg.prompt_len) for h in range(w)]
    pad = [data.UNWRITTEN] * (data.own_rows(cfg) * w - len(good))
    assert data.row_mismatches(tuple(good + pad), cfg, 2, allow_unwritten=False) == []
    assert data.row_mismatches(tuple(good + pad), cfg, 1, allow_unwritten=False)[0] == (d, 0, good[0])
    rows = list(good)
    rows[3], rows[5] = data.GARBAGE, data.UNWRITTEN  # token d+1 head 1; token d+2 head 1
    assert data.row_mismatches(tuple(rows + pad), cfg, 2, allow_unwritten=True) == [(d + 1, 1, data.GARBAGE)]
    assert data.row_mismatches(tuple(rows + pad), cfg, 2, allow_unwritten=False) == [
        (d + 1, 1, data.GARBAGE), (d + 2, 1, data.UNWRITTEN)]
    last = tuple(good[:-1] + [data.GARBAGE] + pad)  # the last row's last head: the one-pass compare covers it
    assert data.row_mismatches(last, cfg, 2, allow_unwritten=True) == [(cfg.prompt_len - 1, w - 1, data.GARBAGE)]
