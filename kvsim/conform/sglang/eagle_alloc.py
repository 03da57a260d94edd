"""EAGLE's decode allocation length (`speculative/eagle_utils.py`, `eagle_prepare_for_decode`) against radix-cache's
`eagle.page_aligned_decode_alloc_lens`: one differential, and #31616's property on upstream's answer.

`ALLOC_LENS`: upstream's `eagle_prepare_for_decode` runs unchanged on a stand-in batch (its requests'
`kv_allocated_len` and `kv_committed_len`, the allocator's page size, the penalizer flag, the row width, the
device `cpu`); the reserve (`get_alloc_reserve_per_decode`) and the EAGLE topk are the case's. The allocation it
asks for is recorded, not made: 0.5.15's `ALLOC_EXTEND_FUNCS` / `alloc_token_slots` inline, from 0.5.16 the
release's own `alloc_for_spec_decode` (`mem_cache/allocation.py`, loaded here; it records `kv_allocated_len`) with
its allocator calls recorded. From 0.5.19 the length is `mem_cache/allocation_sizing.py`'s
`page_aligned_decode_alloc_lens`, loaded from the release too. The answer: each request's `(cur, nxt)`, the tokens
needed, the tokens the allocation call asked for (none when the release skips a call of 0 tokens: 0.5.16 on) and
each request's `kv_allocated_len` afterwards; the model's is `page_aligned_decode_alloc_lens` in the release's
variant, `kv_allocated_len` `max(cur, nxt)`.

The property `kv_allocated_whole_pages` (radix-cache's invariant of the same name, on one step): a request the step
allocates for records a page-aligned `kv_allocated_len`. It fails on 0.5.15 (#31616) and holds from 0.5.16.

Release -> model variant (the declaration's table): before 0.5.16 `pre_31616`, 0.5.16 and later `fixed`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.radix_cache.eagle import page_aligned_decode_alloc_lens, row_fits

from ..loader import Inert, load_definitions, names_in

EAGLE_UTILS = "sglang/srt/speculative/eagle_utils.py"
ALLOCATION = "sglang/srt/mem_cache/allocation.py"
SIZING = "sglang/srt/mem_cache/allocation_sizing.py"
PAGE_SIZES = (1, 2, 4, 16)
OVERFLOW = "draft over-allocation"  # the row-width assertion's message (#26972's fail-fast at page > 1, topk > 1)
# what the stand-in modules answer, the case in force (set by `upstream` before each call)
NOW: dict[str, Any] = {"topk": 1}


def _server_args() -> SimpleNamespace:
    return SimpleNamespace(speculative_eagle_topk=NOW["topk"])


def _assign(*args: Any) -> None:
    """`assign_req_to_token_pool_func`: the row write, not modelled."""


# the modules the function's own imports name (0.5.15: server_args and spec_utils inside the function; 0.5.16:
# runtime_context.get_server_args; 0.5.23: runtime_context.get_spec at the top)
class _Stand(SimpleNamespace):
    """A stand-in module: its named functions, every other name inert."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert(name)


MODULES = {
    "sglang.srt.server_args": _Stand(get_global_server_args=_server_args),
    "sglang.srt.runtime_context": _Stand(get_server_args=_server_args, get_spec=_server_args,
                                         get_parallel=lambda: SimpleNamespace(attn_dcp_size=1)),
    "sglang.srt.speculative.spec_utils": SimpleNamespace(assign_req_to_token_pool_func=_assign),
}


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    """One to three requests: a committed length, an allocated one at or past it (a prefill's exact length, or
    drafts left from a step before), a reserve, a page size, the topk, the penalizer, whether the batch has a host
    seq_lens mirror, the row width (wide, or narrow enough for the row-width assertion) and the step count so far."""
    page = draw(st.sampled_from(PAGE_SIZES))
    reserve = draw(st.integers(1, 20))
    reqs = []
    for _ in range(draw(st.integers(1, 3))):
        committed = draw(st.integers(0, 80))
        reqs.append((committed, committed + draw(st.integers(0, reserve + page))))
    return {"reqs": reqs, "page_size": page, "reserve": reserve, "topk": draw(st.sampled_from((None, 1, 2))),
            "decode_batch_idx": draw(st.integers(0, 3)),
            "penalty": draw(st.booleans()), "mirrorless": draw(st.booleans()),
            "row_width": draw(st.one_of(st.just(4096), st.integers(0, 120)))}


