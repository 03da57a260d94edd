"""Reachability declarations (`Sometimes`): the explorer reports each reached, with the depth and a shortest path
to the first state (or step) that met it, or unreached after a complete search, or not reached within a bound;
every model's default search reaches all of its own, and an over-constrained model is caught."""

import json

import pytest

from kvsim.app import catalog, cli
from kvsim.engine.canon import to_jsonable
from kvsim.engine.explore import NOT_WITHIN_BOUND, REACHED, UNREACHED, ExploreOptions, action_kind, explore
from kvsim.engine.explore.parallel import explore_parallel
from kvsim.engine.system import Sometimes, sometimes
from toys import Counter, Pair


def counter(limit: int = 10, asked: list | None = None) -> Counter:
    system = Counter(limit=limit, bad=None)

    def seven(s: int) -> bool:
        if asked is not None:
            asked.append(s)
        return s == 7

    system.sometimes = (Sometimes("seven", seven, "the counter shows 7"),
                        Sometimes("negative", lambda s: s < 0, "the counter goes below 0"),
                        Sometimes("doubled_to_8", lambda s, a, t: a == ("double",) and t == 8, "x2 reaches 8",
                                  step=True),
                        Sometimes("doubled_below_0", lambda s, a, t: a == ("double",) and t < 0, step=True))
    return system


def pair() -> Pair:
    system = Pair(gap=None)
    system.sometimes = (Sometimes("two_apart", lambda s: abs(s[0] - s[1]) == 2),
                        Sometimes("both_reach_3", lambda s, a, t: t == (3, 3), step=True))
    return system


def table(result) -> list:
    return [(r.name, r.status, r.depth, r.trace) for r in result.reachability]


COUNTER = [("seven", REACHED, 5, [["inc"], ["inc"], ["inc"], ["double"], ["inc"]]),
           ("negative", UNREACHED, None, None),
           ("doubled_to_8", REACHED, 4, [["inc"], ["inc"], ["double"], ["double"]]),
           ("doubled_below_0", UNREACHED, None, None)]


@pytest.mark.parametrize("store", ["full", "fingerprint"])
def test_each_declaration_is_reached_at_its_shortest_depth_or_proved_unreached(store):
    assert table(explore(counter(), ExploreOptions(store=store))) == COUNTER


def test_a_declaration_is_asked_only_until_it_is_met():
    asked: list = []
    explore(counter(asked=asked))
    assert asked[-1] == 7 and len(asked) == len(set(asked)) < 11  # the states after the first 7 are not asked


def test_a_bound_leaves_a_declaration_not_reached_within_it():
    result = explore(counter(), ExploreOptions(max_depth=4))
    assert [(r.name, r.status) for r in result.reachability] == [
        ("seven", NOT_WITHIN_BOUND), ("negative", NOT_WITHIN_BOUND), ("doubled_to_8", REACHED),
        ("doubled_below_0", NOT_WITHIN_BOUND)]
    assert result.unreached == []


def test_the_partitioned_search_reports_the_same():
    assert table(explore_parallel(counter, 2)) == COUNTER
    result = explore_parallel(pair, 3)
    assert [(r.name, r.depth, len(r.trace)) for r in result.reachability] == [("two_apart", 2, 2),
                                                                              ("both_reach_3", 6, 6)]


def test_under_symmetry_the_first_representative_counts_and_the_path_is_of_the_real_system():
    result = explore(pair())
    assert result.symmetry
    (apart, both) = result.reachability
    assert (apart.depth, apart.trace) == (2, [["inc", 0], ["inc", 0]])  # (2, 0), not a later orbit such as (3, 1)
    states = follow(Pair(gap=None), both.trace)
    assert both.depth == 6 and states[-2:] in ([(2, 3), (3, 3)], [(3, 2), (3, 3)])


def test_a_system_without_declarations_reports_none():
    assert explore(Counter(limit=5, bad=None)).reachability == []


# -- every model ------------------------------------------------------------------------------------------------

WITH_SYSTEM = [m.name for m in catalog.models().models.values() if m.system is not None]


def follow(system, trace: list) -> list:
    """The states along a reported path (each action the enabled one whose JSON form the path shows)."""
    state = next(iter(system.initial_states()))
    states = [state]
    for saved in trace:
        action = next(a for a in system.enabled(state) if to_jsonable(a) == saved)
        state = system.step(state, action)
        states.append(state)
    return states


