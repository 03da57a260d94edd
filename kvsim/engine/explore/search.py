"""Exhaustive bounded exploration of a transition system.

Breadth-first over the visited states (kept whole, or as 64-bit fingerprints:
`kvsim.engine.explore.store`), so the first path found to any state is a shortest one. Every
invariant is checked on every reached state; a violating state is reported
with its shortest action path and not expanded further. Each reachability
declaration (`Sometimes`) is asked of the states reached (a step one: of the
transitions taken) until one satisfies it: its depth and shortest path are
reported, or, after a complete search, that no reachable state does. Liveness: after the
search, any expanded state from which no `done` state can be reached is a
hang. States cut off by a bound count as "might still finish", so a bound
never produces a false hang. A system may declare its symmetries as
`canonical(state)`: then one representative per orbit is stored, and each
reported path is mapped back to a path of the real system (`realize`).
"""

from __future__ import annotations

import time
from collections import deque
from collections import _count_elements as count  # the C loop of `Counter.update`
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Callable, Iterable, Sequence

from ..actions import Tagged
from ..canon import to_jsonable
from ..interrupt import INTERRUPT, asked
from ..memory import YoungCollections, machine, memory_limit, resident_bytes
from ..pace import Pace
from ..system import NOT_WITHIN_BOUND, REACHED, UNREACHED, TransitionSystem, sometimes, taking
from .backward import hung_states
from .checkpoint import Snapshot, held_by
from .options import ExploreOptions
from .fingerprint import fingerprint_function
from .store import FingerprintStore, FullStore, Interner, Recent


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
class Reach:
    """What a search found of one reachability declaration: the depth of the first state that satisfied it and
    the path there (breadth-first: a shortest one), or None: `status` says whether a complete search proved it
    unreachable or a bound stopped the search first."""

    name: str
    doc: str
    depth: int | None
    trace: list[Any] | None
    status: str = REACHED
    step: bool = False  # a step declaration: the path's last step is the one that met it

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "doc": self.doc, "step": self.step, "status": self.status,
                "reached": self.depth is not None, "depth": self.depth, "trace": self.trace}


def reaches(system: Any, found: dict[int, Any], bound_hit: str | None,
            witness: Callable[[Any], tuple[int, Any, list[Any]]]) -> list["Reach"]:
    """Each of the system's `Sometimes`, in declaration order: `found` maps a declaration's index to where the
    search first met it (the state, or a step one's source state), and `witness(where)` gives that state's depth,
    the real state and the path there; a step declaration's path ends with the step it met."""
    out = []
    for k, goal in enumerate(sometimes(system)):
        if k in found:
            depth, state, trace = witness(found[k])
            if goal.step:
                move = taking(system, state, goal.check)
                if move is None:
                    raise AssertionError(f"sometimes {goal.name}: no step of {state!r} satisfies it on the real "
                                         "system (a step declaration must not tell symmetric components apart)")
                depth, trace = depth + 1, trace + [to_jsonable(move)]
            out.append(Reach(goal.name, goal.doc, depth, trace, REACHED, goal.step))
        else:
            out.append(Reach(goal.name, goal.doc, None, None, NOT_WITHIN_BOUND if bound_hit else UNREACHED, goal.step))
    return out


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
    coverage: "Coverage | None" = None
    store: str = "full"
    symmetry: bool = False
    bytes_per_state: float | None = None
    collision_probability: float | None = None
    levels: list[int] = field(default_factory=list)  # states first reached at each depth (0: the initial ones)
    resumed: bool = False  # went on from a checkpoint (`seconds` counts every run of the search)
    checkpoint: str | None = None  # the folder the search saved itself to (go on with `resume`), if it did
    worker_lines: dict[str, list[int]] | None = field(default=None, repr=False)  # lines a partition's workers ran
    reachability: list[Reach] = field(default_factory=list)  # each `Sometimes` of the system, in its order
    _store: Any = field(default=None, repr=False)

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else float(self.states)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "variant": self.variant, "states": self.states,
                "transitions": self.transitions, "depth": self.depth, "seconds": round(self.seconds, 4),
                "states_per_second": round(self.states_per_second, 1), "bound_hit": self.bound_hit,
                "complete": self.bound_hit is None,
                "hang_states": self.hang_states, "states_per_depth": self.levels,
                "violations": [v.to_json() for v in self.violations],
                **({"coverage": self.coverage.to_json()} if self.coverage is not None else {}),
                "store": self.store, "symmetry": self.symmetry,
                **({"bytes_per_state": self.bytes_per_state} if self.bytes_per_state is not None else {}),
                **({"collision_probability": self.collision_probability}
                   if self.collision_probability is not None else {}),
                "resumed": self.resumed, "checkpoint": self.checkpoint,
                "reachability": [r.to_json() for r in self.reachability]}

    @property
    def unreached(self) -> list[Reach]:
        """The reachability declarations a complete search proved no reachable state satisfies."""
        return [r for r in self.reachability if r.status == UNREACHED]

    def graph(self) -> Any:
        """The explored state graph (a networkx MultiDiGraph): nodes carry the state, depth and flags."""
        if not isinstance(self._store, FullStore):
            raise ValueError("the state graph needs the full store (explore(system, ExploreOptions(store='full')))")
        return self._store.to_graph()


