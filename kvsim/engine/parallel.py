"""Level-synchronous breadth-first exploration over worker processes or a Ray cluster.

The state space is partitioned: a state belongs to worker `hash(state) % W` when every worker
hashes alike (forked processes do: same string secret, same addresses for None and the other
objects hashed by identity; the coordinator checks), else to worker
`fingerprint(state) % W` (the BLAKE2b fingerprint of `kvsim.engine.store`, the same in any process).
Each level has two phases. In *expand*, every worker takes the successors of its frontier and
sorts them into one outbox per owner (each distinct successor is routed once, and a fingerprint
taken to route it travels with it); in *absorb*, every worker takes its inbox (the outboxes
addressed to it, in worker order), keeps the states it has not seen (its own visited set, full
states or fingerprints as in `kvsim.engine.store`), checks every invariant on them and makes them
its next frontier (`absorb_level`). With the fingerprint store an outbox holds keys and edges only:
the owner asks for the states it finds new (`absorb`), their senders send them (`serve`), and the
owner checks them (`receive`), so a state already known never travels. The outbox a worker addresses to itself never leaves it (neither pickled nor sent);
the others go through the coordinator's pipes (forked processes) or, on Ray, stay in the object
store while the coordinator passes on references (`kvsim.engine.pools.RayMail`).
Automatic garbage collection is off in a worker (`memory.YoungCollections`, a tick a level).
A global state id is `local * W + worker`.

The liveness pass (`cannot_finish`) runs in the workers as well, in rounds (`kvsim.engine.hangs`).

Every reachable state is found at its breadth-first depth, exactly as by `explore`: the same
state count, transitions, depth, violated invariants and liveness verdict, and counterexamples
of the same (shortest) length; which of several shortest paths is reported may differ. Bounds
are checked between levels, so `max_states` may be passed by up to one level. The counterexample
path is rebuilt in this process by replaying the enabled-action indices each worker recorded.
"""

from __future__ import annotations

import pickle
import time
from array import array
from typing import Any, Callable, Sequence

from .checkpoint import CheckpointDir, Level, dump, load, partition_file
from .explore import (DEFAULT_MAX_STATES, Coverage, ExploreResult, Violation, action_kind,
                      real_message, realize)
from .hangs import HangRounds, spread_hangs
from .memory import YoungCollections, resident_bytes
from .pools import Mail, ProcessPool, RayPool
from .canon import to_jsonable
from .errors import ConfigError
from .store import FingerprintSet, fingerprint_function


Entry = tuple[Any, "int | None", list[tuple[int, int]]]  # an outbox's state, its fingerprint if taken, its edges


