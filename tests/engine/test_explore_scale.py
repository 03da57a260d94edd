"""The explorer at scale: fingerprint store, symmetry reduction, worker processes and Ray give the same results."""

from __future__ import annotations

import pickle
import re
import time
from types import SimpleNamespace

import pytest

from clihelp import kvsim, kvsim_json
from kvsim.app import catalog
from kvsim.engine.canon import canonical_json
from kvsim.engine.descriptor import RunSpec
from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import ExploreOptions, explore, realize
from kvsim.engine.explore.fingerprint import FieldFingerprint
from kvsim.engine.explore import parallel
from kvsim.engine.explore.parallel import _search, absorb_level, explore_parallel, level_fits, same_code
from kvsim.engine.explore.partition import Partition
from kvsim.engine.explore.store import FingerprintSet, FingerprintStore
from kvsim.engine.interrupt import backstop
from kvsim.engine.memory import machine, over_budget, resident_bytes
from kvsim.engine.pools import RayPool
from kvsim.engine.system import first_violation, run_actions
from kvsim.models.pd_staging.symmetry import relabel, room_symmetry
from toys import Counter, Pair

# (model, variant): configurations with violations, hangs, and clean ones
REAL = (("swa-budget", "pre_af7c62e"), ("pd-staging", "pre_05c7ebf"), ("pd-staging", "fixed"),
        ("pd-protocol", "pre_35281"))


def outcome(result, with_paths: bool = True) -> tuple:
    violations = [(v.property, v.kind, v.trace if with_paths else len(v.trace)) for v in result.violations]
    if not with_paths:  # workers report the same violations; ties in depth come in an order that follows hashing
        violations.sort()
    assert sum(result.levels) == result.states and len(result.levels) == result.depth + 1
    reached = [(r.name, r.status, r.depth, r.trace if with_paths else None) for r in result.reachability]
    return (result.states, result.transitions, result.depth, result.hang_states, violations,
            result.coverage.to_json(), result.bound_hit, result.levels, reached)


def run_of(model: str, variant: str) -> RunSpec:
    return RunSpec.resolve(catalog.models().model(model), variant, {})


def assert_replays_to_violation(system, violation) -> None:
    """The reported path is a path of the real system and ends where the report says."""
    state = next(iter(system.initial_states()))
    for saved in violation.trace:  # as `kvsim replay` does: the enabled action with that JSON form
        action = next(a for a in system.enabled(state) if canonical_json(a) == canonical_json(saved))
        state = system.step(state, action)
    states = run_actions(system, [], state)
    if violation.kind == "invariant":
        assert first_violation(system, states[-1])[0] == violation.property
    else:
        assert not system.done(states[-1])


# -- the fingerprint store -------------------------------------------------------------------------------------

def test_fingerprint_set_keeps_every_key_through_growth():
    fps = FingerprintSet(capacity=4)
    keys = [(k * 0x9E3779B97F4A7C15) % (1 << 64) or 1 for k in range(1, 5000)]
    for i, k in enumerate(keys):
        assert fps.get(k) is None
        fps.put(k, i)
    assert [fps.get(k) for k in keys] == list(range(len(keys)))
    assert fps.count == len(keys) and 4 * fps.count <= 3 * (fps.mask + 1)


@pytest.mark.parametrize("model,variant", REAL)
def test_fingerprint_store_finds_what_the_full_store_finds(model, variant):
    system = run_of(model, variant).system()
    full, compact = explore(system), explore(system, ExploreOptions(store="fingerprint"))
    assert outcome(compact) == outcome(full)
    assert [v.state for v in compact.violations] == [v.state for v in full.violations]
    assert compact.collision_probability == full.states * (full.states - 1) / 2 / 2.0 ** 64


def test_fingerprint_store_is_compact():
    # pd-staging's default configuration: every array counted, the hash table at its real load
    result = explore(run_of("pd-staging", "fixed").system(), ExploreOptions(store="fingerprint"))
    assert result.bytes_per_state <= 64
    assert isinstance(result._store, FingerprintStore)
    with pytest.raises(ValueError, match="full store"):
        result.graph()


def test_fingerprint_store_rebuilds_states_by_replay():
    system = Counter(limit=12, bad=None)
    result = explore(system, ExploreOptions(store="fingerprint"))
    store = result._store
    assert sorted(store.state(sid) for sid in range(len(store))) == list(range(13))


