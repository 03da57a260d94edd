"""pd-staging timed simulation: outcomes, timers, leaks, determinism, replay, and the actions it took."""

import json

import pytest

from kvsim.app import catalog
from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import run_actions
from kvsim.engine.trace import read_trace
from kvsim.models.pd_staging import DESCRIPTOR
from kvsim.models.pd_staging.sim import trace_actions

SPEC = catalog.load().model("pd-staging")


def run(variant="fixed", faults=None, seed=0, **params):
    return simulate_model(SPEC, variant, seed, {"requests": 100, **params}, faults)


def test_fixed_without_faults_every_room_succeeds_and_nothing_leaks():
    s = run().summary
    assert s["outcomes"] == {"Success": 100} and s["violations"] == []
    assert s["leaked_slots"] == 0 and s["held_prefill_rooms"] == 0 and s["worst_time_to_conclude"] < 1.0


def test_a_room_failed_before_its_request_arrives_concludes_as_it_arrives():
    # a decode prefix of 8 tokens on pages of 16 fails every decode room at registration, before any request arrives:
    # each request concludes as it arrives (it waited for nothing), not at time 0, before it came; the ABORT the
    # failure sends every writer goes as its room arrives, so the prefill clears the room (the ABORTs of the initial
    # state were never put on the wire: every prefill room was held, a violation on fixed)
    result = run(page_size=16, decode_prefix_len=8)
    s = result.summary
    assert s["outcomes"] == {"Failed: prefix not page-aligned": 100}
    assert s["mean_time_to_conclude"] == s["worst_time_to_conclude"] == 0.0
    assert s["violations"] == [] and s["held_prefill_rooms"] == 0
    arrived, aborts = {}, {}
    for step in result.recorder.steps:
        if step["event"] == "arrive":
            arrived[step["data"]] = step["t"]
        elif step["event"] == "deliver" and step["data"][2][0] == "ABORT":
            aborts.setdefault(step["data"][2][1], []).append(step["t"])
    assert sorted(aborts) == list(range(100)) and all(len(ts) == 2 for ts in aborts.values())  # each writer's
    assert all(min(ts) > arrived[room] for room, ts in aborts.items())


def test_pre_fix_decode_radix_hit_overwrites_the_shared_prefix():
    s = run("pre_05c7ebf").summary
    assert any(v.startswith("shared_prefix_rows_unchanged") for v in s["violations"])
    # without a decode radix hit the pre-fix path is clean on this workload
    assert run("pre_05c7ebf", decode_prefix_len=0).summary["violations"] == []


def test_lost_messages_conclude_on_fixed_and_hang_before():
    new = run("fixed", "drop=0.02", seed=1, requests=200).summary
    old = run("pre_05c7ebf", "drop=0.02", seed=1, requests=200).summary
    assert "never concluded" not in new["outcomes"] and new["leaked_slots"] == 0
    assert new["worst_time_to_conclude"] <= 600.0 + 1.0  # waiting timeout, then at most the completion deadline
    assert old["outcomes"]["never concluded"] > 0 and old["leaked_slots"] > 0


def test_prefill_death_fails_open_rooms_by_heartbeat():
    s = run(faults="crash=prefill@2").summary
    assert "never concluded" not in s["outcomes"] and s["outcomes"]["Failed: peer death (heartbeat)"] > 0
    assert s["worst_time_to_conclude"] <= 2 * 5.0 + 5.0 + 1.0 and s["leaked_slots"] == 0


def test_duplicated_chunk_ready_scatters_before_all_writers():
    s = run(faults="duplicate=0.05", requests=200, seed=1).summary
    assert any(v.startswith("scatter_after_all_writers") for v in s["violations"])  # the dup-ready finding
    assert run(faults="duplicate=0.05", requests=200, seed=1, writers=1).summary["violations"] == []


def test_trace_replays_and_is_seeded(tmp_path):
    faults = "delay=0.05:0.2"
    a, b, c = run(faults=faults, seed=3), run(faults=faults, seed=3), run(faults=faults, seed=4)
    assert a.digest == b.digest != c.digest
    path = tmp_path / "staging.jsonl"
    a.recorder.write(str(path))
    assert replay_trace(read_trace(str(path)), SPEC).matches


# -- what the simulation advertises it accepts -----------------------------------------------------------

