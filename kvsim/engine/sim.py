"""The seeded discrete-event simulator.

Virtual time only (no wall clock): the clock jumps to the next event, events
are ordered by (time, sequence number) so ties run in scheduling order, and
every random choice comes from the one `random.Random(seed)` owned by the
simulator. An exception raised by an event handler stops the run loudly.

Messages between simulated peers go through a `Channel`, which applies the
`FaultPlan` (drop, delay, duplicate, reorder, garble) with the simulator's
generator; peer crashes are scheduled events the model handles.
"""

from __future__ import annotations

import heapq
import random
import time as _clock
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError
from .interrupt import INTERRUPT, asked
from .memory import spaced_collections
from .pace import Pace
from .system import transition

FAULT_KINDS = ("drop", "delay", "duplicate", "reorder", "garble", "crash")

# Work budgets of one simulation (`kvsim simulate --max-events/--max-seconds`): a run that reaches one
# stops cleanly between two events, says which bound stopped it (`Simulator.stopped_by`) and is incomplete.
DEFAULT_MAX_EVENTS = 10_000_000
DEFAULT_MAX_SECONDS = 600.0
MAX_FAULT_SECONDS = 1e9  # the longest delay or crash time of a fault spec (simulated seconds: about 32 years)
_YOUNG = 20_000  # the collector's young-generation threshold while a simulation runs (`Simulator.run`)


# A scheduled event is the list [time, seq, fn, args]: heapq then orders events in C (time, then the
# unique sequence number, so fn and args are never compared), where a Python-level __lt__ cost more
# than the rest of the engine; `cancel` blanks fn in place, and `run` skips such an event.
_Event = list
_TIME, _SEQ, _FN, _ARGS = range(4)


