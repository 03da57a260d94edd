"""SGLang decode pre-allocation requirement (`disaggregation/decode.py`) against `swa-budget`: one differential.

`BUDGET` (`_prealloc_required_tokens`): upstream `DecodePreallocQueue._prealloc_required_tokens` runs unchanged
with its real helpers `_prealloc_kv_lens`, `_uses_swa_tail_prealloc` and `_swa_tail_len` (and the release's own
`ceil_align` from `utils/common.py`, loaded in `prepare` where the release uses it) on a stand-in queue, on Hypothesis inputs: the fill length, the page size, the sliding window
(none, 0 or 1..4096), the decode reserve, whether the radix cache is disabled, and the pool (an SWA pool whose
allocator tails, an SWA pool whose allocator has no `alloc_extend_swa_tail`, or a pool without SWA); the (full,
SWA) requirement compared with the model's `prealloc_required_tokens`, and `_swa_tail_len` of the fill length
(the SWA tokens `_pre_alloc` takes) with the model's `swa_prealloc_len`. Pinned first: each page size with a
tailing pool and a fill length past the window, then the two pools that take no tail at page size 16 (without
them, 100 derandomized inputs left `_uses_swa_tail_prealloc` with its isinstance clause dropped alive).

Conventions: the request's fill length is given directly (stand-in `_pre_alloc_fill_len`); the decode radix
cache (`disaggregation_decode_enable_radix_cache`) is off (the model has no radix-cache insert boundary, so that
line of `_swa_tail_len` is not run); upstream derives the SWA reserve from the radix cache setting: disabled ->
0, enabled -> `num_reserved_decode_tokens`, which the adapter passes the model as `reserved_swa_tokens`. Where
upstream takes no SWA tail (a pool without SWA, an allocator that cannot tail, no window or a window <= 0) it
charges the SWA side the whole length: the model's requirement with a window covering the whole request.
0.5.13-0.5.18 read the radix flag from the scheduler's `server_args` (0.5.19+: `get_memory()`).

Survivors (documented in the declaration): the decode radix cache's line of `_swa_tail_len` (no input runs it);
the `seq_len <= 0` guard of `_swa_tail_len` dropped, made `< 0` or `<= 1`, and `max(0, seq_len - window)` made
`max(1, ...)` (equal on every fill length and window: see the reasons); max's arguments swapped; and
`page_size > 1` made `>= 1` or `> 0` in `_prealloc_required_tokens` (ceil_align to one token is the identity).

Release -> model variant (the declaration's table): before 0.5.18 `pre_af7c62e` (raw tokens), 0.5.18 and later
`fixed` (whole pages).
Settled (model fix): at page size 1 upstream takes no SWA tail (`_uses_swa_tail_prealloc` needs
page_size > 1) and charges the SWA pool the full length, which is what `_pre_alloc` physically takes there
(`allocator.alloc(n)` takes n slots from both pools); the model charged the window tail and now charges the
full length (`kvsim.models.swa_budget.resume.swa_prealloc_len`, regression test
`test_page_size_one_charges_the_swa_pool_the_whole_length`). A source that still tails at page size 1 is
reported as that (the divergence's note).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Differential
from kvsim.engine.errors import ConfigError
from kvsim.models.swa_budget.resume import prealloc_required_tokens, swa_prealloc_len, swa_tail_len

from ..loader import load_definitions, names_in

RELPATH = "sglang/srt/disaggregation/decode.py"
UTILS = "sglang/srt/utils/common.py"  # sglang.srt.utils re-exports it with `import *`
METHODS = ("_prealloc_required_tokens", "_prealloc_kv_lens", "_uses_swa_tail_prealloc", "_swa_tail_len")
POOLS = ("swa", "swa_no_tail", "full")  # SWAKVPool with a tailing allocator, without, or a pool without SWA
PAGE1_TAIL = ("this source charges the SWA pool only the window tail at page size 1; the releases (0.5.23) "
              "and the model charge the whole length, which _pre_alloc's allocator.alloc takes there")


class SwaPool:
    """Stand-in for SWAKVPool (the isinstance test in `_uses_swa_tail_prealloc`)."""


class FullPool:
    """A KV pool without a sliding window."""


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    """A request and its pool: any fill length, or one just past the window (where the tail's page rounding
    shows), any window (none, 0, small or large), page size, reserve and radix setting, and the three pools."""
    page = draw(st.sampled_from(PAGE_SIZES))
    window = draw(st.one_of(st.integers(1, 256), st.integers(1, 4096), st.sampled_from((None, 0))))
    past = window or 0
    fill = draw(st.one_of(st.integers(past, past + 4 * page), st.integers(0, 5000)))
    return {"fill_len": fill, "page_size": page, "window": window, "reserve": draw(st.integers(0, 64)),
            "radix_disabled": draw(st.booleans()), "pool": draw(st.sampled_from(POOLS))}


PAGE_SIZES = (1, 2, 4, 16, 64)


def pinned(ctx: Context) -> list[dict[str, Any]]:
    """Run first: each page size with a tailing SWA pool and a fill length past the window by a few pages and one
    token (where a tail, its page rounding and the reserve all show); then the two pools that take no tail with
    an allocator page past one token (a tail taken there shows as the SWA side charged less)."""
    past = [{"fill_len": 100 + 3 * page + 1, "page_size": page, "window": 100, "reserve": 3, "radix_disabled": False,
             "pool": "swa"} for page in PAGE_SIZES]
    return past + [{**past[-2], "pool": pool} for pool in POOLS if pool != "swa"]


def prepare(ctx: Context) -> None:
    """The queue's four methods on a stand-in class; the radix-cache settings read from the case."""
    queue = ctx.up.DecodePreallocQueue
    missing = [m for m in METHODS if m not in vars(queue)]
    if missing:
        raise ConfigError(f"{RELPATH}:DecodePreallocQueue.{missing[0]}", "a method", f"absent in {ctx.source.label}")
    methods = {m: vars(queue)[m] for m in METHODS}
    module = methods["_prealloc_required_tokens"].__globals__
    if ctx.source.has(UTILS) and "ceil_align" in names_in(ctx.source.file(UTILS)):  # the release's own (0.5.18+)
        module["ceil_align"] = load_definitions(ctx.source.file(UTILS), ["ceil_align"], where=UTILS,
                                                version=ctx.source.label).ceil_align
    module.update(SWAKVPool=SwaPool, DeepSeekV4TokenToKVPool=SwaPool,
                  get_memory=lambda: SimpleNamespace(disable_radix_cache=ctx.state["radix_disabled"]),
                  get_disagg=lambda: SimpleNamespace(disaggregation_decode_enable_radix_cache=False))
    ctx.state["queue"] = type("StandIn", (), methods)


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, int]:
    ctx.state["radix_disabled"] = case["radix_disabled"]
    queue = ctx.state["queue"]()
    queue.token_to_kv_pool = FullPool() if case["pool"] == "full" else SwaPool()
    allocator = SimpleNamespace(page_size=case["page_size"])
    if case["pool"] != "swa_no_tail":
        allocator.alloc_extend_swa_tail = None
    queue.token_to_kv_pool_allocator = allocator
    queue.num_reserved_decode_tokens = case["reserve"]
    # 0.5.13-0.5.18 read the radix flag from the scheduler's server_args (later releases: get_memory)
    queue.scheduler = SimpleNamespace(sliding_window_size=case["window"], server_args=SimpleNamespace(
        disable_radix_cache=case["radix_disabled"], disaggregation_decode_enable_radix_cache=False))
    queue._pre_alloc_fill_len = lambda req: case["fill_len"]
    full, swa = queue._prealloc_required_tokens(None)
    return {"full_tokens": full, "swa_tokens": swa, "swa_tail_len": queue._swa_tail_len(case["fill_len"])}