class Partition(HangRounds):
    """One worker's share of the search: its visited set, flags, reverse edges and frontier."""

    def __init__(self, factory: Callable[[], Any], worker: int, workers: int, store: str, symmetry: bool,
                 max_depth: int | None, mail: Mail | None = None) -> None:
        self.system = factory()
        self.mail = Mail() if mail is None else mail
        self.w, self.n = worker, workers
        self.canon = getattr(self.system, "canonical", None) if symmetry else None
        self.fp = fingerprint_function(self.system)
        self.max_depth = max_depth
        self.full = store == "full"
        self.ids: dict[Any, int] | FingerprintSet = {} if self.full else FingerprintSet()
        self.parent = array("q")
        self.index = array("I")
        self.depth = array("I")
        self.flags = bytearray()  # bit 0 done, bit 1 bad, bit 2 expanded, bit 3 has a successor
        self.rev_src = array("q")  # reverse edges: (source gid -> target gid) for every transition into ours
        self.rev_dst = array("q")
        self.frontier: list[tuple[int, Any]] = []
        self.fired: dict[str, int] = {}
        self.checked = [0] * len(self.system.invariants)
        self.collector = YoungCollections()  # as in `explore`; a tick each level, closed by `finish`
        self.own: list[Entry] = []  # this level's successors that are our own
        self.alive: bytearray | None = None  # the liveness pass (`HangRounds`): can reach a done state
        # a level's exchange with the fingerprint store: the states sent for only as they turn out new
        self.held: list[list[Any]] = []  # per worker: the states of what `expand` addressed to it, by position
        self.arriving: list[Any] = []  # this level's new states, in id order (None: sent for, not here yet)
        self.awaiting: list[list[int]] = []  # per worker: where in `arriving` the states it is asked for go
        if not self.full:  # the fingerprint is the key the owner needs: taken once, by the sender
            self.route_by_fingerprint()

    def owner(self, state: Any) -> tuple[int, int | None]:
        """(the worker a state belongs to, its fingerprint where that was taken to route it)."""
        return hash(state) % self.n, None

    def secret(self) -> int:
        """Equal in every worker iff they hash alike: the string secret, and None's hash (its address in 3.11)."""
        return hash((None, "kvsim partition"))

    def route_by_fingerprint(self) -> None:
        fp, n = self.fp, self.n

        def owner(state: Any) -> tuple[int, int]:
            key = fp(state)
            return key % n, key

        self.owner = owner  # type: ignore[method-assign]

    def _step(self, state: Any, action: Any) -> Any:
        nxt = self.system.step(state, action)
        return nxt if self.canon is None else self.canon(nxt)

    def initial(self) -> list[bytes]:
        """The initial states, routed like successors (only worker 0 is asked)."""
        boxes: list[list[Entry]] = [[] for _ in range(self.n)]
        seen: dict[Any, list[tuple[int, int]]] = {}
        for k, state in enumerate(self.system.initial_states()):
            state = state if self.canon is None else self.canon(state)
            edges = seen.get(state)
            if edges is None:
                edges = seen[state] = []
                dst, key = self.owner(state)
                boxes[dst].append((state, key, edges))
            edges.append((-1, k))
        return [pickle.dumps(box, protocol=pickle.HIGHEST_PROTOCOL) for box in boxes]

    def expand(self) -> tuple[list[Any], int, int]:
        """(one pickled outbox per owner, as `mail.post` hands it on, transitions taken, states cut by the depth
        bound) for this level.

        A successor reached from several frontier states goes once, with every (parent, action index)
        that reaches it, in the order they were found: the first is its breadth-first parent. Its owner
        is found once (and its fingerprint, when that routes it, travels with it: the owner does not
        take it again). The outbox addressed to this worker stays here as it is (None in its place):
        `absorb` takes it back.
        """
        self.collector.tick()
        boxes: list[list[Entry]] = [[] for _ in range(self.n)]
        level: dict[Any, list[tuple[int, int]]] = {}  # this level's successors, whoever owns them
        transitions = cut = 0
        fired, enabled, owner, step = self.fired, self.system.enabled, self.owner, self._step
        for lid, state in self.frontier:
            if self.max_depth is not None and self.depth[lid] >= self.max_depth:
                cut += 1
                continue
            gid = lid * self.n + self.w
            actions = enabled(state)
            for index, action in enumerate(actions):
                nxt = step(state, action)
                edges = level.get(nxt)
                if edges is None:
                    edges = level[nxt] = []
                    dst, key = owner(nxt)
                    boxes[dst].append((nxt, key, edges))
                edges.append((gid, index))
                kind = action_kind(action)
                fired[kind] = fired.get(kind, 0) + 1
                transitions += 1
            self.flags[lid] |= 12 if actions else 4
        self.frontier = []
        self.own = boxes[self.w]
        if not self.full:  # only keys and edges go now: a state goes once its owner finds it new (`serve`)
            self.held = [[e[0] for e in box] for box in boxes]
            boxes = [[(None, key, edges) for _, key, edges in box] for box in boxes]
        post = self.mail.post
        return ([None if dst == self.w else post(pickle.dumps(box, protocol=pickle.HIGHEST_PROTOCOL))
                 for dst, box in enumerate(boxes)], transitions, cut)

    def absorb(self, inbox: Sequence[Any], depth: int) -> list[list[int]]:
        """Take in this level's inbox (outboxes in worker order): a state not seen before gets the next id,
        every edge its reverse edge. Returns, per worker, the positions in the outbox it sent of the new
        states that came without their state (the fingerprint store sends keys first): `serve` sends
        those, `receive` checks them all."""
        asked: list[list[int]] = [[] for _ in range(self.n)]
        self.awaiting = [[] for _ in range(self.n)]
        self.arriving = []
        for src, payload in enumerate(self.mail.fetch(inbox)):
            for i, (state, key, edges) in enumerate(self.own if payload is None else pickle.loads(payload)):
                key = state if self.full else self.fp(state) if key is None else key
                lid = self.ids.get(key)
                if lid is None:
                    lid = len(self.parent)
                    if self.full:
                        self.ids[key] = lid
                    else:
                        self.ids.put(key, lid)
                    parent, index = edges[0]
                    self.parent.append(parent)
                    self.index.append(index)
                    self.depth.append(depth)
                    if state is None:
                        asked[src].append(i)
                        self.awaiting[src].append(len(self.arriving))
                    self.arriving.append(state)
                gid = lid * self.n + self.w
                for parent, _ in edges:
                    if parent >= 0:
                        self.rev_src.append(parent)
                        self.rev_dst.append(gid)
        self.own = []
        return asked

    def serve(self, asked: Sequence[Sequence[int]]) -> list[Any]:
        """Per worker, the states it asked for (positions in the outbox sent to it), as `mail.post` hands
        them on; None where it asked for none."""
        post = self.mail.post
        out = [None if not positions else post(pickle.dumps([self.held[dst][i] for i in positions],
                                                            protocol=pickle.HIGHEST_PROTOCOL))
               for dst, positions in enumerate(asked)]
        self.held = []
        return out

    def receive(self, inbox: Sequence[Any]) -> tuple[int, list[tuple[str, str, int, int]], int]:
        """Put the states served in their places, then check this level's new states in id order: (how
        many, violations as (invariant, message, gid, depth), this worker's resident bytes; the
        coordinator's memory bound reads the last)."""
        for src, payload in enumerate(self.mail.fetch(inbox)):
            if payload is not None:
                for at, state in zip(self.awaiting[src], pickle.loads(payload)):
                    self.arriving[at] = state
        found: list[tuple[str, str, int, int]] = []
        invariants, done = self.system.invariants, self.system.done
        first = len(self.parent) - len(self.arriving)
        for lid, state in enumerate(self.arriving, start=first):
            flag = 1 if done(state) else 0
            for k, inv in enumerate(invariants):
                self.checked[k] += 1
                message = inv.check(state)
                if message is not None:
                    flag |= 2
                    found.append((inv.name, message, lid * self.n + self.w, self.depth[lid]))
                    break
            self.flags.append(flag)
            if not flag & 2:
                self.frontier.append((lid, state))
        new, self.arriving, self.awaiting = len(self.arriving), [], []
        return new, found, resident_bytes()

    SAVED = ("ids", "parent", "index", "depth", "flags", "rev_src", "rev_dst", "frontier", "fired", "checked")

    def save(self, path: str) -> None:
        """Write this partition (between two levels) to `path`, for `load` in a resumed search."""
        dump(path, {name: getattr(self, name) for name in self.SAVED})

    def load(self, path: str) -> None:
        saved = load(path, 1)[0]
        for name in self.SAVED:
            setattr(self, name, saved[name])

    @staticmethod
    def memory() -> int:
        """This worker's resident bytes (the coordinator's memory bound, when a resumed search starts)."""
        return resident_bytes()

    def trail(self, gid: int) -> tuple[int, int, int]:
        """(parent gid, enabled-action index, depth) of one of this worker's states."""
        lid = gid // self.n
        return self.parent[lid], self.index[lid], self.depth[lid]

    def finish(self) -> dict[str, Any]:
        """Counters and memory; the collector back as it was."""
        self.collector.close()
        store_bytes = (self.ids.nbytes() if not self.full else 0) + len(self.flags) + sum(
            a.itemsize * len(a) for a in (self.parent, self.index, self.depth))
        return {"fired": self.fired, "checked": self.checked, "store_bytes": store_bytes, "states": len(self.parent)}