# -- symmetry ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"gap": None, "jam": True}, {"gap": 3, "jam": True}])
def test_symmetry_keeps_the_verdicts_and_stores_fewer_states(kw):
    system = Pair(**kw)
    every, reduced = explore(system, ExploreOptions(symmetry=False)), explore(system)
    assert reduced.symmetry and not every.symmetry
    assert reduced.states < every.states
    assert [v.property for v in reduced.violations] == [v.property for v in every.violations]
    assert [len(v.trace) for v in reduced.violations] == [len(v.trace) for v in every.violations]
    assert (reduced.hang_states > 0) == (every.hang_states > 0)
    for v in reduced.violations:
        assert_replays_to_violation(system, v)


def test_symmetry_paths_are_real_paths_with_the_fingerprint_store_too():
    system = Pair(gap=3, jam=True)
    result = explore(system, ExploreOptions(store="fingerprint"))
    assert {v.property for v in result.violations} == {"close_together", "both_finish"}
    for v in result.violations:
        assert_replays_to_violation(system, v)


def test_a_canonical_form_that_is_no_symmetry_is_caught_when_a_path_is_mapped_back():
    system = Pair(lopsided=True)
    with pytest.raises(AssertionError, match="not a symmetry"):
        realize(system, system.canonical, [(0, 0), (2, 0)])  # no step of the real system reaches (2, 0)


# -- pd-staging's rooms and dead prefill --------------------------------------------------------------------------

# (variant, params): clean, an invariant violation, a hang (a second fault after the prefill died: the quotient of
# its channels is in play), the wrapped ring of 0.5.23
STAGING_SMALL = (("pre_05c7ebf", {"rooms": 2, "prompt_len": 1}),
                 ("fixed", {"rooms": 2, "prompt_len": 1, "ring_units": 1, "timeouts": 0}),
                 ("fixed", {"rooms": 2, "prompt_len": 1, "fault_budget": 2, "timeouts": 0,
                            "faults": "drop_wm,drop_abort,peer_death,abort"}),
                 ("sglang_0_5_23", {"rooms": 2, "prompt_len": 1, "ring_units": 1, "timeouts": 0}))


def staging(variant, params):
    return RunSpec.resolve(catalog.models().model("pd-staging"), variant, params).system()


def verdicts(result) -> tuple:
    return (sorted((v.property, v.kind, len(v.trace)) for v in result.violations), result.hang_states > 0,
            result.bound_hit)


@pytest.mark.parametrize("variant,params", STAGING_SMALL)
def test_pd_staging_room_symmetry_keeps_every_verdict(variant, params):
    system = staging(variant, params)
    every, reduced = explore(system, ExploreOptions(symmetry=False,
                                                    store="fingerprint")), explore(system,
                                                                                   ExploreOptions(store="fingerprint"))
    assert reduced.symmetry and reduced.states < every.states / 2
    assert verdicts(reduced) == verdicts(every)
    for v in reduced.violations:
        assert_replays_to_violation(system, v)
        if v.kind == "invariant":  # the message is the real state's, not the representative's
            assert v.message == first_violation(system, v.state)[1]


def test_pd_staging_canonical_form_is_one_per_orbit():
    system = staging("fixed", {"rooms": 2, "prompt_len": 1, "ring_units": 1, "fault_budget": 2, "timeouts": 0,
                               "faults": "drop_wm,drop_abort,peer_death,abort"})
    states = explore(system, ExploreOptions(symmetry=False, max_states=3000))._store.states
    canon = system.canonical
    swapped = 0
    for s in states:
        c = canon(s)
        other = relabel(s, (1, 0))
        assert relabel(other, (1, 0)) == s  # the relabelling is a permutation of the states
        assert canon(other) == c and canon(c) == c
        assert system.done(c) == system.done(s)
        assert (first_violation(system, c) or ("",))[0] == (first_violation(system, s) or ("",))[0]
        swapped += other != s
    assert swapped > len(states) // 2  # most states are not their own mirror image


