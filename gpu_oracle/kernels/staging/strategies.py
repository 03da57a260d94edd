"""Hypothesis strategies of the PD staging kernel properties (imported only when one runs)."""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.models.pd_staging.layout import HeadReshard
from kvsim.properties.pd_staging.strategies import TRANSFER_CASES  # noqa: F401  the model's rooms, for the e2e property

from .cases import DTYPES, CopyCase, overrun_cases

_RESHARDS = ((8, 4, 2), (8, 2, 4), (2, 8, 2), (2, 2, 8), (4, 4, 4), (1, 1, 2), (4, 1, 1), (16, 2, 8))


@st.composite
def copy_cases(draw: st.DrawFn, distinct_pages: bool = False) -> CopyCase:
    """Every writer of every decode rank of eight TP pairings (GQA replication both ways), any page list
    (`distinct_pages`: no repeats, as a scatter's destination needs), the writer at its slot offset or anywhere
    in a larger garbage-filled buffer, four dtypes, odd thread counts."""
    h, p, d = draw(st.sampled_from(_RESHARDS))
    cfg = HeadReshard(h, p, d)
    rank = draw(st.integers(0, d - 1))
    writer = draw(st.integers(0, len(cfg.writer_ranks(rank)) - 1))
    ps, pool_pages = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    n = draw(st.integers(0, pool_pages))
    if distinct_pages:
        pages = tuple(draw(st.permutations(range(pool_pages)))[:n])
    else:
        pages = tuple(draw(st.lists(st.integers(0, pool_pages - 1), min_size=n, max_size=n)))
    offset = draw(st.none() | st.integers(0, 64))
    return CopyCase((h, p, d), rank, writer, draw(st.integers(1, 3)), draw(st.integers(1, 5)),
                    draw(st.sampled_from(DTYPES)), ps, pool_pages, pages, draw(st.integers(0, 8)), offset,
                    draw(st.sampled_from((128, 1, 3, 64))), draw(st.integers(0, 2**16)))


GATHER_CASES = copy_cases()
SCATTER_CASES = copy_cases(distinct_pages=True)
OVERRUNS = st.sampled_from(overrun_cases())
