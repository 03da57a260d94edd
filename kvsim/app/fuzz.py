"""`kvsim fuzz`: a model's properties searched by many workers, one shared example database.

Each worker runs the selected properties round after round (`ROUND` examples a property a round)
with its own seeds (worker w, round r: seed `base + w * 1_000_003 + r`) until the time is up. All
share one Hypothesis example database: a directory (`--database DIR`, on shared storage for a
cluster) or a Redis URL (`--database redis://...`, Hypothesis's Redis database). Hypothesis saves
every failing example there and replays the saved ones first, so a counterexample found by any
worker is replayed by every worker in its next round, and by later runs: it survives the run.
Each property's examples are keyed by model, property and variant, so one property never replays
another's examples. The pinned `@example` cases are `check`'s and `repro`'s: a fuzz round is search only.

Workers are forked processes on this machine (`--workers N`) or Ray tasks (`--ray ADDRESS`).
The record is `check`'s (one result per property: failed if any worker found a failure, with the
first-found counterexample; examples summed) plus each worker's examples per second.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..engine.explore.checkpoint import cache_root
from ..engine.errors import ConfigError
from ..engine.interrupt import asked, worker_signals
from ..engine.memory import DEFAULT_SHARE, refuse_forks
from ..engine.pools import WORKER, connect_ray
from ..engine.progress import Progress
from ..engine.registry import Registry
from ..engine.shared import Probe, named, sees
from ..engine.system import REACH_EXAMPLES, drawn_reach

ROUND = 50  # examples of one property per round (a round is the unit between two looks at the clock)
SEED_STRIDE = 1_000_003


class Shared:
    """What a run's coordinator and its workers on this machine share in memory (forked workers inherit it):
    the examples each worker ran so far (a slot each, written by that worker only), and a stop asked."""

    def __init__(self, workers: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self.examples = ctx.Array("q", workers, lock=False)
        self.stop = ctx.Value("b", 0, lock=False)


_SHARED: Shared | None = None  # this process's view of its run's `Shared`, where it has one


def _share(shared: Shared | None) -> None:
    global _SHARED
    _SHARED = shared


def _forked_worker(shared: Shared) -> None:
    """A forked worker's start: Ctrl-C reaches the whole process group, and the coordinator alone decides; and
    the coordinator's handlers are not the worker's: the pool ends its workers with SIGTERM."""
    worker_signals()
    _share(shared)


def _stop_asked() -> bool:
    """Ctrl-C or SIGTERM: asked of this process (`kvsim.engine.interrupt`), or passed on by the coordinator."""
    return asked() or (_SHARED is not None and bool(_SHARED.stop.value))


@contextmanager
def _ticking(progress: Progress | None, workers: int, seconds: float, examples: Any) -> Iterator[None]:
    """While the workers run, a progress line on a terminal twice a second: the examples run so far (forked
    workers and one worker count into shared memory; Ray tasks say nothing until they end) and the budget."""
    if progress is None or not progress.enabled:
        yield
        return
    stopped = threading.Event()

    def tick() -> None:
        while not stopped.wait(0.5):
            ran = "" if examples is None else f"{sum(examples[:]):,} examples so far, "
            progress.note(f"{ran}{workers} worker{'s' * (workers > 1)}, {seconds:,.0f} s budget")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stopped.set()
        ticker.join()


def default_database(model: str) -> str:
    return os.path.join(cache_root(), "fuzz", model)


def _is_url(spec: str) -> bool:
    return spec.startswith(("redis://", "rediss://", "unix://"))


def open_database(spec: str) -> Any:
    """A Hypothesis example database from a directory path or a redis:// URL."""
    if _is_url(spec):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise ConfigError("--database", "the redis package installed for a Redis URL (pip install redis)",
                              spec) from None
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    from hypothesis.database import DirectoryBasedExampleDatabase

    path = Path(spec)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--database", "a writable directory or a redis:// URL", spec, exc.strerror or "") from None
    return DirectoryBasedExampleDatabase(str(path))


