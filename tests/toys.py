"""Tiny transition systems written for the engine tests (no KV cache in sight), and the checks the model tests
share: a pinned exploration with and without the symmetry reduction, an invariant failing alone on a planted line,
every reachable state, a renaming checked to be a symmetry, a kept object stepped as a fresh thaw (`kept_walk`)."""

from __future__ import annotations

import random

from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.system import Invariant


def explores_clean(system, states: int, reduced: int) -> None:
    """`system` explored whole, without and with its symmetry reduction: no violation, no hang, no bound reached,
    and `states`, then `reduced`, states stored."""
    for options, count in ((ExploreOptions(symmetry=False), states), (ExploreOptions(), reduced)):
        result = explore(system, options)
        assert result.bound_hit is None and result.violations == [] and result.hang_states == 0
        assert result.states == count, (options.symmetry, result.states)


def alone(system, name: str):
    """`system` with its invariant `name` alone: it, not another, must catch what a test plants."""
    system.invariants = tuple(i for i in system.invariants if i.name == name)
    assert len(system.invariants) == 1, name
    return system


def fails_alone(build, name: str, plant: tuple, monkeypatch) -> None:
    """The invariant `name` of `build()`, checked alone, holds on every reachable state; once `plant` (object,
    attribute, wrong value) is set with `monkeypatch`, it fails on a state reached by a path. Liveness is off: a
    state another (unchecked) step check flagged enables nothing, so it would count as a hang."""
    options = ExploreOptions(check_liveness=False)
    assert explore(alone(build(), name), options).violations == []
    monkeypatch.setattr(*plant)
    result = explore(alone(build(), name), options)
    assert [v.property for v in result.violations] == [name]
    assert result.violations[0].trace


def reachable(system) -> list:
    """Every state `system` reaches (no reduction, no liveness check); the search must end within its bounds."""
    result = explore(system, ExploreOptions(symmetry=False, check_liveness=False))
    assert result.bound_hit is None
    store = result._store
    return [store.state(sid) for sid in range(len(store))]


def rotation(n: int) -> dict[int, int]:
    """The renaming of ids 0..n-1 that keeps 0 (a null id) and moves every other id b to b + 1, the last to 1."""
    return {0: 0, **{b: b % (n - 1) + 1 for b in range(1, n)}}


def symmetry_breaks(system, states, rename, rename_action=None, *, two_per_orbit: bool = False) -> str | None:
    """The first way `rename` (of states) fails to be a symmetry of `system` on `states`, or None.

    A symmetry: the renamed state gets the state's canonical form (a fixed point of `canonical`), `done` and every
    invariant's verdict agree, its enabled actions are the renamed ones, and each step commutes with the renaming.
    `rename_action` renames actions (their order may then differ); without it actions name nothing renamed, and
    come in the same order. `two_per_orbit`: the orbit of a state is itself and its renaming, so the canonical
    form is one of the two."""
    for s in states:
        t = rename(s)
        form = system.canonical(s)
        if system.canonical(t) != form or system.canonical(form) != form or (two_per_orbit and form not in (s, t)):
            return f"one representative per orbit: {s}"
        if system.done(t) != system.done(s):
            return f"done: {s}"
        for inv in system.invariants:
            if (inv.check(t) is None) != (inv.check(s) is None):
                return f"{inv.name}: {s}"
        acts = system.enabled(s)
        if rename_action is None:
            moved, same = acts, system.enabled(t) == acts
        else:
            moved = [rename_action(a) for a in acts]
            same = sorted(system.enabled(t), key=repr) == sorted(moved, key=repr)
        if not same:
            return f"enabled: {s}"
        for a, b in zip(acts, moved):
            if system.step(t, b) != rename(system.step(s, a)):
                return f"step {a}: {s}"
    return None