def action_kind(action: Any) -> str:
    """An action's kind: the tag of a tagged record (or plain tuple), else its type's name."""
    if isinstance(action, tuple) and action and isinstance(action[0], str):
        return action[0]
    return type(action).__name__


@dataclass
class Coverage:
    """What a run exercised: transitions taken per action kind, states each invariant was checked on.

    An invariant is checked on a state until one fails there (the state is then a violation and the
    rest are not asked), so a count below the state count means earlier invariants failed first.
    """

    actions: dict[str, int]
    invariants: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"actions": dict(sorted(self.actions.items())), "invariants": dict(self.invariants)}

    def lines(self) -> list[str]:
        acts = ", ".join(f"{k} {n:,}" for k, n in sorted(self.actions.items())) or "none"
        invs = ", ".join(f"{k} {n:,}" for k, n in self.invariants.items()) or "none"
        return [f"actions taken: {acts}", f"invariants checked on: {invs}"]


def explore(system: TransitionSystem[Any, Any], options: ExploreOptions = ExploreOptions()) -> ExploreResult:
    """BFS with invariants on every state and, unless `options.check_liveness` is off, the hang search.

    The bounds (`max_depth`, `max_states`, `max_seconds`, `max_memory`, `memory_share`: the last three checked
    every few thousand expansions) stop the search cleanly: `bound_hit` names the one that did, and states
    left unexpanded count as "might still finish" (no false hang). The store is "full" (every state kept;
    the graph can be exported) or "fingerprint" (see `kvsim.engine.explore.store`). A system that defines
    `canonical(state)` (one representative per orbit of its symmetries) is explored one representative
    per orbit unless `options.symmetry` is off; the reported paths are mapped back to paths of the real
    system. With a `checkpoint`, the search is saved there every `checkpoint.every` seconds and when a bound
    other than the depth stops it; `resume` goes on from its last save, to the result one uninterrupted
    search would give, and the search holds the folder while it runs (`CheckpointDir.held`: another search named
    to it is refused). Every option: `ExploreOptions`.
    """
    with held_by(options):
        return _breadth_first(system, options)