def test_pd_staging_rooms_are_not_interchangeable_where_the_initial_state_orders_them():
    # an unaligned decode prefix fails every room at registration: the ABORTs go out in room order to a live prefill
    unaligned = {"rooms": 2, "prompt_len": 3, "decode_prefix_len": 1, "page_size": 2}
    assert room_symmetry(staging("fixed", unaligned)) is None
    assert staging("fixed", {"rooms": 1}).canonical is None
    assert staging("fixed", {"rooms": 2}).canonical is not None


# -- workers and Ray ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model,variant", REAL)
def test_two_worker_processes_find_what_one_process_finds(model, variant):
    run = run_of(model, variant)
    one = explore(run.system())
    two = explore_parallel(run.system, 2)
    assert outcome(two, with_paths=False) == outcome(one, with_paths=False)
    for v in two.violations:
        assert_replays_to_violation(run.system(), v)


def test_workers_with_the_fingerprint_store_and_symmetry():
    one = explore(Pair(gap=3, jam=True))
    three = explore_parallel(lambda: Pair(gap=3, jam=True), 3, ExploreOptions(store="fingerprint"))
    assert outcome(three, with_paths=False) == outcome(one, with_paths=False)
    for v in three.violations:
        assert_replays_to_violation(Pair(gap=3, jam=True), v)


@pytest.mark.parametrize("store", ["full", "fingerprint"])
def test_a_worker_takes_a_canonical_form_once_per_successor_met_lately(store):
    # as one process, a worker puts a successor as stepped in its canonical form once, not once a transition (not
    # again where it met that successor this level or at a level before), and routes the form: what one process
    # finds, with fewer forms taken than transitions
    parts = [Partition(lambda: Pair(limit=12, gap=None), w, 2, store, True, None) for w in range(2)]
    forms = [0]

    def counted(canon):
        def form(state):
            forms[0] += 1
            return canon(state)
        return form

    for part in parts:
        part.canon = counted(part.canon)
    two = _search(Pair(limit=12, gap=None), Inline(parts), 2, time.perf_counter(), ExploreOptions(store=store))
    for part in parts:
        part.finish()
    assert outcome(two, with_paths=False) == outcome(explore(Pair(limit=12, gap=None)), with_paths=False)
    assert 0 < forms[0] < 0.9 * two.transitions  # (132 forms for 168 transitions; one a transition before)


def test_ray_local_cluster_finds_what_one_process_finds():
    pytest.importorskip("ray", reason="ray is in the test extra; CI installs it")
    run = run_of("pd-staging", "pre_05c7ebf")
    one = explore(run.system())
    on_ray = explore_parallel(run.system, 2, use_ray=True)
    assert outcome(on_ray, with_paths=False) == outcome(one, with_paths=False)


@pytest.mark.parametrize("factory", [lambda: run_of("pd-staging", "pre_05c7ebf").system(),
                                     lambda: Pair(gap=3, jam=True)], ids=["livelock", "deadlock"])
def test_workers_name_the_hang_one_process_names(factory):
    # the liveness pass runs in the workers, in rounds that pass predecessors to their owners
    def hangs(result):
        return [(v.property, v.message, len(v.trace)) for v in result.violations if v.kind == "hang"]

    one, three = explore(factory()), explore_parallel(factory, 3, ExploreOptions(store="fingerprint"))
    assert hangs(three) == hangs(one) and len(hangs(one)) == 1
    assert three.hang_states == one.hang_states > 0


def test_ray_workers_pass_their_states_past_the_coordinator():
    # an outbox for another worker reaches the coordinator as a reference into Ray's object store, not as bytes
    ray = pytest.importorskip("ray", reason="ray is in the test extra; CI installs it")
    run = run_of("pd-staging", "pre_05c7ebf")
    pool = RayPool(Partition, run.system, 2, "local", store="fingerprint", symmetry=True, max_depth=None)
    try:
        inboxes = [[box] for box in pool.one(0, "initial")]
        for depth in range(3):
            absorb_level(pool, 2, inboxes, depth)
            outboxes = [e[0] for e in pool.call("expand", [(), ()])]
            inboxes = [[outboxes[src][dst] for src in range(2)] for dst in range(2)]
        assert outboxes[0][0] is None and outboxes[1][1] is None
        assert isinstance(outboxes[0][1], ray.ObjectRef) and isinstance(outboxes[1][0], ray.ObjectRef)
        assert sum(a[0] for a in absorb_level(pool, 2, inboxes, 3)) > 0  # keys and states read by reference
    finally:
        pool.close()


