"""A suite's items on forked worker processes, the results handed back in the items' order.

`ordered(count, work, workers)` runs `work(i)` for i in 0..count-1 on `workers` forked processes (they inherit
what this process holds, so `work` and the items it reads are never pickled; each result is) and yields
`(i, ok, value)` in index order, whatever order they finish in: `value` is the result, or, where `ok` is
False, a one-line error: the exception `work` raised, or the death of the worker process running it (the
item is reported failed, a fresh worker takes the next item, and nothing else is lost).

A stop asked of this process (Ctrl-C, SIGTERM: `kvsim.engine.interrupt`) raises `Interrupted` here, and a
`--max-seconds` alarm its `BudgetExceeded`; either way the workers are ended (SIGTERM) before it goes on.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

from ..engine.interrupt import Interrupted, asked, held_across_forks, release_held, worker_signals

POLL = 0.25  # seconds between two looks at a stop asked while waiting for the workers


def cpu_count() -> int:
    """The CPUs this process may run on (the `--workers` default)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _serve(conn: Any, work: Callable[[int], Any]) -> None:
    worker_signals()  # Ctrl-C reaches the whole group: the coordinator decides, and ends its workers
    release_held()  # what was held since the fork arrives now, to these handlers
    try:
        while True:
            index = conn.recv()
            if index is None:
                return
            try:
                conn.send((index, True, work(index)))
            except Exception as exc:  # the item's error, in one line; the worker goes on with the next item
                conn.send((index, False, " ".join(f"{type(exc).__name__}: {exc}".split())))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # a stop, or the coordinator gone: end quietly (it
        return  # reports what ran; a worker's traceback on the terminal would say the command broke)


class _Worker:
    """A forked worker. SIGINT and SIGTERM are held across the fork and, in the worker, until `_serve` has put its
    own handlers in place (`held_across_forks`): the coordinator ends its workers with SIGTERM as soon as it is
    asked to stop, which can be before a fresh worker has left multiprocessing's bootstrap."""

    def __init__(self, ctx: Any, work: Callable[[int], Any]) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, work), daemon=True)
        with held_across_forks():
            self.proc.start()
        child.close()
        self.index: int | None = None  # the item it runs

    def end(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()


def ordered(count: int, work: Callable[[int], Any], workers: int) -> Iterator[tuple[int, bool, Any]]:
    """`(i, ok, value)` for each item, in index order, computed on `workers` forked processes (module doc)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")
    pool = [_Worker(ctx, work) for _ in range(max(1, min(workers, count)))]
    done: dict[int, tuple[bool, Any]] = {}
    given = emitted = 0

    def feed(w: _Worker) -> None:
        nonlocal given
        w.index = given if given < count else None
        if w.index is not None:
            w.conn.send(w.index)
            given += 1

    try:
        for w in pool:
            feed(w)
        while emitted < count:
            while emitted in done:
                ok, value = done.pop(emitted)
                yield emitted, ok, value
                emitted += 1
            if emitted >= count:
                break
            busy = [w for w in pool if w.index is not None]
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], POLL))
            if asked():
                raise Interrupted()
            for k, w in enumerate(pool):
                if w.index is None or (w.conn not in ready and w.proc.sentinel not in ready):
                    continue
                if w.conn.poll():
                    try:
                        index, ok, value = w.conn.recv()
                    except (EOFError, OSError):  # the pipe closed: the worker died
                        index, ok, value = w.index, False, None
                else:
                    index, ok, value = w.index, False, None
                if not ok and value is None:  # died running it: say so, and start a fresh worker in its place
                    w.end()
                    value = f"the worker process running it died (exit code {w.proc.exitcode})"
                    pool[k] = w = _Worker(ctx, work)
                done[index] = (ok, value)
                feed(w)
    finally:
        for w in pool:
            w.end()
