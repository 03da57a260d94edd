"""The memory of a search: its resident size against its bound on each machine, and the collector paused."""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator

from .errors import ConfigError

DEFAULT_SHARE = 0.8  # the CLI's memory bound where none is given: this share of each machine's memory


def resident_bytes() -> int:
    """This process's resident memory now (Linux `/proc/self/statm`), else its peak (`getrusage`)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def machine() -> tuple[str, int]:
    """This machine: an id that every process on it shares and no other machine has (the kernel's boot id,
    with the host name), and its physical memory in bytes (16 GiB where the system does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 * 2 ** 30
    return f"{os.uname().nodename}/{boot}", total


def memory_limit(total: int, max_memory: int | None, share: float | None) -> int | None:
    """The resident bytes a search may hold on a machine of `total` bytes: `max_memory`, or `share` of
    the machine, whichever is less (None: no bound)."""
    limits = [b for b in (max_memory, None if share is None else int(share * total)) if b is not None]
    return min(limits) if limits else None


def over_budget(usage: Iterable[tuple[tuple[str, int], int]], max_memory: int | None, share: float | None) -> bool:
    """Whether, on some machine, the search's processes there hold more than `memory_limit` allows together.
    `usage`: ((machine id, its memory), resident bytes) for each process of the search (the workers of a
    cluster run on many machines, and each machine's processes share only its memory)."""
    held: dict[tuple[str, int], int] = {}
    for where, size in usage:
        held[where] = held.get(where, 0) + size
    for (_, total), size in held.items():
        limit = memory_limit(total, max_memory, share)
        if limit is not None and size > limit:
            return True
    return False


def refuse_forks(workers: int, max_memory: int | None, share: float | None) -> None:
    """Before `workers` processes are forked on this machine: refuse (`--workers`, exit 2) more than the memory
    bound holds beside this process. Each starts as a copy of this process (its resident pages are the
    child's), which is what the bound counts for it at the first check between levels; forking first and
    stopping there would have made the processes already, and a count in the thousands ties the machine up."""
    limit = memory_limit(machine()[1], max_memory, share)
    own = resident_bytes()
    if limit is None or workers * own + own <= limit:
        return
    bound = (f"--max-memory {max_memory / 2 ** 30:g} GiB" if max_memory is not None and max_memory <= limit
             else f"{share:.0%} of this machine's {machine()[1] / 2 ** 30:.1f} GiB")
    raise ConfigError("workers", f"at most {max(0, limit // own - 1)} forked workers: each starts as a copy of "
                                   f"this {own / 2 ** 20:.0f} MiB process, and {bound} holds that many beside it",
                      workers)


class YoungCollections:
    """Automatic garbage collection off while a search runs; `tick()` now and then instead.

    A search keeps millions of long-lived objects (states, caches, frontier) that hold no reference
    cycles, and the collector's passes over them are wasted work: a quarter of the time of
    pd-staging's 2 x 2 search at 200,000 states. `tick()` (every few thousand expansions, or once a
    level) moves what exists to the collector's permanent generation (`gc.freeze`, no traversal);
    one tick in 16 first collects the young objects made since the last tick, and if that finds
    unreachable cycles (a model whose steps make them), every tick collects from then on, so such
    garbage is still reclaimed. `close()` returns the objects to the collector and turns automatic
    collection back on if it was on. No kvsim model's steps make cycles.
    """

    def __init__(self) -> None:
        self.was_enabled = gc.isenabled()
        self.ticks = 0
        self.collect = False
        gc.disable()
        gc.freeze()  # what the caller made before the search is not the search's to collect (`close` returns it)

    def tick(self) -> None:
        if self.collect or self.ticks % 16 == 0:
            self.collect = gc.collect(1) > 0 or self.collect
        self.ticks += 1
        gc.freeze()

    def close(self) -> None:
        gc.unfreeze()
        if self.was_enabled:
            gc.enable()


@contextmanager
def spaced_collections(young: int) -> Iterator[None]:
    """The collector's young-generation threshold at least `young` allocations while the block runs, then as it was
    (automatic collection left off where it is off). A property's examples and a simulation's steps allocate
    thousands of short-lived containers: at the default 700 a pass runs every few hundred and ages them all into
    the older generations, whose passes go over every object the process holds. Cycles are still collected, less
    often; what the block computes does not depend on when the collector runs."""
    threshold = gc.get_threshold()
    if threshold[0]:  # 0: automatic collection off, left so
        gc.set_threshold(max(threshold[0], young), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


@contextmanager
def collection_paused() -> Iterator[None]:
    """Automatic garbage collection off for a while, then as it was: pickling or unpickling a search's
    millions of acyclic objects is several times faster without the collector's passes over them
    (a pd-staging frontier of 40,000 states: loaded in 0.2 s against 2.0 s)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
