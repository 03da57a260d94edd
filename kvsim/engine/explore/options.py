"""What one search is asked to do: its bounds, its store, its reductions, its checkpoint (`ExploreOptions`).

One record for the single-process search (`explore`) and the partitioned one (`explore_parallel`),
checked once when it is made: a bad value is a `ConfigError` naming the field (`max_states: expected
an integer >= 1, got 0`), which the command line reports under its own flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError, check_int

if TYPE_CHECKING:
    from .checkpoint import CheckpointDir

# the state bound by default: past every configuration the parameter caps allow (pd-protocol rooms=3 has 3.3M
# orbits); --max-seconds and --max-memory bound a run's time and memory whatever its state count
DEFAULT_MAX_STATES = 10_000_000

STORES = ("full", "fingerprint")


@dataclass(frozen=True)
class ExploreOptions:
    """The options of a search.

    Bounds (`max_depth`, `max_states`, `max_seconds`, `max_memory`: bytes resident, `memory_share`: that
    share of the machine's memory resident) stop the search cleanly: the result's `bound_hit` names the one
    that did, and states left unexpanded count as "might still finish" (no false hang). `store` is "full"
    (every state kept; the graph can be exported) or "fingerprint" (64-bit fingerprints in flat arrays,
    `kvsim.engine.explore.store`). A system that defines `canonical(state)` is explored one representative
    per orbit unless `symmetry` is off. `check_liveness` off skips the hang search. With a `checkpoint`
    (`kvsim.engine.explore.checkpoint.CheckpointDir`) the search saves itself there; `resume` goes on from
    its last save. `progress(states, depth)` is called now and then. `stop_on`: invariant names; the search
    stops at the first state violating one of them (breadth-first, so its path is still a shortest one), with
    `bound_hit` "violation" (a single-process search only).
    """

    max_depth: int | None = None
    max_states: int = DEFAULT_MAX_STATES
    max_seconds: float | None = None
    max_memory: int | None = None
    memory_share: float | None = None
    store: str = "full"
    symmetry: bool = True
    check_liveness: bool = True
    checkpoint: CheckpointDir | None = None
    resume: bool = False
    progress: Callable[[int, int], None] | None = field(default=None, compare=False)
    stop_on: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.max_depth is not None:
            check_int(self.max_depth, "max_depth", minimum=1)
        check_int(self.max_states, "max_states", minimum=1)
        if self.max_memory is not None:
            check_int(self.max_memory, "max_memory", minimum=1)
        if self.max_seconds is not None:
            _number(self.max_seconds, "max_seconds", "a finite number > 0", lambda x: 0 < x < math.inf)
        if self.memory_share is not None:
            _number(self.memory_share, "memory_share", "a share > 0 and <= 1", lambda x: 0 < x <= 1)
        if self.store not in STORES:
            raise ConfigError("store", " or ".join(repr(s) for s in STORES), self.store)
        for name in ("symmetry", "check_liveness", "resume"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, "True or False", getattr(self, name))
        if self.resume and self.checkpoint is None:
            raise ConfigError("resume", "a checkpoint to go on from beside it", self.resume)
        if not isinstance(self.stop_on, frozenset) or not all(isinstance(n, str) for n in self.stop_on):
            raise ConfigError("stop_on", "a frozenset of invariant names", self.stop_on)
        if self.progress is not None and not callable(self.progress):
            raise ConfigError("progress", "a callable progress(states, depth)", self.progress)


def _number(value: Any, name: str, expected: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(name, expected, value)
