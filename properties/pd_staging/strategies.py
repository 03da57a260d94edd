"""Hypothesis strategies of the pd-staging properties (imported only when a property runs).

Public, so `kvsim.gpu_oracle`'s staging checks draw from the same head reshards and transfer cases.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.models.pd_common.status import STATUS_RULES, KVPoll
from kvsim.models.pd_staging.layout import HeadReshard

from .cases import DTYPES, LayoutCase, PlanCase, RingCase, StagedCase, StatusTrace, TransferCase


@st.composite
def plan_cases(draw: st.DrawFn, aligned_prefix: bool = True) -> PlanCase:
    """Small rooms; radix hits are whole pages; the decode prefix is page-aligned unless `aligned_prefix=False`.

    A non-aligned decode prefix fails the room at registration on `fixed`
    (S13, scenario D), so the plan properties draw aligned prefixes only.
    """
    ps = draw(st.sampled_from((1, 2, 4, 16)))
    cps = draw(st.integers(1, 6 * ps))
    if draw(st.integers(0, 9)) == 9:
        cps = -1  # chunking disabled: one page per slot
    length = draw(st.integers(1, 40 * ps))
    if aligned_prefix:
        prefix = draw(st.integers(0, (length - 1) // ps)) * ps
    else:
        prefix = draw(st.integers(0, length - 1))
    hit = draw(st.integers(0, (length - 1) // ps)) * ps
    host = draw(st.integers(0, hit))
    return PlanCase(length, prefix, ps, cps, hit, host, draw(st.booleans()))


@st.composite
def segment_ranges(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(start, end, D, grid) with start >= D; end may precede start (the empty case)."""
    grid = draw(st.integers(1, 12))
    prefix = draw(st.integers(0, 30))
    start = prefix + draw(st.integers(0, 40))
    return start, start + draw(st.integers(-3, 60)), prefix, grid


@st.composite
def head_reshards(draw: st.DrawFn) -> HeadReshard:
    """H, P_tp, D_tp as powers of two (plus H=1): covers P_tp > H, D_tp > H and both directions."""
    h = draw(st.sampled_from((1, 2, 4, 8, 16)))
    p = draw(st.sampled_from((1, 2, 4, 8, 16, 32)))
    d = draw(st.sampled_from((1, 2, 4, 8, 16, 32)))
    return HeadReshard(h, p, d)


@st.composite
def staged_cases(draw: st.DrawFn) -> StagedCase:
    return StagedCase(draw(plan_cases()), draw(head_reshards()), draw(st.integers(1, 3)), draw(st.sampled_from((1, 2))))


@st.composite
def layout_cases(draw: st.DrawFn) -> LayoutCase:
    cfg = draw(head_reshards())
    return LayoutCase(cfg, draw(st.integers(0, cfg.decode_tp - 1)), draw(st.integers(1, 64)),
                      draw(st.integers(1, 4)), draw(st.sampled_from((2, 128, 256))))


@st.composite
def ring_cases(draw: st.DrawFn) -> RingCase:
    total = draw(st.integers(1, 40))
    op = st.one_of(st.tuples(st.just("assign"), st.integers(1, total + 2)),
                   st.tuples(st.just("free"), st.integers(0, 7)))
    return RingCase(total, tuple(draw(st.lists(op, max_size=25))))


polls = st.sampled_from(tuple(KVPoll))


@st.composite
def status_traces(draw: st.DrawFn, rules: tuple[str, ...] = STATUS_RULES) -> StatusTrace:
    return StatusTrace(draw(st.sampled_from(rules)), draw(st.none() | polls),
                       tuple(draw(st.lists(polls, min_size=1, max_size=8))))


@st.composite
def transfer_cases(draw: st.DrawFn) -> TransferCase:
    """Small rooms (so hundreds run per second): aligned D, whole-page prefill hits, TP sizes 1-4."""
    ps = draw(st.sampled_from((1, 2, 4)))
    cps = draw(st.sampled_from((-1, None)) if draw(st.integers(0, 9)) == 9 else st.integers(1, 4 * ps))
    length = draw(st.integers(1, 12 * ps))
    prefix = draw(st.integers(0, (length - 1) // ps)) * ps
    hit = draw(st.integers(0, (length - 1) // ps)) * ps
    room = PlanCase(length, prefix, ps, cps, hit, draw(st.integers(0, hit)), draw(st.booleans()))
    heads = draw(st.sampled_from((1, 2, 4, 8)))
    res = HeadReshard(heads, draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((1, 2, 4))))
    return TransferCase(room, res, draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.sampled_from(DTYPES)),
                        draw(st.integers(0, 2)), draw(st.booleans()), draw(st.integers(0, 2**16)))


# -- the strategies the properties name -------------------------------------------------------------------
PLAN_CASES = plan_cases()
ANY_PREFIX_PLAN_CASES = plan_cases(aligned_prefix=False)
SEGMENT_RANGES = segment_ranges()
STAGED_CASES = staged_cases()
HEAD_RESHARDS = head_reshards()
LAYOUT_CASES = layout_cases()
RING_CASES = ring_cases()
STATUS_TRACES = status_traces()
MORI_STATUS_TRACES = status_traces(rules=("mori",))
RANK_POLLS = st.lists(polls, min_size=1, max_size=8).map(tuple)
TRANSFER_CASES = transfer_cases()
