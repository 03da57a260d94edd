"""Level-synchronous breadth-first exploration over worker processes or a Ray cluster.

This module is the coordinator; each worker holds a `kvsim.engine.explore.partition.Partition`, its share of
the states. Each level has two phases: *expand* (every worker takes the successors of its frontier
and sorts them into one outbox per owner) and *absorb* (every worker takes the outboxes addressed
to it, keeps what it has not seen, checks it and makes it its next frontier: `absorb_level`). The
coordinator hands the outboxes on (through its pipes to forked processes; on Ray, as references
into the object store, `kvsim.engine.pools.RayMail`), checks the bounds between levels and saves
checkpoints there. The liveness pass runs in the workers as well, in rounds (`kvsim.engine.explore.hangs`).

Every reachable state is found at its breadth-first depth, exactly as by `explore`: the same
state count, transitions, depth, violated invariants and liveness verdict, and counterexamples
of the same (shortest) length; which of several shortest paths is reported may differ (from one process's,
not from run to run: `partition`). Bounds
are checked between levels, so `max_states` may be passed by up to one level. The counterexample
path is rebuilt in this process by replaying the enabled-action indices each worker recorded.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..canon import to_jsonable
from ..errors import ConfigError
from ..interrupt import INTERRUPT, asked, backstop
from ..memory import machine, over_budget, refuse_forks, resident_bytes
from ..pools import ProcessPool, RayPool
from ..shared import named
from .checkpoint import Level, held_by, partition_file
from .hangs import spread_hangs
from .options import ExploreOptions
from .partition import Partition
from .search import Coverage, ExploreResult, Violation, reaches, real_message, realize


def explore_parallel(factory: Callable[[], Any], workers: int, options: ExploreOptions = ExploreOptions(), *,
                     ray_address: str | None = None, use_ray: bool = False, lines: Any = None) -> ExploreResult:
    """`explore` over `workers` partitions; `factory()` builds the system (in every worker and here).
    `lines` (`kvsim.app.linecov.WorkerLines`, for `--coverage`) is started in each worker and stopped when it
    finishes: the result's `worker_lines` are the lines every worker ran, by path in the package.
    The memory bounds (`options.max_memory`, bytes, and `options.memory_share`, of the machine's memory) bound,
    on each machine the search runs on, the resident bytes of the workers there and of this process, checked
    between levels. `options.checkpoint` and `resume` as for `explore`: saved between two levels, every worker
    writing its partition."""
    if options.stop_on:
        raise ConfigError("stop_on", "no invariant names: a partitioned search runs to its bounds", options.stop_on)
    start = time.perf_counter()
    system = factory()
    shares = {"store": options.store, "symmetry": options.symmetry, "max_depth": options.max_depth, "lines": lines}
    if not use_ray:
        refuse_forks(workers, options.max_memory, options.memory_share)
    with held_by(options):  # the checkpoint folder ours, as in `explore`, before any worker starts
        pool = (RayPool(Partition, factory, workers, ray_address, **shares) if use_ray
                else ProcessPool(Partition, factory, workers, **shares))
        try:
            if use_ray:
                same_code(pool, workers)
            return _search(system, pool, workers, start, options)
        finally:
            pool.close()  # (the forked workers' copies of the lock's descriptor end with them, before it is let go)


def _search(system: Any, pool: Any, n: int, start: float, options: ExploreOptions) -> ExploreResult:
    max_states, progress, store = options.max_states, options.progress, options.store
    checkpoint, resume = options.checkpoint, options.resume
    memory = (options.max_memory, options.memory_share)
    canon = getattr(system, "canonical", None) if options.symmetry else None
    at, before, saved_gen = Level(workers=n), 0.0, None
    if checkpoint is not None:  # every worker writes its part there: refused before any work where one cannot
        apart = checkpoint.unshared(lambda asks: pool.call("sees", asks), n)
        if apart:
            raise ConfigError("resume" if resume else "checkpoint",
                              "a folder every worker sees (on a cluster, storage every node shares)", checkpoint.path,
                              f"{named(apart)} cannot read or write it where it runs")
    if resume:
        gen, at = checkpoint.resume_as(Level, f"a checkpoint of a search over {n} workers", lambda at: at.workers == n)
        try:
            pool.call("load", [(partition_file(gen, w), checkpoint.key) for w in range(n)])
        except Exception as exc:  # a worker's part missing, truncated or foreign: one line, never a traceback
            raise ConfigError("resume", "a checkpoint written by kvsim explore --checkpoint", checkpoint.path,
                              f"a worker's part: {exc}") from None
        before = at.seconds
    bound_hit = "depth" if at.depth_cut else None

    def save() -> str:
        with checkpoint.saving("resume" if resume else "checkpoint"):
            gen = checkpoint.begin()
            pool.call("save", [(partition_file(gen, w), checkpoint.key) for w in range(n)])
            at.seconds = before + time.perf_counter() - start
            checkpoint.commit(gen, at)
        return gen

    def stop() -> str | None:
        """The bound that stops the search before the next level, if one does."""
        if at.states >= max_states:
            return "states"
        if deadline is not None and not level_fits(time.perf_counter(), deadline, options.max_seconds, *paced):
            return "seconds"
        if bounded and over_budget([*zip(machines, worker_bytes), (here, resident_bytes())], *memory):
            return "memory"
        if asked():
            return INTERRUPT  # seen between two levels, where the search can be saved
        return None

    deadline = None if options.max_seconds is None else start + options.max_seconds
    if checkpoint is not None:
        checkpoint.schedule(start)
    boxes = None if resume else [[payload] for payload in pool.one(0, "initial")]
    bounded = memory != (None, None)
    machines = pool.call("machine", [()] * n) if bounded else []  # where each worker runs, and its memory
    here = machine()
    worker_bytes = pool.call("memory", [()] * n) if resume and bounded else []
    paced = [0.0, 0, 0]  # the last level's seconds (its expansion and exchange) and frontier, and the next frontier
    began = None
    while True:
        if boxes is not None:  # a resumed search goes on with the level it saved: expanded first
            absorbed = absorb_level(pool, n, boxes, at.level)
            new = sum(a[0] for a in absorbed)
            if began is not None:
                paced[:2] = [time.perf_counter() - began, paced[2]]
            paced[2] = new
            worker_bytes = [a[2] for a in absorbed]
            at.states += new
            if new:
                at.levels.append(new)
                at.depth = at.level
            for _, found, _, _ in absorbed:
                for name, message, gid, d in found:
                    if name not in at.first or (d, gid) < at.first[name][:2]:
                        at.first[name] = (d, gid, message, 0)
            first_met(pool, n, at, [a[3] for a in absorbed], at.level)
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
        began = time.perf_counter()
        expanded = pool.call("expand", [()] * n)
        first_met(pool, n, at, [e[3] for e in expanded], at.level)  # step declarations: from this level's states
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
    reachability = reaches(system, at.reached, bound_hit, lambda where: _reached(system, canon, where[0], trail(where[1])))
    hang_states = 0
    if options.check_liveness:
        hang_states = _hangs(system, canon, pool, n, trail, violations)
    summaries = pool.call("finish", [()] * n)
    fired: dict[str, int] = {}
    checked = [0] * len(system.invariants)
    for s in summaries:
        for k, v in s["fired"].items():
            fired[k] = fired.get(k, 0) + v
        checked = [a + b for a, b in zip(checked, s["checked"])]
    worker_lines: dict[str, set[int]] = {}
    for s in summaries:
        for path, ran in (s["lines"] or {}).items():
            worker_lines.setdefault(path, set()).update(ran)
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
                         checkpoint=None if saved_gen is None else checkpoint.path,
                         worker_lines={p: sorted(r) for p, r in worker_lines.items()}
                         if any(s["lines"] is not None for s in summaries) else None, reachability=reachability)


def level_fits(now: float, deadline: float, budget: float, seconds: float, frontier: int, states: int) -> bool:
    """Whether the search may begin a level of `states` states at `now`: the budget has time left, and the level,
    at the last one's pace (`seconds` for `frontier` states; none yet: no estimate), is not expected to end past
    the command line's alarm (`interrupt.backstop` after the budget). The workers expand a level whole, and where
    states are slow (4.5 ms each on pd-staging's rows of 4,095 tokens) a level begun before the budget ran out can
    end after that alarm, which ends the command with nothing reported: stopped before it, the search reports
    what it found. (The estimate errs long: a level's own costs spread over more states as levels grow.)"""
    if now > deadline:
        return False
    return not frontier or now + seconds * states / frontier <= deadline + backstop(budget)


def first_met(pool: Any, n: int, at: Level, found: Sequence[dict[int, int]], depth: int) -> None:
    """Note the reachability declarations the workers met (`found`: each worker's index -> gid) at states of
    `depth` (a step declaration: its source state), the least gid where several did, and tell every worker to
    ask them no more."""
    met: dict[int, int] = {}
    for here in found:
        for k, gid in here.items():
            if k not in at.reached and gid < met.get(k, gid + 1):
                met[k] = gid
    if met:
        at.reached.update((k, (depth, gid)) for k, gid in met.items())
        pool.call("met", [(tuple(met),)] * n)


def same_code(pool: Any, n: int) -> None:
    """Refuse a cluster whose workers run other kvsim sources than this process (a node with another version)."""
    ours, theirs = Partition.code(), pool.call("code", [()] * n)
    apart = [w for w in range(n) if theirs[w] != ours]
    if apart:
        raise ConfigError("ray", f"every worker running this kvsim (sources {ours})", f"sources {theirs[apart[0]]}",
                          f"{named(apart)}: install this kvsim on every node")


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


def _reached(system: Any, canon: Callable[[Any], Any] | None, depth: int, where: tuple[int, list[int]]) \
        -> tuple[int, Any, list[Any]]:
    """A reachability declaration's state: its depth, the real state and the path there."""
    report = _report(system, canon, "", "reach", where, "")
    return depth, report.state, report.trace


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
