"""One generic Hypothesis `RuleBasedStateMachine` for any transition system.

The machine has a single rule: draw one of the currently enabled actions and
step. Hypothesis shrinks the run towards fewer steps and towards the first
enabled action, so a failure ends as a short, replayable action list. The
invariants are checked after every step; a violation raises
`PropertyViolation` and leaves the failing action list in `record`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from .canon import to_jsonable
from .errors import PropertyViolation
from .system import TransitionSystem, first_violation


def step_program(actions: list[Any], invariant: str) -> list[str]:
    """A failing run as a readable program, one line per action (as Hypothesis prints stateful failures)."""
    lines = ["state = initial_state()"]
    lines += [f"state = step(state, {action!r})" for action in actions]
    lines.append(f"check(state)  # {invariant} fails here")
    return lines


def machine_class(system: TransitionSystem[Any, Any], record: dict[str, Any] | None = None) -> type[RuleBasedStateMachine]:
    """A state machine class driving `system`; failures are written into `record`."""
    record = {} if record is None else record
    initial_states = list(system.initial_states())
    if not initial_states:
        raise ValueError(f"{system.name}: the transition system has no initial state")

    class SystemMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.state: Any = None
            self.initial: Any = None
            self.actions: list[Any] = []
            record["runs"] = record.get("runs", 0) + 1

        @initialize(data=st.data())
        def start(self, data: st.DataObject) -> None:
            self.state = self.initial = data.draw(st.sampled_from(initial_states), label="initial state")
            self._check()

        @rule(data=st.data())
        def act(self, data: st.DataObject) -> None:
            actions = system.enabled(self.state)
            if not actions:
                return  # a terminal state: nothing to do, liveness is explore's job
            action = data.draw(st.sampled_from(actions), label="action")
            self.actions.append(action)
            self.state = system.step(self.state, action)
            self._check()

        def _check(self) -> None:
            found = first_violation(system, self.state)
            if found is not None:
                name, message = found
                record["failure"] = {"invariant": name, "message": message,
                                     "actions": to_jsonable(self.actions),
                                     "initial": to_jsonable(self.initial),
                                     "program": step_program(self.actions, name)}
                raise PropertyViolation(f"{name}: {message} (after {len(self.actions)} actions)")

    SystemMachine.__name__ = f"{system.name.replace('-', '_')}_machine"
    return SystemMachine
