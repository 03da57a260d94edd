"""The transition-system contract every control-plane model implements.

A state is hashable and immutable; `enabled` lists actions in a deterministic
order (faults are actions too); `step` is a pure function. A system may also
offer `transition(state, action) -> (state, effects)`: the same step, plus a
tuple of what it did (messages sent, work queued, rooms concluded), so a
driver such as a timed simulation learns that from the system instead of
diffing two states. `step` stays the explorer's entry point. Invariants are
named checks that return None when they hold and a message when they do not:
the explorer calls them on every reached state, so they stay exception-free
in the common case. Reachability declarations (`Sometimes`) are named predicates
some reachable state must satisfy: a room that succeeds, a block that is evicted; a
search that never meets one says the model may be over-constrained (its invariants
may hold vacuously).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Iterable, Protocol, Sequence, TypeVar

from .variants import Variant

S = TypeVar("S", bound=Hashable)
A = TypeVar("A", bound=Hashable)
T = TypeVar("T")


@dataclass(frozen=True)
class Invariant(Generic[S]):
    name: str
    check: Callable[[S], str | None]
    doc: str = ""


# what a run found of one `Sometimes`: met; shown never met by a complete search (or a data property's whole
# default budget); or not met before a bound (states, depth, time, fewer examples) stopped the run
REACHED, UNREACHED, NOT_WITHIN_BOUND = "reached", "unreached", "not reached within the bound"
# a data property's `sometimes` must each be met by a case drawn within this many examples (`kvsim check`'s default
# budget): a run that passed with at least this budget and met one by no drawn case reports it unreached
REACH_EXAMPLES = 200


@dataclass(frozen=True)
class Sometimes(Generic[S]):
    """A reachability declaration (stateright's "sometimes" property): some reachable state satisfies `check`.

    The explorer asks it of every state it reaches until one says True, then never again; a complete search
    that met none reports it unreached. With `step`, `check(state, action, successor)` is asked of every
    transition instead: an event a state does not record (a cached block evicted, a request resumed) is a
    step that some path must take. Like an invariant it is asked of a symmetry's representative, so it must
    not tell interchangeable rooms, requests or blocks apart. A data property declares them over the cases its
    strategy draws (`kv_property(sometimes=...)`, `check(case)`): some drawn case must satisfy each, or the
    property may hold only because its inputs never reach the corner it is about."""

    name: str
    check: Callable[..., bool]
    doc: str = ""
    step: bool = False


class TransitionSystem(Protocol[S, A]):
    """What a model provides: its name and variant record, its invariants, its initial states, the actions
    enabled in a state (in a deterministic order), the step an action takes, and which states are done.

    Optional, found by name where a driver wants them: `liveness` (the name of the "every room concludes"
    goal, else "liveness"), `sometimes` (its `Sometimes` declarations: states some path must reach),
    `transition(state, action) -> (state, effects)` (see `transition` below),
    `canonical(state)` (one representative per orbit of its symmetries, `kvsim.engine.symmetry`) and
    `encode_state(state) -> bytes` (the text a fingerprint is taken of, where `repr` would lose a distinction).
    """

    name: str
    variant: Variant  # the flag record (`kvsim.engine.variants`), never a string
    invariants: Sequence[Invariant[S]]

    def initial_states(self) -> Iterable[S]: ...

    def enabled(self, state: S) -> Sequence[A]: ...

    def step(self, state: S, action: A) -> S: ...

    def done(self, state: S) -> bool: ...


def drawn_reach(goal: Sometimes[Any], drawn: int, whole: bool, example: int | None = None, case: Any = None,
                **where: Any) -> dict[str, Any]:
    """A data property's `sometimes` as `kvsim check` and `kvsim fuzz` report it: met by the drawn case `case` (the
    `example`th drawn; `where` says more, as which worker and round), else unreached where the run drew its
    `whole` budget (it held, over at least `REACH_EXAMPLES` examples), else not reached within the bound."""
    status = REACHED if example is not None else UNREACHED if whole else NOT_WITHIN_BOUND
    return {"name": goal.name, "doc": goal.doc, "status": status, "reached": example is not None, **where,
            "example": example, "case": case, "drawn": drawn}


def sometimes(system: Any) -> tuple[Sometimes[Any], ...]:
    """The system's reachability declarations (none where it declares no `sometimes`)."""
    return tuple(getattr(system, "sometimes", ()))


def taking(system: Any, state: Any, check: Callable[[Any, Any, Any], bool]) -> Any:
    """The first action enabled in `state` whose step `check(state, action, successor)` accepts (a step
    `Sometimes`'s last move on a path), or None."""
    for action in system.enabled(state):
        if check(state, action, system.step(state, action)):
            return action
    return None


def flag(state: Any, name: str, message: str) -> Any:
    """`state` (a NamedTuple with a sorted `flags` tuple) with the invariant `name` marked violated, once.

    A transition that sees a violation it cannot express as a check over the state records it here;
    `flagged(name)` is the matching invariant."""
    if any(f[0] == name for f in state.flags):
        return state
    return state._replace(flags=tuple(sorted(state.flags + ((name, message),))))