class Inline:
    """Partitions in this process, as a pool; `answers[method]`: what the last call of each method returned."""

    def __init__(self, parts):
        self.parts, self.answers = parts, {}

    def call(self, method, args):
        self.answers[method] = [getattr(part, method)(*a) for part, a in zip(self.parts, args)]
        return self.answers[method]

    def one(self, worker, method, *args):
        return getattr(self.parts[worker], method)(*args)


def test_a_fingerprint_is_taken_once_and_a_known_state_is_not_sent():
    # with the fingerprint store a worker takes the fingerprint at most once per distinct successor of the level
    # (not again for one it met at a level before) and sends keys and edges; its owner takes none, and asks for
    # the states it finds new, nothing else
    run = run_of("pd-staging", "fixed")
    parts = [Partition(run.system, w, 2, "fingerprint", True, None) for w in range(2)]
    calls = [0, 0]
    for w, part in enumerate(parts):
        part.fp = Counted(part.fp, calls, w)
    try:
        routed, crossed, sent, new, taken, mine = route_levels(parts, calls)
        transitions = sum(sum(part.fired.values()) for part in parts)
    finally:
        for part in parts:  # each partition paused the collector (closed by `finish`)
            part.finish()
    assert routed < transitions  # a successor reached twice in a level is routed once
    assert taken < routed  # a successor met at a level before is not fingerprinted again
    assert 0 < sent < crossed and sent < new  # only new states travel, and not every new one came from afar
    assert mine > 0  # some of them reached by both workers (the owner's own is taken, not sent for: `route_levels`)


class Counted:
    """A partition's fingerprint, counting in `calls[w]` the fingerprints it takes (whole, or from a parent's)."""

    def __init__(self, fp, calls, w):
        self.fp, self.calls, self.w = fp, calls, w

    def __call__(self, state):
        self.calls[self.w] += 1
        return self.fp(state)

    def expanding(self, state, key):
        self.fp.expanding(state, key)

    def successor(self, state):
        self.calls[self.w] += 1
        return self.fp.successor(state)

    def held(self, state):
        return self.fp.held(state)


def route_levels(parts, calls):
    """Six levels over in-process partitions, checking the fingerprints each takes, that each key routed is its
    state's fingerprint (taken afresh, or kept from a level before) and that only keys go out with `expand`:
    (entries routed, of them to the other worker, states sent for, new states, fingerprints taken, entries from the
    other worker that the owner reached too)."""
    pool = Inline(parts)
    inboxes = [[box] for box in parts[0].initial()]
    routed = crossed = sent = new = pending = taken = mine = 0
    whole = FieldFingerprint()
    for depth in range(6):
        before, crossed = list(calls), crossed + pending  # entries from the other worker taken in this level
        owns = [set(part.own[1]) if part.own is not None else set() for part in parts]  # what each reached itself
        boxes = [[None if box is None else pickle.loads(box) for box in inbox] for inbox in inboxes]
        new += sum(r[0] for r in absorb_level(pool, 2, inboxes, depth))
        sent += sum(len(positions) for a in pool.answers["absorb"] for positions in a)
        # the owner took no fingerprint of an entry it was sent, but of each state it took whole, the initial ones
        # and those it sent for: made of the field values its fingerprint holds (`Partition.hold`)
        whole_in = [sum(map(len, asked)) + sum(len(box[0]) for box in inbox if box is not None and box[0] is not None)
                    for asked, inbox in zip(pool.answers["absorb"], boxes)]
        assert [c - b for c, b in zip(calls, before)] == whole_in
        before = list(calls)
        for dst, asked in enumerate(pool.answers["absorb"]):  # a state its owner reached too is not sent for
            for box, positions in zip(boxes[dst], asked):
                if box is not None:  # (its own outbox is None here)
                    assert not owns[dst].intersection(box[1][i] for i in positions)
                    mine += len(owns[dst].intersection(box[1]))
        outboxes = [part.expand()[0] for part in parts]
        cross = [[pickle.loads(b) for b in out if b is not None] for out in outboxes]
        assert all(box[0] is None for boxes in cross for box in boxes)  # keys and edges only
        cross = [[key for box in boxes for key in box[1]] for boxes in cross]
        entries = [len(part.own[1]) + len(c) for part, c in zip(parts, cross)]
        assert all(0 <= c - b <= e for c, b, e in zip(calls, before, entries))
        for w, part in enumerate(parts):
            for dst in range(2):
                keys = part.own[1] if dst == w else pickle.loads(outboxes[w][dst])[1]
                assert list(keys) == [whole(state) for state in part.held[dst]]
        routed += sum(entries)
        taken += sum(calls) - sum(before)
        pending = sum(map(len, cross))
        inboxes = [[outboxes[src][dst] for src in range(2)] for dst in range(2)]
    return routed, crossed, sent, new, taken, mine