@pytest.mark.parametrize("writers", [4, DESCRIPTOR.sim_config.__dataclass_fields__["writers"].default])
def test_every_advertised_writer_count_simulates(writers):
    """`--param writers=4` was advertised (1..8) and refused (<= 2): the bound is now written once."""
    spec = next(s for s in SPEC.sim_params if s.name == "writers")
    assert spec.minimum <= writers <= spec.maximum
    s = run(writers=writers, requests=30).summary
    assert s["outcomes"] == {"Success": 30} and s["violations"] == []


def test_largest_advertised_writer_count_simulates():
    top = next(s for s in SPEC.sim_params if s.name == "writers").maximum
    s = simulate_model(SPEC, "fixed", 0, [f"writers={top}", "requests=10"]).summary
    assert s["outcomes"] == {"Success": 10} and s["violations"] == []
    with pytest.raises(ConfigError, match="writers"):
        simulate_model(SPEC, "fixed", 0, [f"writers={top + 1}"])


def test_every_numeric_param_has_a_maximum():
    for spec in SPEC.params + SPEC.sim_params:
        if spec.kind in ("int", "float", "ints"):
            assert spec.maximum is not None, spec.name


# -- the simulation is a timing policy: its recorded actions replay through the transition system ---------

@pytest.mark.parametrize("variant, seed, faults", [
    ("fixed", 0, None),
    ("fixed", 3, "drop=0.02,delay=0.1:0.5,duplicate=0.02"),
    ("pre_05c7ebf", 1, "drop=0.05,reorder=0.1"),
    ("fixed", 2, "duplicate=0.05,crash=prefill@1.5"),
    ("sglang_0_5_23", 3, "drop=0.02,delay=0.1:0.5,duplicate=0.02"),  # frees that empty the ring start a fresh round
])
def test_recorded_actions_replay_to_the_drivers_state(variant, seed, faults):
    result = run(variant, faults, seed, requests=25)
    steps = [json.loads(line) for line in result.recorder.lines()[1:-1]]  # through JSON, as a trace file holds them
    actions = trace_actions(steps)
    assert actions == result.driver.actions and len(actions) > 100
    assert type(actions[0]) is type(result.driver.actions[0])  # decoded to the typed record, not a plain tuple
    states = run_actions(result.driver.system, actions)
    assert states[-1] == result.driver.state


# -- the rooms a run's violations are in, each named by the mechanism its evidence shows (issue 30) -----------

def named(variant, faults, seed):
    return [(e["room"], e["invariant"], e["mechanism"])
            for e in simulate_model(SPEC, variant, seed, {}, faults, keep_steps=False).summary["named"]]


def test_a_duplicated_chunk_ready_is_named_dup_ready():
    # the fixed model's scatter_after_all_writers under duplicate=0.05: one writer's CHUNK_READY counted twice
    assert named("fixed", "duplicate=0.05", 0) == [(9, "scatter_after_all_writers", "duplicated_chunk_ready")]


def test_another_rooms_kv_after_its_waiting_timeout_is_named_stale_write_after_release():
    assert named("fixed", "drop=0.02,delay=0.1", 0) == [
        (22, "suffix_rows_match_prefill", "stale_write_after_release"),
        (26, "suffix_rows_match_prefill", "stale_write_after_release")]


def test_a_success_with_rows_never_written_after_a_lost_staging_req_is_named_lost_req():
    assert named("fixed", "drop=0.02,delay=0.1", 2) == [
        (15, "prefill rooms never cleared", "staging_req_lost_or_late"),
        (15, "success_commits_prefill_kv", "staging_req_lost_or_late"),
        (36, "suffix_rows_match_prefill", "stale_write_after_release"),
        (43, "suffix_rows_match_prefill", "stale_write_after_release")]


