"""How often a long loop of uneven steps reads the wall clock: its `--max-seconds`, a Ctrl-C, its memory bound.

A loop of fast steps (a simulation's events, the explorer's states: microseconds each) reads the clock every
`EVERY` steps, where a read every step would cost a share of the loop. A loop of slow steps read as rarely runs
past its budget by minutes (a simulated scheduler step that walks a pool of 65,536 pages, an explored state of
rows of 4,095 cells: 4,096 of them last longer than the 10 s the command line's alarm allows past the budget,
`kvsim.app.cli._alarm_seconds`), and is then stopped by that alarm with nothing reported. `Pace` reads it after
as many steps as lasted about `SPACING` seconds at the pace of the steps before: every step where steps are slow.
"""

from __future__ import annotations

from typing import Callable

EVERY = 4096  # the most steps between two reads (fast steps)
SPACING = 0.02  # seconds between two reads, about


class Pace:
    """`read()` the clock; then take `every` steps before the next read."""

    __slots__ = ("clock", "every", "last")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock, self.every = clock, 1
        self.last = clock()

    def read(self) -> float:
        """The clock now. `every` becomes as many steps as lasted about `SPACING` at the pace since the last read,
        at most twice as many as before (fast steps then slow ones are read again soon) and at most `EVERY`."""
        now = self.clock()
        elapsed, every = now - self.last, self.every
        steps = int(every * SPACING / elapsed) if elapsed > 0 else EVERY
        self.every, self.last = max(1, min(2 * every, EVERY, steps)), now
        return now
