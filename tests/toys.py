"""Tiny transition systems written for the engine tests (no KV cache in sight)."""

from __future__ import annotations

from kvsim.engine.system import Invariant


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