def work(model: str, variant: str, properties: Sequence[str], params: dict[str, Any], database: str, worker: int,
         seed: int, seconds: float, round_examples: int = ROUND,
         probe: tuple[str, str, str] | None = None, max_examples: int | None = None,
         max_seconds: float | None = None) -> dict[str, Any]:
    """One worker's share: rounds over `properties` until `seconds` have passed (at least one round), every
    property has failed, or every property has run `max_examples` examples (the last round is cut to fit).
    `max_seconds`, the command's work budget, ends the rounds earlier than `seconds`: the worker then reports
    itself `cut` (its search incomplete). With a directory database, first whether it sees the `probe` written
    there (`kvsim.engine.shared`): a worker that does not (another machine's disk) reports so and does nothing."""
    from ..engine.runner import run_property
    from . import catalog

    if probe is not None and not sees(*probe):
        return {"worker": worker, "unseen": True}
    reg: Registry = catalog.load()
    props = [reg.property(model, name) for name in properties]
    descriptor = reg.model(model)
    db = open_database(database)
    start = time.perf_counter()
    until = seconds if max_seconds is None else min(seconds, max_seconds)
    examples = 0
    # per property: its examples, its first failure, and each `sometimes` a round met: (round, example, case)
    results: dict[str, dict[str, Any]] = {p.name: {"examples": 0, "failure": None, "found_at": None, "met": {}}
                                          for p in props}

    def left(name: str) -> int:  # examples this property may still run (a round's worth without --max-examples)
        ran = results[name]["examples"]
        return round_examples if max_examples is None else min(round_examples, max_examples - ran)

    def done() -> bool:  # every property has its counterexample, or has run its examples
        return all(r["failure"] or left(name) <= 0 for name, r in results.items())

    rnd, interrupted = 0, False
    while True:
        for prop in props:
            if results[prop.name]["failure"] or left(prop.name) <= 0:
                continue
            result = run_property(prop, variant, max_examples=left(prop.name), seed=seed + worker * SEED_STRIDE + rnd,
                                  database=db, params=params or None, database_key=f"{model}:{prop.name}:{variant}",
                                  use_examples=False, interruptible=False, descriptor=descriptor)
            examples += result.examples
            if _SHARED is not None:
                _SHARED.examples[worker] = examples
            row = results[prop.name]
            row["examples"] += result.examples
            for goal in result.reachability:
                if goal["reached"] and goal["name"] not in row["met"]:
                    row["met"][goal["name"]] = (rnd, goal["example"], goal["case"])
            if result.status != "passed" and row["failure"] is None:
                row["failure"] = result.to_json()
                row["found_at"] = round(time.perf_counter() - start, 3)
            interrupted = _stop_asked()
            if interrupted:
                break  # what ran so far is reported; the examples found are in the database already
        rnd += 1
        if interrupted or done() or time.perf_counter() - start >= until:
            break  # time is up, every property has its counterexample, or its examples ran: nothing left to do
    elapsed = time.perf_counter() - start
    cut = not interrupted and not done() and max_seconds is not None and max_seconds < seconds and elapsed >= until
    return {"worker": worker, "rounds": rnd, "examples": examples, "seconds": round(elapsed, 3),
            "examples_per_second": round(examples / elapsed, 1) if elapsed > 0 else float(examples),
            "results": results, "interrupted": interrupted, "cut": cut}


