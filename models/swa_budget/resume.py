"""Paged-SWA retract/resume page budget (SGLang af7c62e, PR #33794).

Follows `python/sglang/srt/disaggregation/decode.py` at af7c62e:
`_prealloc_required_tokens` and `resume_retracted_reqs`, plus the
`_pre_alloc` assertion that crashes the decode scheduler when the paged
allocator runs out ("KV cache is full! Bug in memory estimation.").

A hybrid model keeps two paged pools: the full-attention pool holds all
`fill_len` tokens, the sliding-window (SWA) pool only the tail that starts on
the page boundary at or before `fill_len - window`. Physically each pool is
charged whole pages. At page size 1 there is no tail pre-allocation
(`_uses_swa_tail_prealloc` needs page_size > 1): `_pre_alloc` calls the
allocator's `alloc(n)`, which takes `n` slots from *both* pools, so the SWA pool
is charged the full length, and admission charges it the same; the decode
loop's SWA eviction trims the request back to its window afterwards
(`held_pages`). Before af7c62e the admission loop charged raw tokens,
under-charging each request by `(-fill_len) mod page_size` tokens, so over
several admissions it let in more pages than exist.

Variants: `fixed` (page-rounded requirement when page_size > 1) and
`pre_af7c62e` (raw tokens). They differ only in `prealloc_required_tokens`,
at the one flag `SwaVariant.page_rounded_requirement`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvsim.engine.errors import check_int

from .variants import FIXED, SwaVariant

KV_CACHE_FULL = "KV cache is full! Bug in memory estimation."


def ceil_align(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def swa_tail_len(fill_len: int, page_size: int, sliding_window: int) -> int:
    """Tokens the SWA pool keeps: from the page boundary at or before fill_len - window."""
    return fill_len - (max(0, fill_len - sliding_window) // page_size) * page_size


def swa_prealloc_len(fill_len: int, page_size: int, sliding_window: int) -> int:
    """SWA tokens `_pre_alloc` takes and admission charges: the window tail, or all of them at page size 1."""
    if page_size == 1:  # upstream: no tail path (`_uses_swa_tail_prealloc` requires page_size > 1)
        return fill_len
    return swa_tail_len(fill_len, page_size, sliding_window)


def physical_pages(fill_len: int, page_size: int, sliding_window: int) -> tuple[int, int]:
    """(full pages, SWA pages) that `_pre_alloc` takes for a request of `fill_len` tokens."""
    return pages_for(fill_len, page_size), pages_for(swa_prealloc_len(fill_len, page_size, sliding_window), page_size)


def held_pages(fill_len: int, page_size: int, sliding_window: int) -> tuple[int, int]:
    """(full pages, SWA pages) a decoding request holds once SWA eviction has trimmed it to its window tail.

    Equal to `physical_pages` for page_size > 1; at page size 1 the SWA side is the window, not the length.
    """
    return pages_for(fill_len, page_size), pages_for(swa_tail_len(fill_len, page_size, sliding_window), page_size)


def prealloc_required_tokens(fill_len: int, page_size: int, sliding_window: int, reserved_decode_tokens: int = 0,
                             reserved_swa_tokens: int = 0, variant: SwaVariant = FIXED) -> tuple[int, int]:
    """(full, SWA) admission requirement of one request, in tokens."""
    tail = swa_prealloc_len(fill_len, page_size, sliding_window)
    if variant.page_rounded_requirement and page_size > 1:
        # af7c62e: charge the pages the allocator really takes; reserves stay unrounded
        full, swa = ceil_align(fill_len, page_size), ceil_align(tail, page_size)
    else:
        full, swa = fill_len, tail
    return full + reserved_decode_tokens, swa + reserved_swa_tokens


@dataclass(frozen=True)
class RetractedReq:
    rid: int
    fill_len: int

    def __post_init__(self) -> None:
        check_int(self.rid, "RetractedReq.rid", minimum=0)
        check_int(self.fill_len, "RetractedReq.fill_len", minimum=1)


@dataclass(frozen=True)
class AllocCall:
    """One `_pre_alloc` call: the pages asked of each pool and whether the pools had them."""

    rid: int
    full_pages: int
    swa_pages: int
    ok: bool
    full_free_after: int
    swa_free_after: int


@dataclass(frozen=True)
class ResumeResult:
    resumed: tuple[int, ...]
    remaining: tuple[RetractedReq, ...]
    full_budget: int
    swa_budget: int
    alloc_calls: tuple[AllocCall, ...]
    budget_trail: tuple[tuple[int, int], ...]  # (full, SWA) budget after each admission
    error: str | None = None  # set when _pre_alloc failed: the decode scheduler would crash here


def resume_retracted_reqs(queue: Sequence[RetractedReq], *, full_budget: int, swa_budget: int, page_size: int,
                          sliding_window: int, full_free_pages: int, swa_free_pages: int,
                          reserved_decode_tokens: int = 0, reserved_swa_tokens: int = 0,
                          free_req_slots: int | None = None, variant: SwaVariant = FIXED) -> ResumeResult:
    """FIFO admission of retracted requests with head-of-line blocking over both budgets.

    Budgets are computed once by the caller (`count_retracted=False`). Each
    admitted request is pre-allocated from a physical two-pool page allocator;
    a failed allocation ends the loop with `error` set, as the upstream
    assertion would end the process.
    """
    check_int(page_size, "page_size", minimum=1)
    check_int(sliding_window, "sliding_window", minimum=1)
    bf, bs = full_budget, swa_budget
    ff, sf = full_free_pages, swa_free_pages
    resumed: list[int] = []
    calls: list[AllocCall] = []
    trail: list[tuple[int, int]] = []
    error = None
    for req in queue:
        if free_req_slots is not None and len(resumed) >= free_req_slots:
            break
        need_full, need_swa = prealloc_required_tokens(req.fill_len, page_size, sliding_window,
                                                       reserved_decode_tokens, reserved_swa_tokens, variant)
        if need_full > bf or need_swa > bs:
            break  # head-of-line blocking: later, smaller requests wait too
        full_pages, swa_pages = physical_pages(req.fill_len, page_size, sliding_window)
        ok = full_pages <= ff and swa_pages <= sf
        if ok:
            ff, sf = ff - full_pages, sf - swa_pages
        calls.append(AllocCall(req.rid, full_pages, swa_pages, ok, ff, sf))
        if not ok:
            error = (f"{KV_CACHE_FULL} _pre_alloc for request {req.rid}: needed {full_pages} full and "
                     f"{swa_pages} SWA pages, {ff} and {sf} free")
            break
        resumed.append(req.rid)
        bf, bs = bf - need_full, bs - need_swa
        trail.append((bf, bs))
    taken = set(resumed)
    remaining = tuple(r for r in queue if r.rid not in taken)
    return ResumeResult(tuple(resumed), remaining, bf, bs, tuple(calls), tuple(trail), error)