class Simulator:
    """`max_events` and `max_seconds` (wall clock, from construction) bound every `run`; None: no bound."""

    def __init__(self, seed: int, *, max_events: int | None = None, max_seconds: float | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.events_run = 0
        self.max_events = max_events
        self.deadline = None if max_seconds is None else _clock.perf_counter() + max_seconds
        self.stopped_by: str | None = None  # "max-events", "max-seconds" or "interrupt": what ended the run early
        self._heap: list[_Event] = []
        self._seq = 0
        self._stopped = False

    def schedule(self, delay: float, fn: Callable[..., Any], *args: Any) -> _Event:
        if delay < 0:
            raise ValueError(f"cannot schedule into the past (delay {delay})")
        event = [self.now + delay, self._seq, fn, args]
        self._seq += 1
        heapq.heappush(self._heap, event)
        return event

    def poisson_arrivals(self, count: int, rate: float, fn: Callable[[int], Any]) -> float:
        """Schedule `fn(0)`, ..., `fn(count - 1)` at Poisson arrival times of `rate` per second; the last time."""
        t = 0.0
        for i in range(count):
            t += self.rng.expovariate(rate)
            self.schedule(t, fn, i)
        return t

    @staticmethod
    def cancel(event: _Event) -> None:
        event[_FN] = None

    def stop(self) -> None:
        self._stopped = True

    def pending(self) -> int:
        return sum(1 for e in self._heap if e[_FN] is not None)

    def run(self, until: float | None = None, max_events: int | None = None) -> None:
        """Run events in order until none is left, `stop()`, `until` (virtual time) or a budget.

        The budget (`self.max_events`, read at every event so a replay may lower it while it runs, and
        the wall-clock deadline, read every few thousand events where events are fast and every event where
        they are slow: `kvsim.engine.pace`) sets `stopped_by` when it ends the run with events still pending,
        and so does a stop asked by Ctrl-C or SIGTERM ("interrupt", seen where the clock is read);
        `max_events` here is a plain bound of this call.

        Each event allocates short-lived records (a step's state, its effects, a trace line): while the run
        lasts the collector's young generation is collected every `_YOUNG` allocations instead of every 700
        (restored after; what a run computes does not depend on when the collector runs).
        """
        with spaced_collections(_YOUNG):
            self._run(until, max_events)

    def _run(self, until: float | None, max_events: int | None) -> None:
        heap, pop = self._heap, heapq.heappop
        pace = Pace(_clock.perf_counter)
        next_clock = self.events_run + pace.every
        bounded = until is not None or max_events is not None
        while heap and not self._stopped:
            if bounded:
                if until is not None and heap[0][_TIME] > until:
                    self.now = until
                    return
                if max_events is not None and self.events_run >= max_events:
                    return
            if (budget := self.max_events) is not None and self.events_run >= budget:
                self._budget_spent("max-events")
                return
            if self.events_run >= next_clock:
                now = pace.read()
                next_clock = self.events_run + pace.every
                if self.deadline is not None and now >= self.deadline:
                    self._budget_spent("max-seconds")
                    return
                if asked():
                    self._budget_spent(INTERRUPT)
                    return
            time, _, fn, args = pop(heap)
            if fn is None:  # cancelled
                continue
            self.now = time
            self.events_run += 1
            fn(*args)

    def _budget_spent(self, bound: str) -> None:
        if any(e[_FN] is not None for e in self._heap):  # work was left: the run is incomplete
            self.stopped_by = bound


@dataclass(frozen=True)
class FaultPlan:
    """Per-message fault probabilities plus scheduled peer crashes.

    Spec syntax (`--faults`): comma-separated `kind=value`, e.g.
    `drop=0.05,delay=0.1:2.0,duplicate=0.02,reorder=0.1,garble=0.01,crash=prefill0@30`.
    `delay=P:MAX` delays a message with probability P by up to MAX seconds.
    """

    drop: float = 0.0
    delay: float = 0.0
    max_delay: float = 1.0
    duplicate: float = 0.0
    reorder: float = 0.0
    garble: float = 0.0
    crashes: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("drop", "delay", "duplicate", "reorder", "garble"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:  # NaN fails this too
                raise ConfigError(f"faults {name}", "a probability in [0, 1]", value)
        if not 0 < self.max_delay <= MAX_FAULT_SECONDS:
            raise ConfigError("faults delay", f"a positive maximum delay of at most {MAX_FAULT_SECONDS:g} seconds",
                              self.max_delay)
        for peer, at in self.crashes:
            if not 0 <= at <= MAX_FAULT_SECONDS:
                raise ConfigError("faults crash", f"PEER@TIME with a time from 0 to {MAX_FAULT_SECONDS:g} seconds",
                                  f"{peer}@{at}")

    @property
    def kinds(self) -> tuple[str, ...]:
        used = [k for k in ("drop", "delay", "duplicate", "reorder", "garble") if getattr(self, k) > 0]
        return tuple(used + (["crash"] if self.crashes else []))

    def to_spec(self) -> str:
        parts = []
        for name in ("drop", "duplicate", "reorder", "garble"):
            if getattr(self, name):
                parts.append(f"{name}={getattr(self, name)!r}")
        if self.delay:
            parts.append(f"delay={self.delay!r}:{self.max_delay!r}")
        parts += [f"crash={peer}@{at!r}" for peer, at in self.crashes]
        return ",".join(parts)

    @classmethod
    def parse(cls, spec: str | None) -> "FaultPlan":
        if not spec:
            return cls()
        values: dict[str, Any] = {}
        crashes: list[tuple[str, float]] = []
        seen: set[str] = set()
        for part in spec.split(","):
            kind, sep, raw = part.strip().partition("=")
            if not sep or kind not in FAULT_KINDS:
                raise ConfigError("faults", f"kind=value with kind one of {', '.join(FAULT_KINDS)}", part)
            if kind in seen and kind != "crash":
                raise ConfigError(f"faults {kind}", "each fault kind at most once (crash may repeat)", spec)
            seen.add(kind)
            try:
                if kind == "crash":
                    peer, at_sep, at = raw.partition("@")
                    if not at_sep or not peer:
                        raise ValueError
                    crashes.append((peer, _number(at)))
                elif kind == "delay":
                    prob, _, max_delay = raw.partition(":")
                    values["delay"] = _number(prob)
                    if max_delay:
                        values["max_delay"] = _number(max_delay)
                else:
                    values[kind] = _number(raw)
            except ValueError:
                expected = {"crash": "PEER@TIME", "delay": "PROBABILITY[:MAX_SECONDS]"}.get(kind, "a probability")
                raise ConfigError(f"faults {kind}", expected, raw) from None
        return cls(crashes=tuple(crashes), **values)


def _number(text: str) -> float:
    """A fault spec's number: ASCII digits only (`float` would take full-width ones, `０.１`)."""
    if not text.isascii():
        raise ValueError(text)
    return float(text)


class Channel:
    """A one-way message channel with faults; delivers by calling `deliver(message)`.

    `garble(message, rng)` turns a message into its corrupted form; without it
    garbling is not possible on this channel.
    """

    def __init__(self, sim: Simulator, plan: FaultPlan, deliver: Callable[[Any], None], *, latency: float = 0.001,
                 garble: Callable[[Any, random.Random], Any] | None = None,
                 on_fault: Callable[[str, Any], None] | None = None) -> None:
        self.sim, self.plan, self.deliver, self.latency = sim, plan, deliver, latency
        self.garble_fn = garble
        self.on_fault = on_fault or (lambda kind, message: None)
        self.sent = self.delivered = 0
        self._arrival = self._arrive  # the bound method, made once: the fast path of `send` schedules it per message
        # no fault drawn on this channel: `send` only schedules the arrival (the same events, no draw either way);
        # a negative latency takes the general path, where `schedule` refuses it
        self._faultless = latency >= 0 and not (plan.drop or plan.delay or plan.duplicate or plan.reorder
                                                or plan.garble)

    def send(self, message: Any) -> None:
        self.sent += 1
        if self._faultless:  # `sim.schedule(self.latency, self._arrive, message)`, pushed here: a send per message
            sim = self.sim
            heapq.heappush(sim._heap, [sim.now + self.latency, sim._seq, self._arrival, (message,)])
            sim._seq += 1
            return
        plan, rng = self.plan, self.sim.rng
        if plan.drop and rng.random() < plan.drop:
            self.on_fault("drop", message)
            return
        if plan.garble and self.garble_fn is not None and rng.random() < plan.garble:
            message = self.garble_fn(message, rng)
            self.on_fault("garble", message)
        copies = 2 if plan.duplicate and rng.random() < plan.duplicate else 1
        if copies == 2:
            self.on_fault("duplicate", message)
        for _ in range(copies):
            delay = self.latency
            if plan.delay and rng.random() < plan.delay:
                delay += rng.uniform(0.0, plan.max_delay)
                self.on_fault("delay", message)
            if plan.reorder and rng.random() < plan.reorder:
                # hold this message back past the next few latencies so later sends overtake it
                delay += self.latency * rng.randint(2, 5)
                self.on_fault("reorder", message)
            self.sim.schedule(delay, self._arrive, message)

    def _arrive(self, message: Any) -> None:
        self.delivered += 1
        self.deliver(message)


class Driver:
    """The state of a transition system as a timing policy advances it.

    A simulation is a timing policy: it decides which enabled action happens
    when, and learns what the action did from the system's `transition`
    effects. The driver is the only place a simulation's model state lives,
    and every change goes through the system, so the actions it kept replay
    through `run_actions` to the same state (tests check this per model).
    """

    def __init__(self, system: Any, initial: Any = None) -> None:
        self.system = system
        self.state = next(iter(system.initial_states())) if initial is None else initial
        self.initial = self.state
        self.actions: list[Any] = []
        # `kvsim.engine.system.transition(system, ...)`, resolved once: a driver applies an action per event
        fn = getattr(system, "transition", None)
        self._transition: Callable[[Any, Any], tuple[Any, tuple[Any, ...]]] = \
            fn if fn is not None else (lambda state, action: transition(system, state, action))

    def enabled(self) -> Any:
        return self.system.enabled(self.state)

    def apply(self, action: Any) -> tuple[Any, ...]:
        """Take `action` (it must be enabled) and return its effects."""
        self.state, effects = self._transition(self.state, action)
        self.actions.append(action)
        return effects
