"""A search asked to stop (Ctrl-C, SIGTERM) stops as at a bound, "interrupt": it keeps what it found, says so,
and, given a checkpoint, saves itself there first, so `--resume` goes on from where it was stopped.

`stopping_on_signals()` (the command line, around a search, a simulation or a suite of properties) turns the
first SIGINT or SIGTERM into that request; the work sees it at its next check (a single process every few
thousand expansions, or every one where they are slow, `kvsim.engine.pace`; a partitioned one between two levels,
where its checkpoint is taken; a simulation as a single process does; a property at its next example,
`raise_if_asked`). A second signal interrupts at once,
as Ctrl-C did before. Outside that context nothing changes: Ctrl-C raises KeyboardInterrupt.

The first signal only sets a flag: it raises nothing where it lands. An exception raised by a signal handler
inside a garbage-collector callback (Hypothesis installs one) or a `__del__` is printed and dropped, so a
Ctrl-C raised there was lost, and the command ran on to its end.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

INTERRUPT = "interrupt"  # the bound a stopped search reports
_asked = threading.Event()


class BudgetExceeded(KeyboardInterrupt):
    """`--max-seconds` ran out. Raised from SIGALRM (the command line's deadline) as a KeyboardInterrupt, which
    Hypothesis and the models let through as they do Ctrl-C (never mistaken for a failure of the code it
    interrupts)."""


class Interrupted(KeyboardInterrupt):
    """A stop asked (Ctrl-C, SIGTERM), raised where a property runs, at its next example (`raise_if_asked`):
    a KeyboardInterrupt for the same reason as `BudgetExceeded`."""


def backstop(seconds: float) -> float:
    """How long past its `--max-seconds` a command that stops itself at its budget (a simulation between two events,
    a search between two states or levels, fuzz's workers between two rounds) runs before the command line's alarm
    ends it with nothing reported: the alarm is for one endless step only."""
    return max(10.0, seconds / 10)


def asked() -> bool:
    """Whether a stop has been asked since the context was entered."""
    return _asked.is_set()


def raise_if_asked() -> None:
    """Raise `Interrupted` where a stop has been asked (the runner calls this at the start of every example)."""
    if _asked.is_set():
        raise Interrupted()


def _ask(signum: int, frame: Any) -> None:
    """The first signal asks a stop; the next raises KeyboardInterrupt."""
    if _asked.is_set():
        raise KeyboardInterrupt
    _asked.set()


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM asks the search to stop; the next raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = {sig: signal.signal(sig, _ask) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _asked.clear()


def worker_signals() -> None:
    """In a forked worker: ignore Ctrl-C (it reaches the whole process group; the coordinator decides and tells
    its workers), and let SIGTERM end the process, as whoever ends its workers expects (a multiprocessing
    pool sends it), not ask for a stop as the coordinator's inherited handler would. A stop the coordinator was
    asked before the fork (the flag is copied with its memory) is the coordinator's to act on, not this worker's:
    forgotten here, so the worker's checks do not raise `Interrupted` with a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _asked.clear()


def _ask_only(signum: int, frame: Any) -> None:
    """A worker's SIGINT: asks a stop, and never more (the coordinator ends a worker that does not stop)."""
    _asked.set()


def asking_worker_signals() -> None:
    """In a forked worker that runs a share of one command's work (`kvsim conform --workers`): Ctrl-C reaches the
    whole process group, and asks this worker to stop at its next check, as it asks the command (the coordinator
    passes a stop of its own on as SIGINT). A second SIGINT asks again and raises nothing: the terminal's Ctrl-C
    and the coordinator's passing it on are one stop, and a stop asked before the fork is already this worker's
    (the flag is copied); the coordinator ends a worker that does not stop. SIGTERM ends the process, as a pool
    ends its workers."""
    signal.signal(signal.SIGINT, _ask_only)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


HELD = (signal.SIGINT, signal.SIGTERM)  # held from a fork until the worker has its own handlers


@contextmanager
def held_across_forks() -> Iterator[None]:
    """Around forking a command's workers: SIGINT and SIGTERM held (blocked) in this thread, so that each worker
    starts with them held and gets them only once it has put its own handlers in place (`release_held`); a signal
    that came here meanwhile is handled when this ends. Without it a worker still in multiprocessing's bootstrap
    has the coordinator's handler, which raises KeyboardInterrupt on a stop already asked, and the worker prints
    a traceback (seen in CI)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def release_held() -> None:
    """In a worker forked `held_across_forks`, once its handlers are in place: what was held arrives now."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def stopped_by(bound: str) -> str:
    """What stopped a search, in words: `the states bound`, or the interrupt."""
    return "an interrupt (Ctrl-C or SIGTERM)" if bound == INTERRUPT else f"the {bound} bound"
