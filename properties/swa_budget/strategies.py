"""Hypothesis strategies of the swa-budget properties (imported only when a property runs)."""

from __future__ import annotations

from hypothesis import strategies as st

from .cases import ResumeCase


@st.composite
def retracted_queues(draw: st.DrawFn, page_sizes: st.SearchStrategy[int] | None = None) -> ResumeCase:
    """Budgets no larger than the free pages (as upstream computes them from the pool state)."""
    page_size = draw(page_sizes if page_sizes is not None else st.sampled_from((1, 2, 4, 8, 16, 128)))
    window = draw(st.integers(1, 8 * page_size))
    fills = tuple(draw(st.lists(st.integers(1, 6 * page_size), min_size=1, max_size=6)))
    full_free = draw(st.integers(0, 24))
    swa_free = draw(st.integers(0, 24))
    reserved = draw(st.integers(0, 2 * page_size))
    full_budget = full_free * page_size - draw(st.integers(0, page_size))
    swa_budget = swa_free * page_size - draw(st.integers(0, page_size))
    return ResumeCase(page_size, window, fills, full_free, swa_free, full_budget, swa_budget, reserved)


RETRACTED_QUEUES = retracted_queues()
PAGE_SIZE_ONE = retracted_queues(page_sizes=st.just(1))