def flagged(name: str) -> Callable[[Any], str | None]:
    """The invariant check of a `flag`: the recorded message, or None."""
    def check(state: Any) -> str | None:
        for f in state.flags:
            if f[0] == name:
                return f[1]
        return None
    return check


def transition(system: Any, state: Any, action: Any) -> tuple[Any, tuple[Any, ...]]:
    """`system.transition(state, action)` where the system has one; else its `step` with no effects."""
    fn = getattr(system, "transition", None)
    if fn is None:
        return system.step(state, action), ()
    return fn(state, action)


class Thawed(Generic[T]):
    """The mutable object a model's transition left (a manager built from a frozen value, changed by the step, frozen
    again), and the frozen value it froze to: the next transition from that very value (a simulation steps on from
    the successor it was just given) takes the object instead of thawing a new one (which rebuilds every block or
    chunk of a pool: most of a step's time at realistic sizes). From any other value (a search's next action from the
    same state, another state) it thaws. An object goes out once (`take`: the step changes it); `peek` lends it to a
    reader that changes nothing. Exact where the object's every field is in its frozen form and the thaw of that form
    builds an equal object: each model that keeps one tests a walk of its steps against fresh thaws."""

    __slots__ = ("state", "value")

    def __init__(self) -> None:
        self.state: Any = None
        self.value: T | None = None

    def take(self, state: Any, thaw: Callable[[], T]) -> T:
        value = self.value if state is self.state else None
        self.state = self.value = None
        return thaw() if value is None else value

    def peek(self, state: Any) -> T | None:
        """The object kept for `state`, left kept (its reader changes nothing), or None."""
        return self.value if state is self.state else None

    def keep(self, state: Any, value: T) -> None:
        self.state, self.value = state, value


class SameAnswer:
    """A pure function of its arguments (an invariant's check of a part of the state, the digest a trace records of
    one), answered again without the call where its arguments are the last call's: the same objects, or equal ones
    (compared in C, up to their first difference). A simulation's step changes a part or two of its state: the
    other parts are the objects the step before held, or equal values rebuilt, and checking or writing them
    again is the cost of a step at a serving engine's size. Holds the last arguments."""

    __slots__ = ("fn", "args", "answer")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.args: tuple[Any, ...] | None = None
        self.answer: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.args is None or self.args != args:
            self.answer, self.args = self.fn(*args), args
        return self.answer

    def __reduce__(self) -> tuple[Any, ...]:  # a copy starts afresh
        return SameAnswer, (self.fn,)


def first_violation(system: TransitionSystem[Any, Any], state: Any) -> tuple[str, str] | None:
    """(invariant name, message) of the first invariant that fails on `state`."""
    for inv in system.invariants:
        message = inv.check(state)
        if message is not None:
            return inv.name, message
    return None


def run_actions(system: TransitionSystem[Any, Any], actions: Sequence[Any], initial: Any = None) -> list[Any]:
    """Apply `actions` from the first initial state; each must be enabled. Returns the visited states."""
    state = next(iter(system.initial_states())) if initial is None else initial
    states = [state]
    for i, action in enumerate(actions):
        if action not in system.enabled(state):
            raise ValueError(f"action {i} {action!r} is not enabled in state {state!r}")
        state = system.step(state, action)
        states.append(state)
    return states


def refusal(system: TransitionSystem[Any, Any], state: Any, action: Any) -> str | None:
    """Why `action` is not enabled in `state` (None when it is): the system's own `refusal(state, action)` where it
    has one (a system whose actions are data from outside, too many to list, says which of its conditions failed),
    else whether `enabled(state)` lists it."""
    fn = getattr(system, "refusal", None)
    if fn is not None:
        return fn(state, action)
    return None if action in system.enabled(state) else "not enabled in this state"


@dataclass(frozen=True)
class Stopped:
    """Where `replay_actions` stopped: the action at `index` (from 0), the state it met, and why: `check` is
    "enabled" for an action the state does not allow (its `refusal`), else the invariant its step violated."""

    index: int
    action: Any
    state: Any
    check: str
    message: str


def replay_actions(system: TransitionSystem[Any, Any], actions: Iterable[Any], initial: Any = None) \
        -> tuple[Any, int, Stopped | None]:
    """`actions` taken one at a time as the iterable gives them (a stream read from a file: nothing is held but the
    current state), each checked enabled (`refusal`) and each successor against the invariants, to the first that
    fails. Returns the last state, the number of actions taken and where it stopped (None: all were taken)."""
    state = next(iter(system.initial_states())) if initial is None else initial
    taken = 0
    for action in actions:
        why = refusal(system, state, action)
        if why is not None:
            return state, taken, Stopped(taken, action, state, "enabled", why)
        after = system.step(state, action)
        bad = first_violation(system, after)
        if bad is not None:
            return after, taken, Stopped(taken, action, state, bad[0], bad[1])
        state, taken = after, taken + 1
    return state, taken, None