def pinned(ctx: Context) -> list[dict[str, Any]]:
    """First: a request just after its prefill (allocated = committed, unaligned) at each page size, the reserve
    odd, where an unaligned nxt shows; then one whose drafts already cover the reserve (nxt = cur)."""
    first = [{"reqs": [(5, 5)], "page_size": page, "reserve": 4, "topk": 1, "penalty": False, "mirrorless": True,
              "row_width": 4096, "decode_batch_idx": 0} for page in PAGE_SIZES]
    # then the row-width assertion at its bound: nxt 12 in a row of 12 fits, of 11 does not (page 4, topk 2); and
    # a row too narrow at each page size and topk (unset, 1, 2: the assertion is for page > 1 and topk > 1 only)
    bound = [{"reqs": [(3, 8), (6, 6)], "page_size": 4, "reserve": 6, "topk": 2, "penalty": True,
              "mirrorless": False, "row_width": width, "decode_batch_idx": 2} for width in (12, 11)]
    return first + bound + [{**bound[1], "page_size": page, "topk": topk, "row_width": 4}
                            for page in PAGE_SIZES for topk in (None, 1, 2)]


def prepare(ctx: Context) -> None:
    """Point the function's allocation calls at recorders; load the release's `alloc_for_spec_decode` (0.5.16+) and
    `page_aligned_decode_alloc_lens` (0.5.19+) where it has them."""
    fn = ctx.up.eagle_prepare_for_decode
    module = fn.__globals__
    # 0.5.19 on: the mirror-less batch publishes the host-side max of the allocated lengths (NPU sizing)
    ctx.state["publishes_host_max"] = "max_seq_len_host" in ctx.source.file(EAGLE_UTILS).read_text()
    calls: list[int] = []
    ctx.state["calls"] = calls

    def extend(tree_cache: Any, cur: Any, cur_cpu: Any, nxt: Any, nxt_cpu: Any, last_loc: Any, num_tokens: int,
               **kwargs: Any) -> Any:
        calls.append(int(num_tokens))
        return None

    def tokens(tree_cache: Any, num_tokens: int, *args: Any) -> Any:
        calls.append(int(num_tokens))
        return None

    recorders = {"ALLOC_EXTEND_FUNCS": _Any(extend), "alloc_token_slots": tokens,
                 "get_last_loc": lambda *args: None, "get_alloc_reserve_per_decode": lambda *a: NOW["reserve"]}
    for name in ("alloc_for_spec_decode", "page_aligned_decode_alloc_lens"):
        where = ALLOCATION if name == "alloc_for_spec_decode" else SIZING
        if name in names_in(ctx.source.file(EAGLE_UTILS)) and ctx.source.has(where):
            if name not in names_in(ctx.source.file(where)):
                raise ConfigError(f"{where}:{name}", "a definition", f"absent in {ctx.source.label}")
            module[name] = getattr(load_definitions(ctx.source.file(where), [name], where=where, modules=MODULES,
                                                    version=ctx.source.label), name)
            if name == "alloc_for_spec_decode":
                module[name].__globals__.update(recorders, assign_req_to_token_pool_func=_assign,
                                                _device_type=lambda batch: "cpu")
    module.update(recorders)


