"""Exhaustive bounded exploration of a transition system.

Breadth-first over state fingerprints (the states themselves: they are
hashable), so the first path found to any state is a shortest one. Every
invariant is checked on every reached state; a violating state is reported
with its shortest action path and not expanded further. Liveness: after the
search, any expanded state from which no `done` state can be reached is a
hang. States cut off by a bound count as "might still finish", so a bound
never produces a false hang.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from .canon import canonical_json, to_jsonable
from .system import TransitionSystem


@dataclass
class Violation:
    property: str
    kind: str  # "invariant" or "hang"
    trace: list[Any]
    message: str
    state: Any

    def to_json(self) -> dict[str, Any]:
        return {"property": self.property, "kind": self.kind, "trace": self.trace, "message": self.message,
                "state": to_jsonable(self.state)}


@dataclass
class ExploreResult:
    model: str
    variant: str
    states: int
    transitions: int
    depth: int
    seconds: float
    bound_hit: str | None
    violations: list[Violation]
    hang_states: int = 0
    _store: "_Store | None" = field(default=None, repr=False)

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else float(self.states)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "variant": self.variant, "states": self.states,
                "transitions": self.transitions, "depth": self.depth, "seconds": round(self.seconds, 4),
                "states_per_second": round(self.states_per_second, 1), "bound_hit": self.bound_hit,
                "complete": self.bound_hit is None,
                "hang_states": self.hang_states, "violations": [v.to_json() for v in self.violations]}

    def graph(self) -> nx.MultiDiGraph:
        """The explored state graph: nodes carry the state, depth and flags; edges the action."""
        assert self._store is not None
        return self._store.to_graph()


class _Store:
    """Parallel arrays indexed by state id; cheaper than one object per state."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.states: list[Any] = []
        self.parent: list[int] = []
        self.via: list[Any] = []
        self.depth: list[int] = []
        self.succ: list[list[tuple[int, Any]] | None] = []  # None: not expanded
        self.done: list[bool] = []
        self.bad: list[bool] = []

    def add(self, state: Any, parent: int, action: Any, depth: int) -> int:
        sid = len(self.states)
        self.ids[state] = sid
        self.states.append(state)
        self.parent.append(parent)
        self.via.append(action)
        self.depth.append(depth)
        self.succ.append(None)
        self.done.append(False)
        self.bad.append(False)
        return sid

    def path(self, sid: int) -> list[Any]:
        actions = []
        while self.parent[sid] >= 0:
            actions.append(self.via[sid])
            sid = self.parent[sid]
        return [to_jsonable(a) for a in reversed(actions)]

    def to_graph(self) -> nx.MultiDiGraph:
        g = nx.MultiDiGraph()  # two actions may lead to the same successor
        for sid, state in enumerate(self.states):
            g.add_node(sid, state=canonical_json(state), depth=self.depth[sid], done=self.done[sid],
                       violation=self.bad[sid], expanded=self.succ[sid] is not None)
        for sid, succ in enumerate(self.succ):
            for tid, action in succ or ():
                g.add_edge(sid, tid, action=canonical_json(action))
        return g


def explore(system: TransitionSystem[Any, Any], *, max_depth: int | None = None, max_states: int = 1_000_000,
            check_liveness: bool = True, progress: Callable[[int, int], None] | None = None,
            max_seconds: float | None = None) -> ExploreResult:
    """BFS with invariants on every state and, unless `check_liveness` is off, the hang search.

    Bounds (`max_depth`, `max_states`, `max_seconds`) stop the search cleanly: `bound_hit` names the one
    that did, and states left unexpanded count as "might still finish" (no false hang).
    """
    start = time.perf_counter()
    deadline = None if max_seconds is None else start + max_seconds
    store = _Store()
    queue: deque[int] = deque()
    violations: dict[str, Violation] = {}
    invariants = list(system.invariants)
    enabled, step, done = system.enabled, system.step, system.done
    bound_hit: str | None = None
    transitions = 0
    max_depth_seen = 0

    def discover(state: Any, parent: int, action: Any, depth: int) -> int:
        sid = store.add(state, parent, action, depth)
        store.done[sid] = done(state)
        for inv in invariants:
            message = inv.check(state)
            if message is not None:
                store.bad[sid] = True
                if inv.name not in violations:
                    violations[inv.name] = Violation(inv.name, "invariant", store.path(sid), message, state)
                break
        if not store.bad[sid]:
            queue.append(sid)
        return sid

    for init in system.initial_states():
        if init not in store.ids:
            discover(init, -1, None, 0)

    ids, succ_of, depth_of = store.ids, store.succ, store.depth
    while queue:
        sid = queue.popleft()
        depth = depth_of[sid]
        if max_depth is not None and depth >= max_depth:
            bound_hit = bound_hit or "depth"
            continue
        state = store.states[sid]
        succ: list[tuple[int, Any]] = []
        for action in enabled(state):
            nxt = step(state, action)
            tid = ids.get(nxt)
            if tid is None:
                if len(store.states) >= max_states:
                    bound_hit = "states"
                    succ = []  # leave this state unexpanded: its successors are unknown
                    break
                tid = discover(nxt, sid, action, depth + 1)
                if depth + 1 > max_depth_seen:
                    max_depth_seen = depth + 1
            succ.append((tid, action))
        else:
            succ_of[sid] = succ
            transitions += len(succ)
            if sid % 4096 == 0:
                if progress is not None:
                    progress(len(store.states), depth)
                if deadline is not None and time.perf_counter() > deadline:
                    bound_hit = "seconds"
                    break  # the work budget: what was found so far is kept, the rest is unexplored
            continue
        break  # state bound hit

    hang_states = 0
    if check_liveness:
        hang_states = _find_hangs(store, system, violations)
    seconds = time.perf_counter() - start
    return ExploreResult(model=system.name, variant=str(system.variant), states=len(store.states),
                         transitions=transitions, depth=max_depth_seen, seconds=seconds, bound_hit=bound_hit,
                         violations=list(violations.values()), hang_states=hang_states, _store=store)


def _find_hangs(store: _Store, system: TransitionSystem[Any, Any], violations: dict[str, Violation]) -> int:
    """Reverse reachability from every state that is done, unexpanded (cut by a bound) or already a violation."""
    n = len(store.states)
    preds: list[list[int]] = [[] for _ in range(n)]
    for sid, succ in enumerate(store.succ):
        for tid, _ in succ or ():
            preds[tid].append(sid)
    alive = [store.done[s] or store.succ[s] is None or store.bad[s] for s in range(n)]
    stack = [s for s in range(n) if alive[s]]
    while stack:
        s = stack.pop()
        for p in preds[s]:
            if not alive[p]:
                alive[p] = True
                stack.append(p)
    hangs = [s for s in range(n) if not alive[s]]
    if hangs:
        first = min(hangs, key=lambda s: (store.depth[s], s))
        name = getattr(system, "liveness", "liveness")
        state = store.states[first]
        kind = "deadlock" if not store.succ[first] else "livelock"
        violations[name] = Violation(name, "hang", store.path(first),
                                     f"{kind}: no done state is reachable from this state "
                                     f"({len(hangs)} such states)", state)
    return len(hangs)
