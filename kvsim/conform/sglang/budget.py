"""SGLang decode pre-allocation requirement (`disaggregation/decode.py`) against `swa-budget`.

Upstream `DecodePreallocQueue._prealloc_required_tokens` runs unchanged with its real helpers
`_prealloc_kv_lens`, `_uses_swa_tail_prealloc` and `_swa_tail_len` on a stand-in queue.
Conventions: the request's fill length is given directly (stand-in `_pre_alloc_fill_len`);
the pool is an SWA pool whose allocator has `alloc_extend_swa_tail`; the decode radix cache
(`disaggregation_decode_enable_radix_cache`) is off. Upstream derives the SWA reserve
from the radix cache setting: disabled -> 0, enabled -> `num_reserved_decode_tokens`; the
adapter passes the model that reserve as `reserved_swa_tokens` (the model's default 0 is
upstream with the radix cache disabled).
Settled (model fix): at page size 1 upstream takes no SWA tail (`_uses_swa_tail_prealloc` needs
page_size > 1) and charges the SWA pool the full length, which is what `_pre_alloc` physically takes there
(`allocator.alloc(n)` takes n slots from both pools); the model charged the window tail and now charges the
full length (`kvsim.models.swa_budget.resume.swa_prealloc_len`, regression test
`test_page_size_one_charges_the_swa_pool_the_whole_length`). A source that still tails at page size 1 is
reported as that.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from kvsim.models.swa_budget.resume import FIXED, prealloc_required_tokens, swa_tail_len

from ..loader import load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive

RELPATH = "sglang/srt/disaggregation/decode.py"
METHODS = ("_prealloc_required_tokens", "_prealloc_kv_lens", "_uses_swa_tail_prealloc", "_swa_tail_len")
PAGE1_TAIL = ("this source charges the SWA pool only the window tail at page size 1; the releases (0.5.23) "
              "and the model charge the whole length, which _pre_alloc's allocator.alloc takes there")


class SwaPool:
    """Stand-in for SWAKVPool (the isinstance test in `_uses_swa_tail_prealloc`)."""


UTILS = "sglang/srt/utils/common.py"  # sglang.srt.utils re-exports it with `import *`


def stand_in_queue(source: EngineSource, flags: dict[str, bool]) -> type:
    ceil_align = load_definitions(source.file(UTILS), ["ceil_align"], where=UTILS, version=source.label).ceil_align
    queue = load_definitions(source.file(RELPATH), ["DecodePreallocQueue"], where=RELPATH, version=source.label,
                             extra_globals={
                                 "ceil_align": ceil_align, "SWAKVPool": SwaPool, "DeepSeekV4TokenToKVPool": SwaPool,
                                 "get_memory": lambda: SimpleNamespace(disable_radix_cache=flags["radix_disabled"]),
                                 "get_disagg": lambda: SimpleNamespace(disaggregation_decode_enable_radix_cache=False),
                             }).DecodePreallocQueue
    missing = [m for m in METHODS if m not in vars(queue)]
    if missing:
        from kvsim.engine.errors import ConfigError
        raise ConfigError(f"{RELPATH}:DecodePreallocQueue.{missing[0]}", "a method", f"absent in {source.label}")
    return type("StandIn", (), {m: vars(queue)[m] for m in METHODS})


def run_budget(source: EngineSource, options: RunOptions) -> TargetResult:
    from hypothesis import strategies as st
    started = time.perf_counter()
    flags = {"radix_disabled": True}
    stand_in = stand_in_queue(source, flags)
    result = TargetResult("_prealloc_required_tokens", source.version)
    page1 = 0

    def check(case: Any) -> None:
        nonlocal page1
        fill, page, window, reserve, radix_disabled = case
        flags["radix_disabled"] = radix_disabled
        queue = stand_in()
        queue.token_to_kv_pool = SwaPool()
        queue.token_to_kv_pool_allocator = SimpleNamespace(page_size=page, alloc_extend_swa_tail=None)
        queue.num_reserved_decode_tokens = reserve
        # older releases read the radix flag from the scheduler's server_args (0.5.23: through envs/get_memory)
        queue.scheduler = SimpleNamespace(sliding_window_size=window,
                                          server_args=SimpleNamespace(disable_radix_cache=flags["radix_disabled"]))
        queue._pre_alloc_fill_len = lambda req: fill
        upstream = tuple(queue._prealloc_required_tokens(None))
        model = prealloc_required_tokens(fill, page, window, reserve, 0 if radix_disabled else reserve, FIXED)
        result.compared += 1
        if upstream != tuple(model):
            known = page == 1 and upstream[1] - model[1] == swa_tail_len(fill, page, window) - fill
            page1 += known
            result.diverge({"fill_len": fill, "page_size": page, "window": window, "reserve": reserve,
                            "radix_disabled": radix_disabled}, list(model), list(upstream),
                           PAGE1_TAIL if known else "")

    drive(st.tuples(st.integers(0, 5000), st.sampled_from((1, 2, 4, 16, 64)), st.integers(1, 4096),
                    st.integers(0, 64), st.booleans()), check, options)
    if page1:
        result.note = f"{page1} divergent inputs are the window tail at page size 1 ({PAGE1_TAIL})"
    return result.finish(started)


TARGETS = (
    Target("sglang", "_prealloc_required_tokens", RELPATH, ("DecodePreallocQueue",), "swa-budget",
           "(full, SWA) admission requirement in tokens", run_budget),
)