# -- the command line --------------------------------------------------------------------------------------------

def test_cli_workers_and_store_agree_with_the_plain_run():
    base = kvsim_json("explore", "pd-staging", "--variant", "pre_05c7ebf", expect=1)
    for extra in (("--workers", "2"), ("--store", "fingerprint")):
        doc = kvsim_json("explore", "pd-staging", "--variant", "pre_05c7ebf", *extra, expect=1)
        for key in ("states", "transitions", "depth", "hang_states", "coverage"):
            assert doc[key] == base[key], (extra, key)
        assert [len(v["trace"]) for v in doc["violations"]] == [len(v["trace"]) for v in base["violations"]]
    assert doc["store"] == "fingerprint" and doc["bytes_per_state"] > 0 and doc["collision_probability"] > 0


def test_a_partitioned_run_reports_the_same_paths_under_any_hash_seed_and_store():
    # workers route a state by its fingerprint (its fields' BLAKE2b codes), never by `hash`: which worker owns a
    # state, and so which of several shortest paths is reported, is the same in every run, and both stores
    # (states kept whole or as the same fingerprints) route alike
    def run(seed, *extra):
        doc = kvsim_json("explore", "pd-staging", "--variant", "pre_05c7ebf", "--workers", "2", *extra,
                         env={"PYTHONHASHSEED": seed}, expect=1)
        for key in ("seconds", "states_per_second", "store", "bytes_per_state", "collision_probability"):
            doc.pop(key, None)
        return doc

    full = run("0")
    assert [len(v["trace"]) for v in full["violations"]] == [8, 10]
    assert run("1") == full == run("2", "--store", "fingerprint")


def test_a_search_stops_cleanly_at_its_memory_bound():
    # 0.05 GiB is passed at once (an interpreter with the model loaded holds more): the search stops at its first
    # check, says so and proves nothing; the same search with the default bound finishes
    doc = kvsim_json("explore", "pd-staging", "--param", "rooms=2", "--max-memory", "0.05", expect=3)
    assert doc["bound_hit"] == "memory" and doc["complete"] is False and doc["violations"] == []
    assert 0 < doc["states"] < 100_000
    finished = kvsim_json("explore", "pd-staging", "--variant", "pre_05c7ebf", expect=1)
    assert finished["complete"] is True
    # two forked workers, each a copy of the command's process, do not fit beside it in 0.05 GiB: refused unforked
    refused = kvsim_json("explore", "pd-staging", "--param", "rooms=2", "--max-memory", "0.05", "--workers", "2",
                         expect=2)["error"]
    assert refused["field"] == "--workers" and refused["expected"].startswith("at most 0 forked workers")


def test_forked_workers_stop_cleanly_at_the_memory_bound():
    # a bound that holds two forks of the command's process beside it and not the search: it stops between two
    # levels (in a fresh command: the forks of a test process as large as pytest's would ask a bound that the
    # search takes minutes to fill). The command's size on this machine (about 30-40 MiB) is what its refusal of
    # two forks in 0.05 GiB names; three copies and 48 MiB for the search's first levels is the bound (a fixed
    # 0.25 GiB ran the search for minutes to fill it, the same stop)
    refused = kvsim_json("explore", "pd-staging", "--param", "rooms=2", "--store", "full", "--workers", "2",
                         "--max-memory", "0.05", expect=2)["error"]["expected"]
    own = int(re.search(r"a copy of this (\d+) MiB process", refused).group(1))
    bound = (3 * own + 48) / 1024
    doc = kvsim_json("explore", "pd-staging", "--param", "rooms=2", "--store", "full", "--workers", "2",
                     "--max-memory", f"{bound:.4f}", expect=3)
    assert doc["bound_hit"] == "memory" and doc["complete"] is False and doc["violations"] == []
    assert 0 < doc["states"] < 988_343