def explore_parallel(factory: Callable[[], Any], workers: int, *, ray_address: str | None = None,
                     use_ray: bool = False, max_depth: int | None = None, max_states: int = DEFAULT_MAX_STATES,
                     check_liveness: bool = True, progress: Callable[[int, int], None] | None = None,
                     max_seconds: float | None = None, store: str = "full", symmetry: bool = True,
                     max_memory: int | None = None, checkpoint: CheckpointDir | None = None,
                     resume: bool = False) -> ExploreResult:
    """`explore` over `workers` partitions; `factory()` builds the system (in every worker and here).
    `max_memory` bounds the resident bytes of the workers and this process together, checked between levels.
    `checkpoint` and `resume` as for `explore`: saved between two levels, every worker writing its partition."""
    start = time.perf_counter()
    system = factory()
    options = {"store": store, "symmetry": symmetry, "max_depth": max_depth}
    pool = (RayPool(Partition, factory, workers, ray_address, **options) if use_ray
            else ProcessPool(Partition, factory, workers, **options))
    try:
        return _search(system, pool, workers, start, max_states, max_seconds, check_liveness, progress, store,
                       symmetry, max_memory, checkpoint, resume)
    finally:
        pool.close()


def _search(system: Any, pool: Any, n: int, start: float, max_states: int, max_seconds: float | None,
            check_liveness: bool, progress: Callable[[int, int], None] | None, store: str,
            symmetry: bool, max_memory: int | None = None, checkpoint: CheckpointDir | None = None,
            resume: bool = False) -> ExploreResult:
    canon = getattr(system, "canonical", None) if symmetry else None
    if checkpoint is not None or len(set(pool.call("secret", [()] * n))) > 1:
        pool.call("route_by_fingerprint", [()] * n)  # a resumed search's workers must route as the saved ones
    at, before, saved_gen = Level(workers=n), 0.0, None
    if resume:
        if checkpoint is None:
            raise ValueError("resume: needs the checkpoint to go on from")
        gen, at = checkpoint.resume_as(Level, f"a checkpoint of a search over {n} workers", lambda at: at.workers == n)
        try:
            pool.call("load", [(partition_file(gen, w),) for w in range(n)])
        except Exception as exc:  # a worker's part missing, truncated or foreign: one line, never a traceback
            raise ConfigError("--resume", "a checkpoint written by kvsim explore --checkpoint", checkpoint.path,
                              f"a worker's part: {exc}") from None
        before = at.seconds
    bound_hit = "depth" if at.depth_cut else None

    def save() -> str:
        gen = checkpoint.begin()
        pool.call("save", [(partition_file(gen, w),) for w in range(n)])
        at.seconds = before + time.perf_counter() - start
        checkpoint.commit(gen, at)
        return gen

    def stop() -> str | None:
        """The bound that stops the search before the next level, if one does."""
        if at.states >= max_states:
            return "states"
        if deadline is not None and time.perf_counter() > deadline:
            return "seconds"
        if max_memory is not None and sum(worker_bytes) + resident_bytes() > max_memory:
            return "memory"
        return None

    deadline = None if max_seconds is None else start + max_seconds
    if checkpoint is not None:
        checkpoint.schedule(start)
    boxes = None if resume else [[payload] for payload in pool.one(0, "initial")]
    worker_bytes = pool.call("memory", [()] * n) if resume and max_memory is not None else []
    while True:
        if boxes is not None:  # a resumed search goes on with the level it saved: expanded first
            absorbed = absorb_level(pool, n, boxes, at.level)
            new = sum(a[0] for a in absorbed)
            worker_bytes = [a[2] for a in absorbed]
            at.states += new
            if new:
                at.levels.append(new)
                at.depth = at.level
            for _, found, _ in absorbed:
                for name, message, gid, d in found:
                    if name not in at.first or (d, gid) < at.first[name][:2]:
                        at.first[name] = (d, gid, message, 0)
        if progress is not None:
            progress(at.states, at.level)
        if boxes is not None and not new:
            break
        stopped = stop()
        if stopped is not None:
            bound_hit = stopped
            break
        if checkpoint is not None and checkpoint.due(time.perf_counter(), deadline):
            saved_gen = save()
        expanded = pool.call("expand", [()] * n)
        outboxes = [e[0] for e in expanded]
        at.transitions += sum(e[1] for e in expanded)
        if any(e[2] for e in expanded):
            bound_hit, at.depth_cut = bound_hit or "depth", True
        boxes = [[outboxes[src][dst] for src in range(n)] for dst in range(n)]
        at.level += 1
    if checkpoint is not None and checkpoint.stopped(bound_hit):
        saved_gen = save()
    first = at.first

    def trail(gid: int) -> tuple[int, list[int]]:
        steps = []
        while True:
            parent, index, _ = pool.one(gid % n, "trail", gid)
            if parent < 0:
                return index, steps[::-1]
            steps.append(index)
            gid = parent

    violations: dict[str, Violation] = {}
    for name in sorted(first, key=lambda k: first[k][:2]):  # breadth-first order, as `explore` finds them
        d, gid, message, _ = first[name]
        violations[name] = _report(system, canon, name, "invariant", trail(gid), message)
    hang_states = 0
    if check_liveness:
        hang_states = _hangs(system, canon, pool, n, trail, violations)
    summaries = pool.call("finish", [()] * n)
    fired: dict[str, int] = {}
    checked = [0] * len(system.invariants)
    for s in summaries:
        for k, v in s["fired"].items():
            fired[k] = fired.get(k, 0) + v
        checked = [a + b for a, b in zip(checked, s["checked"])]
    total_bytes = sum(s["store_bytes"] for s in summaries)
    states = at.states
    return ExploreResult(model=system.name, variant=str(system.variant), states=states, transitions=at.transitions,
                         depth=at.depth, seconds=before + time.perf_counter() - start, bound_hit=bound_hit,
                         violations=list(violations.values()), hang_states=hang_states,
                         coverage=Coverage(fired, {inv.name: c for inv, c in zip(system.invariants, checked)}),
                         store=store, symmetry=canon is not None,
                         bytes_per_state=round(total_bytes / max(1, states), 1) if store == "fingerprint" else None,
                         collision_probability=states * (states - 1) / 2 / 2.0 ** 64 if store == "fingerprint"
                         else None, levels=at.levels, resumed=resume,
                         checkpoint=None if saved_gen is None else checkpoint.path)


