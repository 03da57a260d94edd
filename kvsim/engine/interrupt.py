"""A search asked to stop (Ctrl-C, SIGTERM) stops as at a bound, "interrupt": it keeps what it found, says so,
and, given a checkpoint, saves itself there first, so `--resume` goes on from where it was stopped.

`stopping_on_signals()` (the command line, around a search) turns the first SIGINT or SIGTERM into that
request; the search sees it at its next check (a single process every few thousand expansions, a
partitioned one between two levels, where its checkpoint is taken). A second signal interrupts at once, as
Ctrl-C did before. Outside that context nothing changes: Ctrl-C raises KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

INTERRUPT = "interrupt"  # the bound a stopped search reports
_asked = threading.Event()


def asked() -> bool:
    """Whether a stop has been asked since the context was entered."""
    return _asked.is_set()


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM asks the search to stop; the next raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ask(signum: int, frame: Any) -> None:
        if _asked.is_set():
            raise KeyboardInterrupt
        _asked.set()

    previous = {sig: signal.signal(sig, ask) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _asked.clear()


def worker_signals() -> None:
    """In a forked worker: ignore Ctrl-C (it reaches the whole process group; the coordinator decides and tells
    its workers), and let SIGTERM end the process, as whoever ends its workers expects (a multiprocessing
    pool sends it), not ask for a stop as the coordinator's inherited handler would."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stopped_by(bound: str) -> str:
    """What stopped a search, in words: `the states bound`, or the interrupt."""
    return "an interrupt (Ctrl-C or SIGTERM)" if bound == INTERRUPT else f"the {bound} bound"