@pytest.mark.parametrize("model", WITH_SYSTEM)
def test_every_model_reaches_all_its_declarations_by_default(model):
    system = catalog.models().model(model).build_system("fixed")
    goals = sometimes(system)
    assert len(goals) >= 3 and all(g.doc for g in goals)
    result = explore(system)
    assert result.bound_hit is None and [r.name for r in result.reachability] == [g.name for g in goals]
    for goal, reach in zip(goals, result.reachability):
        assert reach.status == REACHED, (model, reach.name)
        states = follow(system, reach.trace)  # the witness really reaches it, on the real system
        assert len(states) == reach.depth + 1
        if goal.step:
            action = next(a for a in system.enabled(states[-2]) if to_jsonable(a) == reach.trace[-1])
            assert goal.check(states[-2], action, states[-1]), (model, goal.name)
        else:
            assert goal.check(states[-1]), (model, goal.name)


def without(kind: str):
    """A guard planted on every action of `kind`: it is never enabled."""
    def plant(system) -> None:
        enabled = system.enabled
        system.enabled = lambda s: [a for a in enabled(s) if action_kind(a) != kind]
    return plant


# an over-constraint for each model, and the declarations it leaves unreached: a pool too large to evict or preempt,
# one plan() call, or an action a planted guard never enables
OVER_CONSTRAINED = [
    ("swa-budget", {"full_pages": 8, "swa_pages": 8}, None,
     ["a_request_is_retracted", "two_requests_wait_retracted", "a_retracted_request_resumes"]),
    ("radix-cache", {"num_pages": 10}, None, ["a_cached_prefix_is_evicted"]),
    ("radix-cache-swa", {"sliding_window_size": 8}, None, ["a_window_lock_is_released"]),
    ("kv-cache-manager", {"num_blocks": 10}, None, ["a_cached_block_is_evicted"]),
    ("kv-cache-manager-pd", {"num_blocks": 6}, None, ["a_preemption_races_an_output"]),
    ("kv-offload", {"num_chunks": 4}, None, ["a_cached_key_is_evicted"]),
    ("mla-backends", {"plans": 1}, None,
     ["a_replan_replaces_a_live_plan", "a_failed_plan_leaves_a_live_one", "a_run_follows_a_failed_plan"]),
    ("pd-staging", {}, without("scatter_done"), ["a_room_succeeds"]),
    ("pd-protocol", {}, without("deliver_decode"), ["a_room_succeeds"]),
    ("pipelined-transfer", {}, without("write_done"), ["a_transfer_completes"]),
]


def test_every_model_has_an_over_constraint_case():
    assert sorted(case[0] for case in OVER_CONSTRAINED) == sorted(WITH_SYSTEM)


@pytest.mark.parametrize("model, params, plant, unreached", OVER_CONSTRAINED, ids=[c[0] for c in OVER_CONSTRAINED])
def test_an_over_constrained_model_reports_what_it_never_reaches(model, params, plant, unreached):
    system = catalog.models().model(model).build_system("fixed", params)
    if plant is not None:
        plant(system)
    result = explore(system)
    assert result.bound_hit is None
    assert [r.name for r in result.unreached] == unreached
    assert all(r.status == REACHED for r in result.reachability if r.name not in unreached)


def test_the_command_line_fails_a_complete_search_that_leaves_one_unreached(capsys, tmp_path):
    junit = tmp_path / "explore.xml"
    assert cli.main(["explore", "kv-offload", "--param", "num_chunks=4", "--json", "--junit", str(junit)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["violations"] == []
    assert [(r["name"], r["status"], r["step"]) for r in doc["reachability"]] == [
        ("a_store_completes", "reached", False), ("a_cached_key_is_evicted", "unreached", True),
        ("a_load_hits", "reached", False)]
    assert doc["reachability"][0]["depth"] == len(doc["reachability"][0]["trace"]) == 2
    assert 'name="sometimes a_cached_key_is_evicted"' in junit.read_text() and 'type="unreached"' in junit.read_text()
    assert cli.main(["explore", "kv-offload", "--param", "num_chunks=4"]) == 1
    text = capsys.readouterr().out
    assert "reached: a_store_completes at depth 2, a_load_hits at depth 3 (witness paths: --json)" in text
    assert "UNREACHED sometimes a_cached_key_is_evicted: no step from a reachable state takes it" in text
    assert "a_cached_key_is_evicted never happens: the model may be over-constrained" in text
    # a bound stopped the search before it: not reached within the bound, and nothing proved (exit 3)
    assert cli.main(["explore", "kv-offload", "--max-depth", "2"]) == 3
    assert "sometimes a_load_hits: not reached within the bound" in capsys.readouterr().out
    assert cli.main(["explore", "kv-offload"]) == 0