def fuzz(model: str, variant: str, properties: Sequence[str], params: dict[str, Any], database: str, workers: int,
         seed: int, seconds: float, ray_address: str | None = None, round_examples: int = ROUND,
         progress: Progress | None = None, max_examples: int | None = None,
         max_seconds: float | None = None) -> dict[str, Any]:
    """Run `workers` workers and merge their records into `check`'s shape (`progress`: a line while they run).

    `seconds` is how long each worker searches, `max_examples` the examples of each property it runs at most
    (`work`); `max_seconds`, the work budget, cuts the search short, which the record says (`stopped_by`
    "max-seconds", as "interrupt" for Ctrl-C or SIGTERM; `complete` false)."""
    if ray_address is None and workers > 1:
        refuse_forks(workers, None, DEFAULT_SHARE)
    open_database(database)  # a bad path or URL is refused here, before any worker starts
    # a directory is given to the workers by its absolute path (a Ray node's workers run in a folder of their
    # own), with a probe each must find there: a worker that does not share it would keep its examples apart
    folder = None if _is_url(database) else os.path.abspath(database)
    probe = None if folder is None else Probe(folder)
    jobs = [(model, variant, tuple(properties), params, folder or database, w, seed, seconds, round_examples,
             None if probe is None else probe.ask(w), max_examples, max_seconds) for w in range(workers)]
    shared = None if ray_address is not None else Shared(workers)
    try:
        with _ticking(progress, workers, seconds, None if shared is None else shared.examples):
            if ray_address is not None:  # Ray tasks run to their budget: nothing passes a stop on to them
                reports = _on_ray(jobs, ray_address)
            elif workers == 1:
                _share(shared)
                try:
                    reports = [work(*jobs[0])]
                finally:
                    _share(None)
            else:
                reports = _forked(jobs, shared)
        unseen = [r["worker"] for r in reports if r.get("unseen") or not (probe is None or probe.seen(r["worker"]))]
    finally:
        if probe is not None:
            probe.close()
    if unseen:
        raise ConfigError("--database", "a directory every worker sees (on a cluster: shared storage, or a redis:// "
                                        "URL)", database, f"{named(unseen)} cannot read or write it where it runs")
    from . import catalog

    merged, registry = [], catalog.load()
    for name in properties:
        rows = [r["results"][name] for r in reports]
        found = [(row["found_at"], r["worker"], row["failure"]) for r, row in zip(reports, rows) if row["failure"]]
        first = min(found, key=lambda f: (f[0], f[1])) if found else None
        merged.append({**(first[2] if first else {"property": name, "model": model, "variant": variant,
                                                     "status": "passed", "counterexample": None, "message": "",
                                                     "replay": ""}),
                       "examples": sum(row["examples"] for row in rows),
                       "found_by": sorted(f[1] for f in found)})
        merged[-1]["reachability"] = met_anywhere(registry.property(model, name).sometimes, reports, name,
                                                  merged[-1]["examples"], whole=not found)
        if first:  # the saved example replays first from the database: this command shows it again at once
            merged[-1]["replay"] = (f"kvsim fuzz {model} --variant {variant} --property {name} --workers 1 "
                                    f"--minutes 0.01 --database {database}")
    rates = [{k: r[k] for k in ("worker", "rounds", "examples", "seconds", "examples_per_second")} for r in reports]
    interrupted = any(r["interrupted"] for r in reports)
    stopped = "interrupt" if interrupted else "max-seconds" if any(r["cut"] for r in reports) else None
    return {"model": model, "variant": variant, "seed": seed, "params": params, "database": database,
            "results": merged, "interrupted": interrupted, "complete": stopped is None, "stopped_by": stopped,
            "workers": rates}


def met_anywhere(goals: Sequence[Any], reports: list[dict[str, Any]], name: str, examples: int,
                 whole: bool) -> list[dict[str, Any]]:
    """A property's `sometimes` over every worker's rounds (`check`'s shape): met where any round met it (the
    first worker's, its round and the example's number in it, and the case), unreached where the property held
    over at least `REACH_EXAMPLES` examples in all, else not reached within the bound."""
    out = []
    for goal in goals:
        worker, rnd, example, case = next(((r["worker"], *r["results"][name]["met"][goal.name]) for r in reports
                                           if goal.name in r["results"][name]["met"]), (None,) * 4)
        out.append(drawn_reach(goal, examples, whole and examples >= REACH_EXAMPLES, example, case, worker=worker,
                               round=rnd))
    return out


def _forked(jobs: list[tuple[Any, ...]], shared: Shared) -> list[dict[str, Any]]:
    """The jobs in forked workers; a stop asked of this process (Ctrl-C, SIGTERM) is passed on to them, and
    each ends after the property it is running."""
    import multiprocessing as mp

    with mp.get_context("fork").Pool(len(jobs), initializer=_forked_worker, initargs=(shared,)) as pool:
        running = pool.starmap_async(work, jobs)
        while not running.ready():
            running.wait(0.25)
            if asked():
                shared.stop.value = 1
        return running.get()


def _on_ray(jobs: list[tuple[Any, ...]], address: str) -> list[dict[str, Any]]:
    ray = connect_ray(address, len(jobs))
    task = ray.remote(**WORKER)(work)
    return ray.get([task.remote(*job) for job in jobs])
