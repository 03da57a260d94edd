"""A per-call bound for the code under test: `within(seconds, memory)` raises `CallTimeout` in the call once the
wall clock passes `seconds`, or once the process has grown by more than `memory` bytes since the call's first
tick (`TICK` seconds in: a call that returns sooner costs no read of the process's size).

It runs on SIGALRM (`ITIMER_REAL`), ticking every `TICK` seconds while the call runs (to read the process's
size, and to raise again should the first raise be swallowed: raised inside a garbage-collector callback, which
Hypothesis installs, an exception is only printed), nested inside whatever alarm is already armed (the
command's `--max-seconds`): an alarm that is not ours is passed on to its own handler at its own time.
`CallTimeout` derives from BaseException, so code under test that catches `Exception` (a retry loop) cannot
swallow it. Off the main thread (where Python allows no signal handler) the call runs unbounded, and
`available()` says so.
"""

from __future__ import annotations

import _signal
import gc
import os
import signal
import sys
import threading
import time
from contextlib import _GeneratorContextManager, contextmanager
from typing import Any, Iterator

TICK = 0.25
RETICK = 0.01  # seconds between the raises once the call is stopped (until one is not swallowed)
DEFAULT_MEMORY = 4 * 2 ** 30  # bytes one call may add to the process


class CallTimeout(BaseException):
    """The call under a deadline did not return in time, or grew past its memory bound."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        self.seconds = seconds
        self.reason = reason or f"did not return within {seconds:g} s"
        super().__init__(self.reason)


def available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def resident() -> int:
    """This process's resident size in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextmanager
def within(seconds: float | None, memory: int | None = DEFAULT_MEMORY) -> Iterator[None]:
    """Run the block bounded by `seconds` (None or 0: no bound in time) and `memory` bytes of growth."""
    if not (seconds or memory) or not available():
        yield
        return
    start = time.monotonic()
    ours = start + seconds if seconds else None
    base: list[int] = []  # the process's size at the call's first tick
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_at = start + outer_delay if outer_delay > 0 else None
    # (the unwrapped `_signal` functions: `signal`'s own convert each handler to and from an enum, a third of what
    # this context cost a call of the code under test)
    previous = _signal.getsignal(signal.SIGALRM)
    fired: list[str] = []
    closed: list[bool] = []  # the call is over: a tick that comes now does nothing
    collecting: list[bool] = []  # the garbage collector was on, and is off until the call is over
    hook = sys.unraisablehook
    # the frame of the `with` statement (below this generator and contextlib's __enter__): while a tick lands
    # anywhere but under it, the call is over however it ended
    owner = sys._getframe(2)

    def arm(now: float) -> None:
        due = [now + (RETICK if fired else TICK)] + [t for t in (ours, outer_at) if t is not None]
        signal.setitimer(signal.ITIMER_REAL, max(min(due) - now, 1e-3))

    def stop() -> None:
        # A signal that comes while the collector runs (in C) is handled in the first Python code after it: a
        # collector callback, where the raise is swallowed. A call that allocates as it loops, in a large process,
        # spends most of its time collecting, so nearly every raise landed there (a mutant of SGLang's grid
        # segments, after the vLLM targets, grew to 10 GB: no raise after the first got out). So the stopped call
        # runs uncollected, and the raise comes again every RETICK until one gets out.
        if gc.isenabled():
            gc.disable()
            collecting.append(True)
        arm(time.monotonic())
        raise CallTimeout(seconds or 0.0, fired[0])

    def expire(signum: int, frame: Any) -> None:
        if closed:
            return
        if not _under(frame, owner):  # left behind: a raise landed in the `with` statement's own exit, before
            close()                   # the clean-up below could run (it took down an idle pytest-xdist worker)
            return
        now = time.monotonic()
        if outer_at is not None and outer_at <= now and callable(previous):
            previous(signum, frame)  # the command's own alarm (it raises, or re-arms itself)
        if fired and _leaving(frame, owner):  # the raise reached the `with` statement: its exit closes, unticked
            return
        if not fired:
            if ours is not None and now >= ours - 1e-3:
                fired.append(f"did not return within {seconds:g} s")
            elif memory and not base:
                base.append(resident())
            elif memory and resident() - base[0] > memory:
                fired.append(f"grew by more than {memory / 2 ** 30:g} GiB of memory in one call")
        if fired:  # the first raise, or again: the one before was swallowed
            stop()
        arm(now)

    def quiet(unraisable: Any) -> None:  # a raise a callback swallowed is raised again at the next tick
        if not isinstance(unraisable.exc_value, CallTimeout):
            hook(unraisable)

    def close() -> None:
        # A tick can land in this clean-up, after the call returned: its raise would leave this handler installed
        # and the timer re-armed, and the alarm would then raise CallTimeout in whatever runs next (a test
        # runner's idle loop). So the clean-up is done again until it completes, and such a tick is dropped.
        while True:
            try:
                closed.append(True)
                signal.setitimer(signal.ITIMER_REAL, 0)
                _signal.signal(signal.SIGALRM, previous)
                sys.unraisablehook = hook
                if collecting:
                    collecting.clear()
                    gc.enable()
                break
            except CallTimeout:
                continue
        if outer_at is not None:  # the outer alarm goes on at its own time (now, if that has passed)
            signal.setitimer(signal.ITIMER_REAL, max(outer_at - time.monotonic(), 1e-3), outer_interval)

    try:  # installed inside: a raise before the call starts still restores what was there
        _signal.signal(signal.SIGALRM, expire)
        sys.unraisablehook = quiet
        arm(start)
        yield
    finally:
        if not closed:
            close()


def _leaving(frame: Any, owner: Any) -> bool:
    """Whether `frame` runs in the `with` statement's way out: its own frame (which holds only the call), the
    context manager's `__exit__`, or this generator's clean-up. A tick that lands there after the first raise must
    not raise again: on a busy machine one landed as `close()` began, its raise skipped the clean-up, and the next
    one escaped the caller's `except CallTimeout` (it failed a CI run)."""
    if frame is owner:
        return True
    while frame is not None and frame is not owner:  # (a frame of the call itself is not on the way out)
        if frame.f_code is _WITHIN_CODE or (frame.f_code is _EXIT_CODE and frame.f_back is owner):
            return True
        frame = frame.f_back
    return False


def _under(frame: Any, owner: Any) -> bool:
    """Whether `frame` runs inside `owner` (one of its callers is `owner`)."""
    while frame is not None:
        if frame is owner:
            return True
        frame = frame.f_back
    return False


_WITHIN_CODE = within.__wrapped__.__code__  # type: ignore[attr-defined]
_EXIT_CODE = _GeneratorContextManager.__exit__.__code__
