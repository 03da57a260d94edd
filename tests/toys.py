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