def absorb_level(pool: Any, n: int, boxes: Sequence[Sequence[Any]], depth: int) -> list[Any]:
    """A level's inboxes (`boxes[w]`: the outboxes addressed to worker w, in worker order) taken in by the `n`
    partitions of `pool`: `absorb`, `serve` where a worker asked another for new states, `receive`.
    Each worker's (new states, violations, resident bytes)."""
    asked = pool.call("absorb", [(boxes[w], depth) for w in range(n)])
    if any(any(a) for a in asked):
        served = pool.call("serve", [([asked[dst][src] for dst in range(n)],) for src in range(n)])
    else:
        served = [[None] * n for _ in range(n)]
    return pool.call("receive", [([served[src][dst] for src in range(n)],) for dst in range(n)])


def _replay(system: Any, canon: Callable[[Any], Any] | None, root: int, steps: Sequence[int]) -> tuple[Any, list, list]:
    state = next(s for k, s in enumerate(system.initial_states()) if k == root)
    state = state if canon is None else canon(state)
    states, actions = [state], []
    for index in steps:
        action = system.enabled(state)[index]
        state = system.step(state, action)
        state = state if canon is None else canon(state)
        states.append(state)
        actions.append(action)
    return state, states, actions


def _report(system: Any, canon: Callable[[Any], Any] | None, name: str, kind: str, where: tuple[int, list[int]],
            message: str) -> Violation:
    state, states, actions = _replay(system, canon, *where)
    if canon is not None:
        state, actions = realize(system, canon, states)
        message = real_message(system, name, state, message)
    return Violation(name, kind, [to_jsonable(a) for a in actions], message, state)


def _hangs(system: Any, canon: Callable[[Any], Any] | None, pool: Any, n: int,
           trail: Callable[[int], tuple[int, list[int]]], violations: dict[str, Violation]) -> int:
    """`explore`'s liveness pass (`cannot_finish`), spread over the workers: rounds of `hang_round` until
    one sends nothing; the coordinator passes on the outboxes and holds no edge."""
    found = [h for h in spread_hangs(pool, n) if h[0]]
    if not found:
        return 0
    total = sum(h[0] for h in found)
    _, (_, gid), moves = min(found, key=lambda h: h[1])
    name = getattr(system, "liveness", "liveness")
    kind = "livelock" if moves else "deadlock"
    violations[name] = _report(system, canon, name, "hang", trail(gid),
                               f"{kind}: no done state is reachable from this state ({total} such states)")
    return total