def _breadth_first(system: TransitionSystem[Any, Any], options: ExploreOptions) -> ExploreResult:
    """`explore`'s search (its checkpoint folder, if any, held by the caller)."""
    max_depth, max_states, progress = options.max_depth, options.max_states, options.progress
    checkpoint, resume = options.checkpoint, options.resume
    start = time.perf_counter()
    deadline = None if options.max_seconds is None else start + options.max_seconds
    memory_cap = memory_limit(machine()[1], options.max_memory, options.memory_share)
    canon = getattr(system, "canonical", None) if options.symmetry else None
    enabled, step, done = system.enabled, system.step, system.done
    initial = [s if canon is None else canon(s) for s in system.initial_states()]
    visited = _make_store(options.store, system, initial, step if canon is None else _reduced(step, canon))
    # successors seen lately, by value (hash and ==, no fingerprint): most transitions that reach a known
    # state reach one found a few expansions before (the other side of a diamond), so the fingerprint (and
    # the canonical form) is computed about once per state, not once per transition
    recent = Recent() if visited.kind == "fingerprint" or canon is not None else None
    queue: deque[tuple[int, Any, Any]] = deque()  # (id, state, key): a successor's fingerprint starts from its parent's
    violations: dict[str, Violation] = {}
    invariants = list(system.invariants)
    transitions = max_depth_seen = 0
    checked = [0] * len(invariants)
    fired: dict[str, int] = {}
    taken: dict[Any, int] = {}  # transitions taken per action, not yet in `fired` (`tally`)
    goals = sometimes(system)
    met: dict[int, int] = {}  # a `Sometimes`'s index -> the first state that satisfied it (a step one's source)
    depth_cut, before = False, 0.0
    if resume:
        saved = checkpoint.resume_as(Snapshot, f"a checkpoint of a single-process search with the {visited.kind} store",
                                     lambda body: body.store.kind == visited.kind)[1]
        visited, queue, violations = visited.adopt(saved.store), deque(saved.queue), dict(saved.violations)
        transitions, max_depth_seen, checked, fired = saved.transitions, saved.depth, saved.checked, saved.fired
        depth_cut, before, met = saved.depth_cut, saved.seconds, dict(saved.reached)
    # asked until satisfied: of every new state (`pending`), of every transition (`moves`: step declarations)
    pending = [(k, goal.check) for k, goal in enumerate(goals) if k not in met and not goal.step]
    moves = [(k, goal.check) for k, goal in enumerate(goals) if k not in met and goal.step]
    bound_hit: str | None = "depth" if depth_cut else None
    key, find, add, depth_of, expand = visited.key, visited.find, visited.add, visited.depth, visited.expand
    ids = visited.parent  # one entry a state: its length is the state count (`len(visited)`, without a call)
    bad, done_flag = visited.bad, visited.done
    saved_gen: str | None = None
    # a successor's fingerprint is taken against the state it was reached from (`FieldFingerprint`): the fields
    # it shares with that state are not looked up (the full store has no key function: a state is its own key)
    expanding, successor_key = getattr(key, "expanding", None), getattr(key, "successor", key)
    # a successor's first lookup, one call in C a transition: the recent successors' dict, or, without them (the
    # full store, no symmetry: a state is its own key), the store's
    lookup = find if recent is None else recent.get
    intern = Interner(text=key if hasattr(key, "held") else None)  # the full store: no fingerprint
    # the invariants asked of each new state, as plain functions; how many states each was asked of is counted
    # from the states checked and where a check stopped (`checked_now`), not with a count per check
    checks = [inv.check for inv in invariants]
    tags: dict[type, str] = {}  # a tagged record type -> its tag (`action_kind`), for the coverage count
    stopped = [0] * len(invariants)  # states this run where invariant k failed (the later ones were not asked)
    checked_from = len(visited)  # states checked before this run's first (a resumed search: its checkpoint's)

    def checked_now() -> list[int]:
        total, out = len(visited) - checked_from, []
        for k in range(len(invariants)):
            out.append(checked[k] + total)
            total -= stopped[k]
        return out

    stop_on, halt = options.stop_on, [False]  # halt: a `stop_on` invariant failed (the search ends there)

    def discover(found: Any, reached: Any, parent: int, action: Any, index: int, depth: int, like: Any = None) -> int:
        state = intern(reached, like)  # held from now on: its fields are the equal ones held already
        if found is reached:  # the full store: the state is its own key, and one object
            found = state
        sid = add(found, state, parent, action, index, depth)
        if done(state):  # (a new state's flags start clear)
            done_flag[sid] = True
        for check in checks:
            message = check(state)
            if message is not None:  # rare: which invariant, and the count of states it stopped, only now
                k = next(j for j, c in enumerate(checks) if c is check)
                stopped[k] += 1
                bad[sid] = True
                name = invariants[k].name
                if name not in violations:
                    violations[name] = _violation(system, canon, visited, name, "invariant", sid, message)
                    halt[0] = halt[0] or name in stop_on
                break
        else:
            queue.append((sid, state, found))
        if pending:
            hit = [k for k, check in pending if check(state)]
            if hit:  # met: not asked again
                met.update((k, sid) for k in hit)
                pending[:] = [(k, check) for k, check in pending if k not in met]
        return sid

    def tally(actions: Iterable[Any] = ()) -> None:
        """Adds to `fired` the actions counted in `taken`, then `actions`, each under its kind (`action_kind`)."""
        for action, n in chain(((a, 1) for a in actions), taken.items()):
            kind = tags.get(type(action))  # a tagged record's kind is its type's tag
            if kind is None:
                kind = action_kind(action)
                if isinstance(action, Tagged):
                    tags[type(action)] = kind
            fired[kind] = fired.get(kind, 0) + n
        taken.clear()

    def save() -> str:
        tally()
        snapshot = Snapshot(visited, list(queue), dict(violations), transitions, max_depth_seen, checked_now(), fired,
                            depth_cut, before + time.perf_counter() - start, dict(met))
        with checkpoint.saving("resume" if resume else "checkpoint"):
            gen = checkpoint.begin()
            checkpoint.commit(gen, snapshot)
        return gen

    if not resume:
        for k, init in enumerate(initial):
            first = init if key is None else key(init)
            if find(first) is None:
                discover(first, init, -1, None, k, 0)

    if checkpoint is not None:
        checkpoint.schedule(start)
    collector = YoungCollections()
    pace, look_at = Pace(time.perf_counter), 0  # when the clock, the memory and a Ctrl-C are looked at next
    try:
        while queue:
            if halt[0]:  # an initial state violates a `stop_on` invariant
                bound_hit = "violation"
                break
            sid, state, fp = queue.popleft()
            depth = depth_of[sid]
            if max_depth is not None and depth >= max_depth:
                bound_hit, depth_cut = bound_hit or "depth", True
                continue
            tids: list[int] = []  # the successors' ids, in the order of `actions`
            if expanding is not None:
                expanding(state, fp)
            actions = enabled(state)
            for action in actions:
                nxt = step(state, action)
                if moves:
                    hit = [k for k, check in moves if check(state, action, nxt)]
                    if hit:
                        met.update((k, sid) for k in hit)
                        moves[:] = [(k, check) for k, check in moves if k not in met]
                tid = lookup(nxt)
                if tid is None:
                    k = rep = nxt
                    if recent is not None:  # a miss of the recent successors: the key, from the representative
                        rep = nxt if canon is None else canon(nxt)
                        k = rep if successor_key is None else successor_key(rep)
                        tid = find(k)
                    if tid is None:
                        if len(ids) >= max_states:
                            bound_hit = "states"
                            queue.appendleft((sid, state, fp))  # unexpanded: its successors are not all known
                            break
                        tid = discover(k, rep, sid, action, len(tids), depth + 1, state)
                        if depth + 1 > max_depth_seen:
                            max_depth_seen = depth + 1
                        if halt[0]:
                            bound_hit = "violation"
                            queue.appendleft((sid, state, fp))  # unexpanded, as at the state bound
                            break
                    if recent is not None:
                        recent.put(nxt, tid)
                tids.append(tid)
            else:
                expand(sid, tids, actions)
                transitions += len(tids)
                try:
                    count(taken, actions)  # by action, in C; by kind in `tally`
                except TypeError:  # an action with no hash
                    tally(actions)
                if sid % 4096 == 0:
                    collector.tick()
                    if len(taken) > 4096:  # (a model whose actions carry much data)
                        tally()
                if sid >= look_at:  # every few thousand states, or every state where states are slow (`pace`)
                    now = pace.read()
                    look_at = sid + pace.every
                    if progress is not None:
                        progress(len(visited), depth)
                    if deadline is not None and now > deadline:
                        bound_hit = "seconds"
                        break  # the work budget: what was found so far is kept, the rest is unexplored
                    if memory_cap is not None and resident_bytes() > memory_cap:
                        bound_hit = "memory"
                        break  # stopped before the machine runs out, with what was found so far
                    if asked():
                        bound_hit = INTERRUPT
                        break  # Ctrl-C or SIGTERM (`interrupt`): kept, and saved where there is a checkpoint
                    if checkpoint is not None and checkpoint.due(now, deadline):
                        saved_gen = save()
                continue
            break  # state bound (or a `stop_on` violation) hit

        tally()
        if checkpoint is not None and checkpoint.stopped(bound_hit):
            saved_gen = save()
        hang_states = 0
        if options.check_liveness:
            hang_states = _find_hangs(visited, system, canon, violations)
    finally:
        collector.close()
    seconds = before + time.perf_counter() - start
    return ExploreResult(model=system.name, variant=str(system.variant), states=len(visited),
                         transitions=transitions, depth=max_depth_seen, seconds=seconds, bound_hit=bound_hit,
                         violations=list(violations.values()), hang_states=hang_states,
                         coverage=Coverage(fired, {inv.name: n for inv, n in zip(invariants, checked_now())}),
                         store=visited.kind, symmetry=canon is not None,
                         bytes_per_state=visited.bytes_per_state(),
                         collision_probability=getattr(visited, "collision_probability", lambda: None)(),
                         levels=states_per_depth(visited.depth), resumed=resume,
                         checkpoint=None if saved_gen is None else checkpoint.path,
                         reachability=reaches(system, met, bound_hit, lambda sid: _witness(system, canon, visited, sid)),
                         _store=visited)


