"""`kvsim.engine.system.replay_actions`: actions taken as an iterable gives them, to the first not enabled or the
first whose step violates an invariant (the trace replay `kvsim events` runs a recorded stream through)."""

from __future__ import annotations

from toys import Counter

from kvsim.engine.system import refusal, replay_actions, run_actions


def test_a_clean_run_ends_where_run_actions_does():
    actions = [("inc",), ("double",), ("inc",), ("double",)]
    state, taken, stop = replay_actions(Counter(limit=10, bad=None), iter(actions))
    assert (state, taken, stop) == (run_actions(Counter(limit=10, bad=None), actions)[-1], 4, None)


def test_it_stops_at_the_first_action_not_enabled_without_reading_further():
    read = []

    def actions():
        for a in [("inc",), ("inc",), ("spin",), ("inc",)]:
            read.append(a)
            yield a

    state, taken, stop = replay_actions(Counter(limit=10, bad=None), actions())
    assert (state, taken, stop.index, stop.action, stop.state, stop.check) == (2, 2, 2, ("spin",), 2, "enabled")
    assert stop.message == "not enabled in this state" and len(read) == 3


def test_it_stops_at_the_first_step_that_violates_an_invariant():
    state, taken, stop = replay_actions(Counter(limit=10, bad=6), [("inc",), ("inc",), ("inc",), ("double",)])
    assert (state, taken, stop.index, stop.state, stop.check) == (6, 3, 3, 3, "not_bad")
    assert stop.message == "counter: expected != 6, got 6"


def test_a_system_says_why_through_its_own_refusal():
    class Says(Counter):
        def refusal(self, state, action):
            return None if action == ("inc",) else f"only inc here, got {action[0]}"

    assert refusal(Says(), 0, ("double",)) == "only inc here, got double"
    assert replay_actions(Says(bad=None), [("inc",), ("double",)])[2].message == "only inc here, got double"
