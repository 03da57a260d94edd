"""Properties B1–B6 of the paged-SWA resume budget (SGLang af7c62e), and the scheduler invariants.

Research note: ../shared/research/sglang.md, section 3. B2 (physical
soundness: every `_pre_alloc` succeeds once admission said yes) is the one
the bug breaks; the others pin down the admission loop's contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hypothesis import strategies as st

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.params import ParamSpec
from kvsim.engine.property import kv_property, stateful_property
from kvsim.engine.registry import REGISTRY, BugReport, ModelSpec
from kvsim.models.swa_budget import sim as swa_sim
from kvsim.models.swa_budget.resume import VARIANTS, RetractedReq, ResumeResult, physical_pages, resume_retracted_reqs
from kvsim.models.swa_budget.scheduler import SchedulerConfig, SwaScheduler

MODEL = "swa-budget"

SYSTEM_PARAMS = (
    ParamSpec("page_size", "int", 2, "tokens per page (both pools)", minimum=1),
    ParamSpec("sliding_window", "int", 4, "SWA window in tokens", minimum=1),
    ParamSpec("full_pages", "int", 4, "pages in the full-attention pool", minimum=1),
    ParamSpec("swa_pages", "int", 3, "pages in the SWA pool", minimum=1),
    ParamSpec("prompts", "ints", (1, 3, 2), "prompt length of each request", minimum=1),
    ParamSpec("outputs", "ints", (3, 2, 2), "output length of each request", minimum=1),
    ParamSpec("reserved_decode_tokens", "int", 0, "num_reserved_decode_tokens per request", minimum=0),
)


def make_system(variant: str, params: Mapping[str, Any]) -> SwaScheduler:
    return SwaScheduler(SchedulerConfig(params["page_size"], params["sliding_window"], params["full_pages"],
                                        params["swa_pages"], tuple(params["prompts"]), tuple(params["outputs"]),
                                        params["reserved_decode_tokens"]), variant)


REGISTRY.add_model(ModelSpec(
    name=MODEL,
    summary="paged-SWA retract/resume admission budget over a two-pool page allocator",
    source="sglang af7c62e (PR #33794)",
    variants=VARIANTS,
    params=SYSTEM_PARAMS,
    system=make_system,
    simulate=swa_sim.simulate,
    sim_params=swa_sim.SIM_PARAMS,
))


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

    def run(self, variant: str) -> ResumeResult:
        queue = [RetractedReq(rid, fill) for rid, fill in enumerate(self.fills)]
        return resume_retracted_reqs(queue, full_budget=self.full_budget, swa_budget=self.swa_budget,
                                     page_size=self.page_size, sliding_window=self.sliding_window,
                                     full_free_pages=self.full_free_pages, swa_free_pages=self.swa_free_pages,
                                     reserved_decode_tokens=self.reserved_decode_tokens, variant=variant)


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


# Upstream unit test test_paged_swa_retraction_resume_uses_physical_page_budget, and the minimal case.
UPSTREAM_CASE = ResumeCase(page_size=128, sliding_window=2047, fills=(574,) * 4, full_free_pages=18,
                           swa_free_pages=18, full_budget=18 * 128, swa_budget=18 * 128)
MINIMAL_CASE = ResumeCase(page_size=4, sliding_window=4, fills=(1, 1), full_free_pages=1, swa_free_pages=1,
                          full_budget=4, swa_budget=4)
PINNED = (UPSTREAM_CASE, MINIMAL_CASE)


@kv_property(model=MODEL, strategy=retracted_queues(), examples=PINNED)
def resumed_requests_fit_physical_pages(case: ResumeCase, variant: str) -> None:
    """B2: every `_pre_alloc` succeeds once admission said yes; the pages taken fit the free pages."""
    result = case.run(variant)
    failed = [c for c in result.alloc_calls if not c.ok]
    if failed:
        c = failed[0]
        raise PropertyViolation(
            f"pages for resumed request {c.rid}: expected <= {c.full_free_after} full and <= {c.swa_free_after} "
            f"SWA (the free pages), got {c.full_pages} and {c.swa_pages}: admission said yes, _pre_alloc "
            f"finds the KV cache full")
    pages = [physical_pages(case.fills[rid], case.page_size, case.sliding_window) for rid in result.resumed]
    full, swa = sum(p[0] for p in pages), sum(p[1] for p in pages)
    if full > case.full_free_pages or swa > case.swa_free_pages:
        raise PropertyViolation(f"pages taken by resumed requests: expected <= ({case.full_free_pages}, "
                                f"{case.swa_free_pages}), got ({full}, {swa})")


@kv_property(model=MODEL, strategy=retracted_queues(), examples=PINNED)
def budgets_stay_nonnegative(case: ResumeCase, variant: str) -> None:
    """B1: after each admission both budgets are >= 0."""
    for n, (full, swa) in enumerate(case.run(variant).budget_trail):
        if full < 0 or swa < 0:
            raise PropertyViolation(f"budgets after admission {n}: expected >= 0, got full {full}, SWA {swa}")


@kv_property(model=MODEL, strategy=retracted_queues(), examples=PINNED)
def resume_is_fifo_prefix(case: ResumeCase, variant: str) -> None:
    """B3: resumed requests are a prefix of the retracted queue; the rest keep their order."""
    result = case.run(variant)
    k = len(result.resumed)
    if result.resumed != tuple(range(k)):
        raise PropertyViolation(f"resumed request ids: expected the prefix {tuple(range(k))}, got {result.resumed}")
    rest = tuple(r.rid for r in result.remaining)
    if rest != tuple(range(k, len(case.fills))):
        raise PropertyViolation(f"remaining queue: expected {tuple(range(k, len(case.fills)))}, got {rest}")


@kv_property(model=MODEL, strategy=retracted_queues(), examples=PINNED)
def no_over_conservative_refusal(case: ResumeCase, variant: str) -> None:
    """B4: the request that stops the loop really does not fit: its whole pages plus reserve exceed a budget."""
    result = case.run(variant)
    if result.error is not None or not result.remaining:
        return  # nothing was refused, or the loop ended in a crash (B2's business)
    head = result.remaining[0]
    full_pages, swa_pages = physical_pages(head.fill_len, case.page_size, case.sliding_window)
    full_need = full_pages * case.page_size + case.reserved_decode_tokens
    swa_need = swa_pages * case.page_size
    if full_need <= result.full_budget and swa_need <= result.swa_budget:
        raise PropertyViolation(
            f"request {head.rid} refused: its physical charge ({full_need}, {swa_need}) tokens fits the "
            f"remaining budgets ({result.full_budget}, {result.swa_budget})")


@kv_property(model=MODEL, strategy=retracted_queues(page_sizes=st.just(1)))
def page_size_one_unchanged(case: ResumeCase, variant: str) -> None:
    """B5: with page size 1 the variant decides exactly as the pre-fix arithmetic does."""
    ours, theirs = case.run(variant), case.run("pre_af7c62e")
    if ours != theirs:
        raise PropertyViolation(f"resume result at page size 1: expected {theirs}, got {ours}")


@kv_property(model=MODEL, strategy=retracted_queues(), examples=PINNED)
def alloc_calls_match_resumed(case: ResumeCase, variant: str) -> None:
    """B6: `_pre_alloc` is called once per resumed request; no request is both resumed and queued."""
    result = case.run(variant)
    if len(result.alloc_calls) != len(result.resumed):
        raise PropertyViolation(f"_pre_alloc calls: expected {len(result.resumed)} (one per resumed request), "
                                f"got {len(result.alloc_calls)}")
    both = set(result.resumed) & {r.rid for r in result.remaining}
    if both or len(result.resumed) + len(result.remaining) != len(case.fills):
        raise PropertyViolation(f"requests resumed and still queued: expected none, got {sorted(both)}")


stateful_property(model=MODEL, name="scheduler_invariants",
                  doc="The decode scheduler's invariants hold on every step of Hypothesis-chosen action sequences "
                      "(no failed allocation, budgets, FIFO, pool conservation, request accounting).")

REGISTRY.add_bug(BugReport(
    id="sglang-af7c62e-swa-resume-budget",
    model=MODEL,
    variant="pre_af7c62e",
    property="resumed_requests_fit_physical_pages",
    source="sglang af7c62e (PR #33794)",
    summary="resume budget charged raw tokens, not whole pages: admission says yes, _pre_alloc finds the "
            "KV cache full and the decode scheduler crashes",
))