def states_per_depth(depths: Iterable[int]) -> list[int]:
    """How many states were first reached at each depth: the growth a researcher reads to judge whether a
    bounded search was near its end."""
    levels: list[int] = []
    for d in depths:
        while d >= len(levels):
            levels.append(0)
        levels[d] += 1
    return levels


def _reduced(step: Callable[[Any, Any], Any], canon: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """The step of the reduced system: from a representative to the representative of the successor."""
    return lambda state, action: canon(step(state, action))


def _make_store(kind: str, system: Any, initial: list[Any], step: Callable[[Any, Any], Any]) -> Any:
    if kind == "full":
        return FullStore()
    enabled = system.enabled

    def replay(indices: Sequence[int], root: int) -> tuple[Any, list[Any]]:
        state, actions = initial[root], []
        for index in indices:
            action = enabled(state)[index]
            actions.append(action)
            state = step(state, action)
        return state, actions

    return FingerprintStore(fingerprint_function(system), replay)


def realize(system: Any, canon: Callable[[Any], Any], states: Sequence[Any]) -> tuple[Any, list[Any]]:
    """A real path through representatives `states` (canonical, each a step from the last): its end, its actions.

    From the real state s standing for representative c_i, some enabled action of s leads to a state whose
    representative is c_{i+1} (the symmetry maps c_i's action back to one of s); the first such is taken.
    """
    real = next(s for s in system.initial_states() if canon(s) == states[0])
    actions = []
    for target in states[1:]:
        for action in system.enabled(real):
            nxt = system.step(real, action)
            if canon(nxt) == target:
                real = nxt
                actions.append(action)
                break
        else:
            raise AssertionError(f"symmetry: no action of {real!r} reaches the orbit of {target!r} "
                                 "(the declared canonical form is not a symmetry of the system)")
    return real, actions


def _path_states(visited: Any, sid: int) -> list[Any]:
    chain = []
    while sid >= 0:
        chain.append(sid)
        sid = visited.parent[sid]
    return [visited.state(s) for s in reversed(chain)]


def _witness(system: Any, canon: Callable[[Any], Any] | None, visited: Any, sid: int) -> tuple[int, Any, list[Any]]:
    """State `sid`'s depth, and the state and path there, of the real system where the search kept representatives."""
    if canon is None:
        return visited.depth[sid], visited.state(sid), visited.path(sid)
    real, actions = realize(system, canon, _path_states(visited, sid))
    return visited.depth[sid], real, [to_jsonable(a) for a in actions]


def _violation(system: Any, canon: Callable[[Any], Any] | None, visited: Any, name: str, kind: str, sid: int,
               message: str) -> Violation:
    if canon is None:
        return Violation(name, kind, visited.path(sid), message, visited.state(sid))
    real, actions = realize(system, canon, _path_states(visited, sid))
    return Violation(name, kind, [to_jsonable(a) for a in actions], real_message(system, name, real, message), real)


def real_message(system: Any, name: str, real: Any, message: str) -> str:
    """An invariant's message on the real state a path was mapped back to (the representative's may name
    other rooms, requests or writers); a hang's message is the search's own."""
    for inv in system.invariants:
        if inv.name == name:
            return inv.check(real) or message
    return message


def _find_hangs(visited: Any, system: TransitionSystem[Any, Any], canon: Callable[[Any], Any] | None,
                violations: dict[str, Violation]) -> int:
    """Reverse reachability from every state that is done, unexpanded (cut by a bound) or already a violation."""
    n = len(visited)
    hangs = hung_states(n, *visited.successor_arrays(), visited.ends())
    if hangs:
        first = min(hangs, key=lambda s: (visited.depth[s], s))
        name = getattr(system, "liveness", "liveness")
        kind = "deadlock" if next(iter(visited.successors(first)), None) is None else "livelock"
        violations[name] = _violation(system, canon, visited, name, "hang", first,
                                      f"{kind}: no done state is reachable from this state ({len(hangs)} such states)")
    return len(hangs)
