"""Hypothesis strategies of the kv-offload properties (imported only when a property runs)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from .cases import OpsCase
from .mapping_strategies import *  # noqa: F401,F403  (the worker-side mapping's strategies live beside)

KEYS = 6
REQS = 3


def _keys() -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(0, KEYS - 1), unique=True, min_size=1, max_size=4).map(tuple)


def _picks() -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(0, 7), min_size=1, max_size=4).map(tuple)


def _intent() -> st.SearchStrategy[tuple]:
    req = st.integers(0, REQS - 1)
    return st.one_of(
        st.tuples(st.just("store"), req, _keys()),
        st.tuples(st.just("store"), req, _keys()),
        st.tuples(st.just("complete_store"), req, _keys(), st.booleans()),
        st.tuples(st.just("complete_pending"), req, st.just(True)),
        st.tuples(st.just("complete_pending"), req, st.booleans()),
        st.tuples(st.just("load_ready"), req, _picks()),
        st.tuples(st.just("complete_load_pinned"), req, _picks()),
        st.tuples(st.just("touch"), req, _keys()),
        st.tuples(st.just("lookup"), st.integers(0, KEYS - 1)),
        st.tuples(st.just("finish"), req),
        st.just(("reset",)),
        st.just(("take_events",)),
        st.just(("get_stats",)),
    )


def _block() -> st.SearchStrategy[tuple[tuple, ...]]:
    """One intent, or a store followed by its completion (so chunks become idle and evictions happen)."""
    req = st.integers(0, REQS - 1)
    stored = st.tuples(st.tuples(st.just("store"), req, _keys()), st.tuples(st.just("complete_pending"), req,
                                                                            st.just(True)))
    return st.one_of(stored, _intent().map(lambda intent: (intent,)))


@st.composite
def ops_cases(draw: st.DrawFn, thresholds: st.SearchStrategy[int] = st.sampled_from((1, 1, 2)),
              positions: bool = False) -> OpsCase:
    """A manager (capacity 0..4, mostly 2 or 3: full caches evict; LRU or ARC, a store threshold and tracker)
    and 4 to 30 blocks of operation intents; `positions`: requests' contexts record key positions (each key's
    end token, a drawn order; all requests or the even ones)."""
    blocks = draw(st.lists(_block(), min_size=10, max_size=30))
    case = OpsCase(capacity=draw(st.sampled_from((2, 3, 1, 4, 0))), policy=draw(st.sampled_from(("lru", "arc"))),
                   ops=tuple(intent for block in blocks for intent in block), store_threshold=draw(thresholds),
                   max_tracker_size=draw(st.integers(1, 8)))
    if not positions:
        return case
    order = draw(st.permutations(range(1, KEYS + 1)))
    return replace(case, positions=tuple(16 * i for i in order), mixed=draw(st.booleans()))


OPS_CASES = ops_cases()
POSITION_CASES = ops_cases(positions=True)
THRESHOLD_CASES = ops_cases(thresholds=st.just(2))
