"""Properties B1–B6 of the paged-SWA resume budget (SGLang af7c62e), and the scheduler invariants.

B2 (physical soundness: every `_pre_alloc` succeeds once admission said yes)
is the one the bug breaks; the others pin down the admission loop's contract.
"""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property, stateful_property
from kvsim.models.swa_budget.resume import SwaVariant, physical_pages, prealloc_required_tokens
from kvsim.models.swa_budget.variants import VARIANTS

from .cases import PINNED, RESUME_SOMETIMES, ResumeCase

MODEL = "swa-budget"


@kv_property(model=MODEL, strategy="RETRACTED_QUEUES", examples=PINNED, sometimes=RESUME_SOMETIMES)
def resumed_requests_fit_physical_pages(case: ResumeCase, variant: SwaVariant) -> None:
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


@kv_property(model=MODEL, strategy="RETRACTED_QUEUES", examples=PINNED, sometimes=RESUME_SOMETIMES)
def budgets_stay_nonnegative(case: ResumeCase, variant: SwaVariant) -> None:
    """B1: after each admission both budgets are >= 0."""
    for n, (full, swa) in enumerate(case.run(variant).budget_trail):
        if full < 0 or swa < 0:
            raise PropertyViolation(f"budgets after admission {n}: expected >= 0, got full {full}, SWA {swa}")


@kv_property(model=MODEL, strategy="RETRACTED_QUEUES", examples=PINNED, sometimes=RESUME_SOMETIMES)
def resume_is_fifo_prefix(case: ResumeCase, variant: SwaVariant) -> None:
    """B3: resumed requests are a prefix of the retracted queue; the rest keep their order."""
    result = case.run(variant)
    k = len(result.resumed)
    if result.resumed != tuple(range(k)):
        raise PropertyViolation(f"resumed request ids: expected the prefix {tuple(range(k))}, got {result.resumed}")
    rest = tuple(r.rid for r in result.remaining)
    if rest != tuple(range(k, len(case.fills))):
        raise PropertyViolation(f"remaining queue: expected {tuple(range(k, len(case.fills)))}, got {rest}")


@kv_property(model=MODEL, strategy="RETRACTED_QUEUES", examples=PINNED, sometimes=RESUME_SOMETIMES)
def no_over_conservative_refusal(case: ResumeCase, variant: SwaVariant) -> None:
    """B4: the request that stops the loop really does not fit: its whole pages plus reserve exceed a budget.

    The physical charge is what `_pre_alloc` takes: at page size 1 the whole length in the SWA pool too
    (no tail path upstream), so admission there is exact, not over-conservative.
    """
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


@kv_property(model=MODEL, strategy="PAGE_SIZE_ONE")
def page_size_one_unchanged(case: ResumeCase, variant: SwaVariant) -> None:
    """B5: with page size 1 the variant decides exactly as the pre-fix arithmetic does, and charges each
    request its whole length in both pools (upstream `_prealloc_required_tokens` with no SWA tail path)."""
    for fill in case.fills:
        charged = prealloc_required_tokens(fill, 1, case.sliding_window, case.reserved_decode_tokens, 0, variant)
        if charged != (fill + case.reserved_decode_tokens, fill):
            raise PropertyViolation(f"(full, SWA) charge of fill {fill} at page size 1 (window "
                                    f"{case.sliding_window}): expected ({fill + case.reserved_decode_tokens}, "
                                    f"{fill}), got {charged}")
    ours, theirs = case.run(variant), case.run(VARIANTS["pre_af7c62e"])
    if ours != theirs:
        raise PropertyViolation(f"resume result at page size 1: expected {theirs}, got {ours}")


@kv_property(model=MODEL, strategy="RETRACTED_QUEUES", examples=PINNED, sometimes=RESUME_SOMETIMES)
def alloc_calls_match_resumed(case: ResumeCase, variant: SwaVariant) -> None:
    """B6: `_pre_alloc` is called once per resumed request; no request is both resumed and queued."""
    result = case.run(variant)
    if len(result.alloc_calls) != len(result.resumed):
        raise PropertyViolation(f"_pre_alloc calls: expected {len(result.resumed)} (one per resumed request), "
                                f"got {len(result.alloc_calls)}")
    both = set(result.resumed) & {r.rid for r in result.remaining}
    if both or len(result.resumed) + len(result.remaining) != len(case.fills):
        raise PropertyViolation(f"requests resumed and still queued: expected none, got {sorted(both)}")


SCHEDULER_INVARIANTS = stateful_property(
    model=MODEL, name="scheduler_invariants", home=__name__,
    doc="The decode scheduler's invariants hold on every step of Hypothesis-chosen action sequences "
        "(no failed allocation, budgets, FIFO, pool conservation, request accounting).")