def window(case: dict[str, Any]) -> int:
    """The model's window: the case's, or one covering the request where upstream takes no SWA tail."""
    tails = case["pool"] == "swa" and case["window"] is not None and case["window"] > 0
    return case["window"] if tails else max(case["fill_len"], 1)


def model(ctx: Context, case: dict[str, Any]) -> dict[str, int]:
    reserve = case["reserve"]
    full, swa = prealloc_required_tokens(case["fill_len"], case["page_size"], window(case), reserve,
                                         0 if case["radix_disabled"] else reserve, ctx.variant)
    return {"full_tokens": full, "swa_tokens": swa,
            "swa_tail_len": swa_prealloc_len(case["fill_len"], case["page_size"], window(case))}


def explain(ctx: Context, case: dict[str, Any], want: Any, got: Any) -> str:
    if case["page_size"] != 1 or not isinstance(got, dict) or not isinstance(want, dict):
        return ""
    tail = swa_tail_len(case["fill_len"], 1, window(case)) - case["fill_len"]
    return PAGE1_TAIL if tail and got["swa_tokens"] - want["swa_tokens"] == tail else ""


BUDGET = Differential(
    prepare=prepare, inputs=lambda ctx: cases(), pinned=pinned, model=model, upstream=upstream, explain=explain,
    note=lambda ctx: f"model variant {ctx.variant.name}")
