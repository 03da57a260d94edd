"""One generic Hypothesis `RuleBasedStateMachine` for any transition system.

The machine has a single rule: draw one of the currently enabled actions and
step. Hypothesis shrinks the run towards fewer steps and towards the first
enabled action, so a failure ends as a short, replayable action list. The
invariants are checked after every step; a violation raises
`PropertyViolation` and leaves the failing action list in `record`.
"""

from __future__ import annotations

from typing import Any, Sequence

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


def call_line(op: str, args: Any) -> str:
    """One call of a lockstep program as it reads: `assign(5)`, `free(alloc_id=3)`, `reset()`; a tagged record
    (`kvsim.engine.actions`) as its own repr: `step(schedule(req=0))`."""
    if args is None or args == ():
        return f"{op}()"
    if isinstance(args, dict):
        return f"{op}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    if isinstance(args, tuple) and type(args).__repr__ is tuple.__repr__:
        return f"{op}({', '.join(repr(a) for a in args)})"
    return f"{op}({args!r})"


class LockstepDivergence(PropertyViolation):
    """The two sides of a lockstep differ after a step: `details` holds the program and the difference."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


def lockstep_class(start: Any, make_sides: Any, operations: Sequence[Any], step: Any,
                   record: dict[str, Any]) -> type[RuleBasedStateMachine]:
    """A state machine driving two sides of a lockstep with the same calls, one rule per operation.

    `start`: a strategy of the initial configuration; `make_sides(config)` -> (model, upstream, view) where
    `view` is what the operations draw their arguments from; `step(model, upstream, program, op, args)` makes
    one call on both sides and compares them, raising `LockstepDivergence` (with the program so far) when
    they differ. Hypothesis shrinks a divergence to the shortest program it can find.
    """
    from hypothesis.strategies import SearchStrategy

    def begin(self: Any, config: Any) -> None:
        self.program = [call_line("start", config)]
        self.model, self.upstream, self.view = make_sides(config)
        record["runs"] = record.get("runs", 0) + 1
        step(self.model, self.upstream, self.program, None, None)

    namespace: dict[str, Any] = {"begin": initialize(config=start)(begin)}
    for index, operation in enumerate(operations):
        def act(self: Any, data: st.DataObject, operation: Any = operation) -> None:
            args = operation.args
            if not isinstance(args, SearchStrategy) and callable(args):
                args = args(self.view)
                if args is None:
                    return  # not enabled in this state
            value = data.draw(args, label=operation.name) if isinstance(args, SearchStrategy) else args
            calls = [(operation.name, value)]
            if operation.then is not None:
                calls += list(operation.then(self.view, value))
            for op, call_args in calls:
                step(self.model, self.upstream, self.program, op, call_args)

        act.__name__ = f"op_{index}_{operation.name}"
        namespace[act.__name__] = rule(data=st.data())(act)
    return type("Lockstep", (RuleBasedStateMachine,), namespace)