@pytest.mark.parametrize("elsewhere", [False, True])
def test_the_memory_bound_holds_on_each_machine(elsewhere):
    # two workers in this process, each reporting its resident size R: on this machine, with the coordinator's R,
    # they hold 3R against a bound of 2.5R, and the search stops; said to run on two other machines, each holds R,
    # and it finishes (a cluster's workers do not share one machine's memory)
    system = run_of("pd-staging", "pre_05c7ebf").system
    parts = [Partition(system, w, 2, "fingerprint", True, None) for w in range(2)]
    if elsewhere:
        for w, part in enumerate(parts):
            part.machine = lambda w=w: (f"node {w}", machine()[1])
    bound = int(2.5 * resident_bytes())
    result = _search(system(), Inline(parts), 2, time.perf_counter(),
                     ExploreOptions(max_states=10 ** 7, check_liveness=False, store="fingerprint", max_memory=bound))
    assert result.bound_hit == (None if elsewhere else "memory")
    assert over_budget([(("a", 100), 60), (("a", 100), 30)], None, 0.8)  # 90 > 80% of a's 100 bytes
    assert not over_budget([(("a", 100), 60), (("b", 100), 30)], None, 0.8)
    assert over_budget([(("a", 100), 60), (("b", 100), 30)], 50, None)  # the bytes bound, on a alone


def test_workers_do_not_begin_a_level_they_expect_to_end_past_the_alarm(monkeypatch):
    # a level is expanded whole: where its states are slow (here 20 ms each, on a clock the levels move), one begun
    # before the budget ran out ended past the command line's alarm, which reports nothing; a level expected (at
    # the last level's pace) to end past it is not begun, and the search reports what it found
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(parallel, "time", SimpleNamespace(perf_counter=lambda: clock.now))

    def system():
        return Counter(limit=10 ** 6, bad=None)

    class Slow(Inline):
        def call(self, method, args):
            if method == "expand":  # the two workers' halves of the level, side by side
                clock.now += 0.02 * max(len(part.frontier) for part in self.parts)
            return super().call(method, args)

    parts = [Partition(system, w, 2, "fingerprint", False, None) for w in range(2)]
    result = _search(system(), Slow(parts), 2, 0.0, ExploreOptions(max_seconds=50, check_liveness=False,
                                                                    store="fingerprint", symmetry=False))
    # stopped at 43.9 s, with 6,765 states; begun regardless, the level of 4,181 ended at 70.0 s, 10 s past the alarm
    assert result.bound_hit == "seconds" and 25 < clock.now <= 50 + backstop(50) and result.states == 6765
    assert level_fits(50.0, 60.0, 60, 10.0, 100, 200) and not level_fits(50.0, 60.0, 60, 10.0, 100, 201)
    assert level_fits(0.0, 60.0, 60, 0.0, 0, 10 ** 9) and not level_fits(60.5, 60.0, 60, 0.0, 0, 1)


def test_workers_running_other_kvsim_sources_are_refused():
    # a cluster node with another kvsim installed would search another system: refused before the search
    system = run_of("pd-staging", "pre_05c7ebf").system
    parts = [Partition(system, w, 2, "fingerprint", True, None) for w in range(2)]
    try:
        same_code(Inline(parts), 2)  # this tree everywhere
        parts[1].code = lambda: "0123456789abcdef"
        with pytest.raises(ConfigError, match=r"^ray: expected every worker running this kvsim .*, got "
                                              r"'sources 0123456789abcdef' \(worker 1: install"):
            same_code(Inline(parts), 2)
    finally:
        for part in parts:
            part.finish()


@pytest.mark.parametrize("args", [("--store", "fingerprint"), ("--workers", "2")])
def test_cli_refuses_a_graph_without_the_full_single_process_store(args, tmp_path):
    proc = kvsim("explore", "swa-budget", *args, "--graph", str(tmp_path / "g.graphml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "--graph" in proc.stderr