def test_each_mechanism_needs_its_evidence():
    from kvsim.models.pd_staging import data
    from kvsim.models.pd_staging.mechanisms import Evidence, named as name_rooms
    from kvsim.models.pd_common.status import KVPoll

    class Room:
        def __init__(self, rows, status):
            self.rows, self.status = rows, status

    class State:
        def __init__(self, *rooms):
            self.decode = rooms

    cfg = DESCRIPTOR.build_system("fixed", {"rooms": 2, "prompt_len": 1, "writers": 1}).cfg
    span = cfg.prompt_len - cfg.decode_prefix_len
    room1_in_room0 = tuple(data.value(1, t, 0) for t in range(cfg.decode_prefix_len, cfg.prompt_len))
    state = State(Room(room1_in_room0, KVPoll.Success), Room((data.UNWRITTEN,) * span, KVPoll.Failed))

    def mechanism(evidence, deferred):
        return [e["mechanism"] for e in name_rooms(state, cfg, evidence, deferred)]

    assert mechanism(Evidence(), False) == [None]  # room 1 did not fail: no catalogued mechanism
    # room 0 scattered before its writer wrote (a CHUNK_READY counted twice): the ring's bytes as room 1 left them
    assert mechanism(Evidence(duplicated={0: {"READY"}}), False) == ["duplicated_chunk_ready"]
    assert mechanism(Evidence(duplicated={1: {"READY"}, 0: {"RSP"}}), False) == [None]  # another room's, not one
    assert mechanism(Evidence(failed={1: "abort"}), False) == ["stale_write_after_release"]
    assert mechanism(Evidence(failed={1: "abort"}), True) == [None]  # held for its ABORT_ACKs
    assert mechanism(Evidence(failed={1: "abort"}, released_by_timeout={1}), True) == [
        "stale_write_after_release_timeout"]
    unwritten = State(Room((data.UNWRITTEN,) * span, KVPoll.Success))
    assert [e["mechanism"] for e in name_rooms(unwritten, cfg, Evidence(), False)] == [None]
    assert [e["mechanism"] for e in name_rooms(unwritten, cfg, Evidence(delayed={0: {"REQ"}}), False)] == [
        "staging_req_lost_or_late"]