class Counter:
    """0 ..limit with +1 and x2; `bad` is a planted invariant violation; done at `limit`."""

    liveness = "reaches_limit"

    def __init__(self, limit: int = 10, bad: int | None = 6, trap: bool = False, deadlock: bool = False) -> None:
        self.name, self.variant = "counter", "fixed"
        self.limit, self.bad, self.trap, self.deadlock = limit, bad, trap, deadlock
        self.invariants = (Invariant("not_bad", self._not_bad),)

    def _not_bad(self, state: int) -> str | None:
        return f"counter: expected != {self.bad}, got {state}" if state == self.bad else None

    def initial_states(self):
        return (0,)

    def enabled(self, state: int):
        if state < 0:
            return [] if state == -2 else [("spin",)]  # -1 livelocks, -2 deadlocks
        if state >= self.limit:
            return []
        actions = [("inc",)]
        if 0 < state * 2 <= self.limit:
            actions.append(("double",))
        if self.trap and state == 2:
            actions.append(("trap",))
        if self.deadlock and state == 3:
            actions.append(("stall",))
        return actions

    def step(self, state: int, action: tuple) -> int:
        return {"inc": state + 1, "double": state * 2, "trap": -1, "spin": state, "stall": -2}[action[0]]

    def done(self, state: int) -> bool:
        return state == self.limit


class Pair:
    """Two interchangeable counters 0..limit (`canonical` sorts them): a symmetric system for the explorer.

    Invariant: neither runs `gap` ahead of the other. `jam` (both at 1) deadlocks: a symmetric hang.
    `lopsided=True` declares a canonical form that is not a symmetry (it forgets the second counter).
    """

    liveness = "both_finish"

    def __init__(self, limit: int = 4, gap: int | None = 3, jam: bool = False, lopsided: bool = False) -> None:
        self.name, self.variant = "pair", "fixed"
        self.limit, self.gap, self.jam, self.lopsided = limit, gap, jam, lopsided
        self.invariants = (Invariant("close_together", self._close),)

    def _close(self, state: tuple) -> str | None:
        if self.gap is not None and state[0] >= 0 and abs(state[0] - state[1]) >= self.gap:
            return f"pair: counters {state} are {self.gap} or more apart"
        return None

    def canonical(self, state: tuple) -> tuple:
        return (state[0], 0) if self.lopsided else tuple(sorted(state))

    def initial_states(self):
        return ((0, 0),)

    def enabled(self, state: tuple):
        if state[0] < 0:
            return []
        actions = [("inc", i) for i in (0, 1) if state[i] < self.limit]
        if self.jam and state == (1, 1):
            actions.append(("jam",))
        return actions

    def step(self, state: tuple, action: tuple) -> tuple:
        if action[0] == "jam":
            return (-1, -1)
        i = action[1]
        return tuple(v + 1 if k == i else v for k, v in enumerate(state))

    def done(self, state: tuple) -> bool:
        return state == (self.limit, self.limit)


def recorded_actions(result, actions) -> list:
    """The actions a simulation's trace recorded (a step's `data["action"]`), decoded with the model's action table
    `actions`: what a model's simulation test replays through `run_actions`."""
    from kvsim.engine.actions import decode
    return [decode(step["data"]["action"], actions) for step in result.recorder.steps
            if isinstance(step["data"], dict) and "action" in step["data"]]


class Afresh:
    """A `kvsim.engine.system.Thawed` that keeps nothing: every transition thaws its state (the reference)."""

    def take(self, state, thaw):
        return thaw()

    def peek(self, state):
        return None

    def keep(self, state, value):
        pass


def kept_walk(make, steps: int, seed: int, anew, key=lambda state: state.manager) -> int:
    """`steps` transitions of a random walk over `make()` (a system whose `thawed` keeps its manager, with the frozen
    manager `key(state)`: its field `manager` unless given), each from the last successor (now and then from a state
    stepped already first, as a search does): each successor and its effects against a fresh thaw's (a second system
    keeping nothing), and the object kept, where one is, checked by `anew(object, the successor's frozen manager)`.
    Returns how many steps took a kept object."""
    system, reference = make(), make()
    reference.thawed = Afresh()
    rng = random.Random(seed)
    kept = 0
    state = system.initial_states()[0]
    for _ in range(steps):
        actions = system.enabled(state)
        if not actions:
            state = system.initial_states()[0]
            continue
        if rng.random() < 0.2 and len(actions) > 1:  # another action from this state first: it is not kept then
            other = rng.choice(actions)
            assert system.transition(state, other) == reference.transition(state, other)
        action = rng.choice(actions)
        kept += key(state) is system.thawed.state
        got = system.transition(state, action)
        assert got == reference.transition(state, action), (state, action)
        if system.thawed.value is not None:
            assert system.thawed.state is key(got[0]) and anew(system.thawed.value, key(got[0])), (state, action)
        state = got[0]
    return kept