class _Any(dict):
    """`ALLOC_EXTEND_FUNCS`: the one recorder for every device type."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: str) -> Any:
        return self.fn


def _batch(case: dict[str, Any]) -> SimpleNamespace:
    import torch

    reqs = [SimpleNamespace(kv_allocated_len=a, kv_committed_len=c, decode_batch_idx=case["decode_batch_idx"],
                            kv=SimpleNamespace(kv_allocated_len=a, kv_committed_len=c)) for c, a in case["reqs"]]
    return SimpleNamespace(
        reqs=reqs, batch_size=lambda: len(reqs), maybe_evict_swa=lambda: None, device="cpu",
        sampling_info=SimpleNamespace(penalizer_orchestrator=SimpleNamespace(is_required=case["penalty"])),
        cumulate_penalty_output_tokens=lambda: None, seq_lens_cpu=None if case["mirrorless"] else [],
        token_to_kv_pool_allocator=SimpleNamespace(page_size=case["page_size"]),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros((1, case["row_width"]), dtype=torch.int32)),
        req_pool_indices=torch.zeros(len(reqs), dtype=torch.int64), tree_cache=SimpleNamespace(
            token_to_kv_pool_allocator=SimpleNamespace(page_size=case["page_size"])),
        hisparse_coordinator=None)


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    NOW.update(topk=case["topk"], reserve=case["reserve"])
    calls = ctx.state["calls"]
    calls.clear()
    batch = _batch(case)
    seen: dict[str, Any] = {}
    module = ctx.up.eagle_prepare_for_decode.__globals__
    inner = module.get("alloc_for_spec_decode")
    if callable(inner) and hasattr(inner, "__globals__"):  # 0.5.16+: record its lengths, then run it
        def recorded(*args: Any, **kw: Any) -> None:
            seen.update(cur=kw["cur_kv_lens_cpu"].tolist(), nxt=kw["nxt_kv_lens_cpu"].tolist(),
                        needed=int(kw["num_needed_tokens"]))
            inner(*args, **kw)
        module["alloc_for_spec_decode"] = recorded
        try:
            if not _run(ctx, batch):
                return {"row_overflow": True}
        finally:
            module["alloc_for_spec_decode"] = inner
        return {"lens": [list(p) for p in zip(seen["cur"], seen["nxt"])], "needed": seen["needed"],
                "asked": list(calls), "kv_allocated_len": [r.kv.kv_allocated_len for r in batch.reqs],
                **_batch_answer(batch)}
    # 0.5.15: the function records nxt itself (the requests' own kv_allocated_len); cur is what it read
    if not _run(ctx, batch):
        return {"row_overflow": True}
    after = [r.kv_allocated_len for r in batch.reqs]
    return {"lens": [[a, n] for (_, a), n in zip(case["reqs"], after)], "needed": sum(calls), "asked": list(calls),
            "kv_allocated_len": after, **_batch_answer(batch)}


def _run(ctx: Context, batch: SimpleNamespace) -> bool:
    """Run the step; False when its row-width assertion refused the allocation."""
    try:
        ctx.up.eagle_prepare_for_decode(batch)
    except AssertionError as exc:
        if OVERFLOW not in str(exc):
            raise
        return False
    return True


def _batch_answer(batch: SimpleNamespace) -> dict[str, Any]:
    return {"decode_batch_idx": [r.decode_batch_idx for r in batch.reqs],
            "max_seq_len_host": getattr(batch, "max_seq_len_host", None)}


def model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    reqs = [SimpleNamespace(kv_allocated_len=a, kv_committed_len=c) for c, a in case["reqs"]]
    cur, nxt, needed = page_aligned_decode_alloc_lens(reqs, case["reserve"], case["page_size"],
                                                      ctx.variant.page_aligned_nxt)
    if not row_fits(nxt, case["page_size"], case["topk"], case["row_width"]):
        return {"row_overflow": True}
    asked = [needed] if needed or not _skips_empty(ctx) else []
    host_max = max(cur) if case["mirrorless"] and ctx.state["publishes_host_max"] else None
    return {"lens": [list(p) for p in zip(cur, nxt)], "needed": needed, "asked": asked,
            "kv_allocated_len": [max(c, n) for c, n in zip(cur, nxt)],
            "decode_batch_idx": [case["decode_batch_idx"] + 1] * len(cur),
            "max_seq_len_host": host_max}


def _skips_empty(ctx: Context) -> bool:
    """0.5.16 on: `alloc_for_spec_decode` makes no allocation call for 0 tokens (0.5.15 asks for 0)."""
    return "alloc_for_spec_decode" in names_in(ctx.source.file(EAGLE_UTILS))


def whole_pages(ctx: Context, case: dict[str, Any], answer: Any) -> None:
    """#31616: every request the step allocates for records a page-aligned kv_allocated_len."""
    page = case["page_size"]
    if "lens" not in answer:  # the row-width assertion refused the step: nothing allocated
        return
    bad = [(cur, nxt, after) for (cur, nxt), after in zip(answer["lens"], answer["kv_allocated_len"])
           if nxt > cur and after % page]
    if bad:
        raise PropertyViolation(f"page_size {page}: (cur, nxt, kv_allocated_len) {bad}: the allocator hands out "
                                f"whole pages, so {sum(-a % page for *_, a in bad)} slots are allocated and "
                                f"recorded by nobody")


ALLOC_LENS = Differential(
    prepare=prepare, loading=lambda upstream, up: {"modules": MODULES}, inputs=lambda ctx: cases(), pinned=pinned,
    model=model, upstream=upstream, checks=(Check("kv_allocated_whole_pages", whole_pages),),
    note=lambda ctx: f"model variant {ctx.variant.name}")