def test_the_simulate_command_prints_the_report_of_each_named_room(capsys):
    from kvsim.app.cli import main

    assert main(["simulate", "pd-staging", "--faults", "duplicate=0.05", "--seed", "0"]) == 1
    out = capsys.readouterr().out
    assert "room 9 scatter_after_all_writers: sglang-05c7ebf-staging-dup-ready (" in out
    assert main(["simulate", "pd-staging", "--faults", "duplicate=0.05", "--seed", "0", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [e["report"] for e in doc["summary"]["named"]] == ["sglang-05c7ebf-staging-dup-ready"]


def test_every_mechanism_is_the_mechanism_of_one_catalogued_report():
    from kvsim.models.pd_staging.mechanisms import MECHANISMS

    reports = [b.mechanism for b in catalog.load().bugs.values() if b.model == "pd-staging" and b.mechanism]
    assert sorted(reports) == sorted(MECHANISMS)


@pytest.mark.parametrize("variant, faults", [("fixed", "duplicate=0.05,crash=prefill@1.5"),
                                             ("pre_05c7ebf", "drop=0.05,delay=0.1:0.3")])
def test_a_step_that_queued_nothing_leaves_no_idle_worker_with_work(monkeypatch, variant, faults):
    """The simulation tries no idle worker after a step that enqueued no batch: that is only right while a worker
    is left idle (neither busy nor parked) with nothing to dequeue. Checked at every such step of faulty runs."""
    from kvsim.models.pd_staging.actions import Enqueued
    from kvsim.models.pd_staging.sim import _Run

    follow, checked = _Run._follow, []

    def checking(self, effects):
        if not any(type(e) is Enqueued for e in effects):
            state = self.driver.state
            idle = [w for w in range(len(self.busy)) if not self.busy[w] and not self.parked[w]
                    and self.system.work_enabled(state, w)]
            assert idle == [], f"worker {idle} idle with work after a step that queued nothing"
            checked.append(1)
        follow(self, effects)

    monkeypatch.setattr(_Run, "_follow", checking)
    run(variant, faults, seed=2, requests=40)
    assert len(checked) > 100


def test_a_writes_cells_are_the_cells_of_each_token():
    """`write_cells` writes a run of cells at once: the cells `value` gives token by token, clipped at the ring end."""
    from kvsim.models.pd_staging import data

    cfg = data.StagingSystemConfig(rooms=2, writers=2, page_size=4, prompt_len=30, decode_prefix_len=8)
    memory = tuple(range(-1, -1 - 64, -1))
    for room, writer, offset, alloc_pages, page_start, num_pages in [(0, 0, 0, 2, 0, 2), (1, 1, 3, 2, 1, 3),
                                                                   (1, 1, 14, 2, 0, 4), (0, 1, 20, 2, 0, 1)]:
        mem = list(memory)
        base = (offset + writer * alloc_pages) * cfg.page_size
        for j in range(num_pages * cfg.page_size):
            if base + j < len(mem):
                mem[base + j] = data.value(room, cfg.decode_prefix_len + page_start * cfg.page_size + j, writer)
        assert data.write_cells(memory, cfg, room, writer, offset, alloc_pages, page_start, num_pages) == tuple(mem)


def test_a_scatter_writes_each_head_slice_as_the_cell_by_cell_loop_does():
    """`scatter_into` writes a head slice's cells as strided runs: the rows and prefix rows the loop over
    `scatter_cells` writes, for runs in the prefix, across its end, in the room's rows, past them, past the ring's
    end, of no page, and (where it takes that loop) a token or an offset below zero; an index error there is its."""
    import random

    from kvsim.models.pd_staging import data

    rng = random.Random(7)
    for writers, page_size, prompt_len, prefix_len in [(1, 4, 30, 8), (2, 4, 30, 8), (3, 2, 17, 4), (2, 1, 9, 0),
                                                       (4, 3, 40, 12)]:
        cfg = data.StagingSystemConfig(rooms=2, writers=writers, page_size=page_size, prompt_len=prompt_len,
                                       decode_prefix_len=prefix_len)
        lo, top = prefix_len, prefix_len + data.own_rows(cfg)
        for _ in range(400):
            memory = tuple(rng.randrange(1, 10 ** 6) for _ in range(rng.randrange(0, 80)))
            offset, alloc_pages = rng.randrange(-3, 25), rng.randrange(0, 4)
            start, num_pages = rng.randrange(-6, top + 6), rng.randrange(0, 5)
            rows = [rng.randrange(10) for _ in range((top - lo) * writers)]
            prefix = [-rng.randrange(10) for _ in range(lo * writers)]
            want_rows, want_prefix, error = list(rows), list(prefix), None
            try:
                for t, h, cell in data.scatter_cells(memory, cfg, offset, alloc_pages, start, num_pages):
                    if t < lo:
                        want_prefix[t * writers + h] = cell
                    elif t < top:
                        want_rows[(t - lo) * writers + h] = cell
            except IndexError as exc:
                error = exc
            if error is not None:
                with pytest.raises(IndexError):
                    data.scatter_into(rows, prefix, memory, cfg, offset, alloc_pages, start, num_pages)
                continue
            data.scatter_into(rows, prefix, memory, cfg, offset, alloc_pages, start, num_pages)
            assert (rows, prefix) == (want_rows, want_prefix), (writers, memory, offset, alloc_pages, start, num_pages)


def test_rooms_not_begun_are_checked_without_their_expected_rows(monkeypatch):
    """The end-of-run checks of a workload most of whose rooms never began (a budget cut it) see their blank rows
    at once (100,000 rooms of 32,760 cells each built their expected rows and walked them: past the budget's
    backstop, nothing reported): the same verdicts, and the expected rows built only for rooms written to."""
    from kvsim.models.pd_staging import data

    built = []
    real = data._expected_rows
    monkeypatch.setattr(data, "_expected_rows", lambda *a: built.append(a[-1]) or real(*a))
    result = simulate_model(DESCRIPTOR, "fixed", 0, {"requests": 400, "prompt_len": 300}, max_events=400)
    assert not result.complete and result.summary["violations"] == []
    begun = {r for r, d in enumerate(result.driver.state.decode) if d.rows is not data.blank_rows(len(d.rows))}
    assert 0 < len(begun) < 100 and set(built) <= begun
    rows = data.blank_rows(len(result.driver.state.decode[0].rows))
    cfg = result.driver.system.cfg
    assert data.row_mismatches(rows, cfg, 0, allow_unwritten=True) == []
    assert len(data.row_mismatches(rows, cfg, 0, allow_unwritten=False)) == (cfg.prompt_len - cfg.decode_prefix_len) \
        * cfg.writers
    equal = tuple(list(rows))  # an equal tuple, another object: counted
    assert equal is not rows and data.row_mismatches(equal, cfg, 0, allow_unwritten=True) == []
