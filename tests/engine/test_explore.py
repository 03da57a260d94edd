import networkx as nx

from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.system import run_actions
from toys import Counter


def test_finds_planted_violation_with_shortest_path():
    result = explore(Counter(limit=10, bad=6))
    assert [v.property for v in result.violations] == ["not_bad"]
    v = result.violations[0]
    assert v.kind == "invariant" and v.state == 6
    # 0 -inc-> 1 -inc-> 2 -inc-> 3 -double-> 6 is the shortest way (4 steps); the path really leads there
    assert len(v.trace) == 4
    assert run_actions(Counter(limit=10, bad=None), [tuple(a) for a in v.trace])[-1] == 6


def test_clean_system_reports_counts_and_no_violation():
    result = explore(Counter(limit=10, bad=None))
    assert result.violations == [] and result.bound_hit is None
    assert result.states == 11  # 0..10
    assert result.depth == 5  # 10 = ((1*2)+1)*2... shortest is inc,inc,double,inc,double (5 steps)
    assert result.transitions == sum(len(Counter(10, None).enabled(s)) for s in range(11))


def test_livelock_is_reported_as_hang_with_path():
    result = explore(Counter(limit=10, bad=None, trap=True))
    hang = [v for v in result.violations if v.kind == "hang"]
    assert len(hang) == 1 and hang[0].property == "reaches_limit"
    assert hang[0].state == -1 and hang[0].trace == [["inc"], ["inc"], ["trap"]]
    assert "livelock" in hang[0].message and result.hang_states == 1


def test_deadlock_is_reported_as_hang():
    result = explore(Counter(limit=10, bad=None, deadlock=True))
    (hang,) = result.violations
    assert hang.state == -2 and "deadlock" in hang.message


def test_bounds_are_reported_and_never_make_false_hangs():
    by_depth = explore(Counter(limit=10, bad=None), ExploreOptions(max_depth=2))
    assert by_depth.bound_hit == "depth" and by_depth.violations == []
    by_states = explore(Counter(limit=10, bad=None), ExploreOptions(max_states=4))
    assert by_states.bound_hit == "states" and by_states.states == 4 and by_states.violations == []


def test_graph_has_every_state_and_transition(tmp_path):
    result = explore(Counter(limit=6, bad=None))
    g = result.graph()
    assert g.number_of_nodes() == result.states and g.number_of_edges() == result.transitions
    path = tmp_path / "g.graphml"
    nx.write_graphml(g, path)
    assert nx.read_graphml(path).number_of_nodes() == result.states


def test_json_record_has_stable_keys():
    doc = explore(Counter()).to_json()
    assert {"model", "variant", "states", "transitions", "depth", "seconds", "states_per_second", "bound_hit",
            "violations", "resumed", "checkpoint"} <= set(doc)
    assert set(doc["violations"][0]) >= {"property", "kind", "trace"}
    assert doc["resumed"] is False and doc["checkpoint"] is None  # a search without a checkpoint says so too


def test_coverage_counts_every_transition_and_every_check():
    clean = explore(Counter(bad=None))
    assert sum(clean.coverage.actions.values()) == clean.transitions
    assert clean.coverage.actions == {"inc": 10, "double": 5}  # 0..9 increment; 1..5 double
    assert clean.coverage.invariants == {"not_bad": clean.states}
    doc = clean.to_json()["coverage"]
    assert doc["actions"] == {"double": 5, "inc": 10}


def test_coverage_of_a_violating_state_stops_at_its_first_failed_invariant():
    from kvsim.engine.system import Invariant

    system = Counter(bad=4)
    system.invariants = (Invariant("not_bad", system._not_bad), Invariant("never_five", lambda s: None))
    result = explore(system)
    cov = result.coverage.invariants
    assert cov["not_bad"] == result.states
    assert cov["never_five"] == result.states - 1  # not asked on the violating state
    assert "trap" not in result.coverage.actions


def test_explore_options_are_checked_once_and_name_the_field():
    import pytest

    from kvsim.engine.errors import ConfigError

    for field, value, expected in (("max_depth", 0, "an integer >= 1"), ("max_states", 0, "an integer >= 1"),
                                   ("max_states", 2.5, "an integer"), ("max_seconds", 0, "a finite number > 0"),
                                   ("max_seconds", float("inf"), "a finite number > 0"),
                                   ("max_memory", -1, "an integer >= 1"), ("memory_share", 1.5, "a share > 0 and <= 1"),
                                   ("store", "disk", "'full' or 'fingerprint'"), ("symmetry", "no", "True or False"),
                                   ("resume", True, "a checkpoint to go on from beside it")):
        with pytest.raises(ConfigError, match=f"^{field}: expected ") as caught:
            ExploreOptions(**{field: value})
        assert caught.value.field == field and caught.value.expected == expected
    assert ExploreOptions(max_depth=3) == ExploreOptions(max_depth=3, progress=print)  # the callback is no option


def test_an_engine_error_names_its_field_and_a_command_line_its_flag():
    from kvsim.engine.errors import ConfigError

    error = ConfigError("checkpoint", "a new or empty folder", "/x", "it holds a checkpoint")
    flagged = error.named({"checkpoint": "--checkpoint"})
    assert str(flagged) == "--checkpoint: expected a new or empty folder, got '/x' (it holds a checkpoint)"
    assert (flagged.field, flagged.expected, flagged.received) == ("--checkpoint", error.expected, error.received)
    assert error.named({"resume": "--resume"}) is error  # a field the mapping does not name keeps its name
    # a field of several words is mapped by its first: a model's `param requests` is the flag `--param requests`
    param = ConfigError("param requests", "an integer (>= 1)", 0).named({"param": "--param"})
    assert str(param) == "--param requests: expected an integer (>= 1), got 0" and param.field == "--param requests"
    assert ConfigError("the checkpoint key", "x", 1).named({"checkpoint": "--checkpoint"}).field == "the checkpoint key"


def test_recent_successors_hit_only_an_equal_state():
    """`Recent` is asked by value: a state of the same hash that is not equal is a miss (then found by its
    fingerprint), never the other state's id; full, it starts again empty."""
    from kvsim.engine.explore.store import Recent

    class Same(tuple):  # every value one hash
        def __hash__(self) -> int:
            return 7

    a, b, a_again = Same((1,)), Same((2,)), Same((1,))
    recent = Recent(capacity=2)
    recent.put(a, 10)
    assert recent.get(a_again) == 10
    assert recent.get(b) is None
    recent.put(b, 11)
    assert (recent.get(b), recent.get(a)) == (11, 10)  # one hash, two states: each its own id
    recent.put(Same((3,)), 12)  # full: emptied first
    assert (recent.get(Same((3,))), recent.get(a), recent.get(b)) == (12, None, None)
