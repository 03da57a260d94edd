"""The inputs of the swa-budget properties: one `resume_retracted_reqs` call, and the pinned upstream cases."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.system import Sometimes
from kvsim.models.swa_budget.resume import FIXED, RetractedReq, ResumeResult, SwaVariant, resume_retracted_reqs


@dataclass(frozen=True)
class ResumeCase:
    """One call of `resume_retracted_reqs`: a retracted queue, both pools, both budgets."""

    page_size: int
    sliding_window: int
    fills: tuple[int, ...]
    full_free_pages: int
    swa_free_pages: int
    full_budget: int
    swa_budget: int
    reserved_decode_tokens: int = 0

    def run(self, variant: SwaVariant = FIXED) -> ResumeResult:
        queue = [RetractedReq(rid, fill) for rid, fill in enumerate(self.fills)]
        return resume_retracted_reqs(queue, full_budget=self.full_budget, swa_budget=self.swa_budget,
                                     page_size=self.page_size, sliding_window=self.sliding_window,
                                     full_free_pages=self.full_free_pages, swa_free_pages=self.swa_free_pages,
                                     reserved_decode_tokens=self.reserved_decode_tokens, variant=variant)


# Upstream unit test test_paged_swa_retraction_resume_uses_physical_page_budget, and the minimal case.
UPSTREAM_CASE = ResumeCase(page_size=128, sliding_window=2047, fills=(574,) * 4, full_free_pages=18,
                           swa_free_pages=18, full_budget=18 * 128, swa_budget=18 * 128)
MINIMAL_CASE = ResumeCase(page_size=4, sliding_window=4, fills=(1, 1), full_free_pages=1, swa_free_pages=1,
                          full_budget=4, swa_budget=4)
PINNED = (UPSTREAM_CASE, MINIMAL_CASE)


# -- what some drawn call must be (`sometimes`: a strategy that never draws these corners checks nothing there) -------

def _resumes_one(case: ResumeCase) -> bool:
    return bool(case.run().resumed)


def _budget_stops_the_queue(case: ResumeCase) -> bool:
    result = case.run()
    return bool(result.resumed) and bool(result.remaining)


def _fill_off_a_page_boundary(case: ResumeCase) -> bool:
    return case.page_size > 1 and any(fill % case.page_size for fill in case.fills)


# the strategy of the budget properties (`RETRACTED_QUEUES`): af7c62e's rounding matters where a fill ends mid-page
RESUME_SOMETIMES = (
    Sometimes("a_request_resumes", _resumes_one, "the fixed budget admits the queue's first request"),
    Sometimes("the_budget_stops_the_queue", _budget_stops_the_queue,
              "some requests resume and a later one stays retracted: the budget cuts the queue"),
    Sometimes("a_fill_ends_mid_page", _fill_off_a_page_boundary,
              "a request's tokens end inside a page of two or more tokens (where af7c62e rounds up)"),
)
