"""Draws that depend on the seed alone, not on what the process imported.

Since 6.131, Hypothesis draws a few percent of its integers, floats and strings from a pool of "local constants":
the literals of every module in `sys.modules` whose file is not in site-packages or the standard library. Which
modules those are depends on the process, not on the seed: kvsim installed editable or from a wheel, the catalog
loaded earlier in the same process or not, the upstream files `kvsim conform` loaded from its cache, the modules a
mutation run wrote, the tests an xdist worker ran before. A derandomized run then drew different inputs (and found a
different counterexample, or none) from one process to the next. `own_draws()` empties that pool for the run it
encloses (Hypothesis' fixed global constants stay), so a seed names the same inputs in every process.

The pool is Hypothesis' private state (`hypothesis.internal.conjecture.providers`); `POOL_HOOK` says whether this
Hypothesis has it where kvsim looks. A version without local constants needs nothing done, and the suite's test of
this module fails when a version has them elsewhere.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


def _providers() -> Any:
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis laid out otherwise
        return None
    if not all(hasattr(providers, name) for name in ("_get_local_constants", "CONSTANTS_CACHE", "Constants")):
        return None
    return providers


POOL_HOOK = _providers() is not None


@contextmanager
def own_draws() -> Iterator[None]:
    """Inside: Hypothesis draws no constant from the process' local modules (see the module's note). Nests."""
    providers = _providers()
    if providers is None:
        yield
        return
    kept = providers._get_local_constants
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()  # the cache holds each constraint's pool with the local constants in it
    try:
        yield
    finally:
        providers._get_local_constants = kept
        providers.CONSTANTS_CACHE.cache.clear()


def derandomized_draws(strategy: Any, count: int) -> list[Any]:
    """`count` values of `strategy`, the same in every process (derandomized, no database, the pool emptied)."""
    from hypothesis import HealthCheck, given, settings

    drawn: list[Any] = []

    def keep(value: Any) -> None:
        drawn.append(value)

    run = settings(max_examples=count, database=None, derandomize=True, deadline=None,
                   suppress_health_check=list(HealthCheck))(given(strategy)(keep))
    with own_draws():
        run()
    return drawn
