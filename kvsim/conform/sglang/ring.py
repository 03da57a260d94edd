"""SGLang's staging ring (`StagingAllocator`) and prefill write gate (`is_watermark_ready`) against `pd-staging`.

* `LOCKSTEP` (`StagingAllocator`): upstream's class and the model's `StagingAllocator` driven by one state
  machine (assign any size, free a live id, free an unknown id); after every step every observable is
  compared: what `assign` returns (alloc_id, offset, round, or None), the watermark, head and round, the live
  ids in order, `get_offset` of each live id, and for every live allocation whether upstream's
  `is_watermark_ready` (given this ring's watermark) lets prefill write it.
* `GATE` (`is_watermark_ready`): exhaustive over a small domain.

Conventions: upstream's `StagingBuffer` (a device allocation) is a stand-in with pointer 0 (only offsets are
compared); a free of an unknown id is a no-op upstream and refused by the model (only upstream is stepped);
`is_watermark_ready` reads the watermark from `staging_state.remote_watermarks[session]` (a stand-in holding
the ring's watermark).

Release -> model variant (the declaration's table): before 0.5.19 `fixed` (05c7ebf: a free that empties the
ring keeps the stale head); 0.5.19 and later, and a tree with no version, `sglang_0_5_23` (SGLang #37166: a free
that empties the ring starts a fresh round at offset 0). The note names the variant and how many frees emptied
the ring, the steps where the two behaviours differ.
"""

from __future__ import annotations

from itertools import product
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Lockstep, Operation, Sweep
from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging.ring import StagingAllocator, is_watermark_ready

RELPATH = "sglang/srt/disaggregation/common/staging_buffer.py"
HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
SESSION = "s"


class StagingBufferStandIn:
    """What `StagingAllocator.__init__` reads of its device buffer."""

    def __init__(self, size_bytes: int, *args: Any, **kwargs: Any) -> None:
        self.data_ptr, self.device = 0, SimpleNamespace(type="cpu")


def upstream_ready(gate: Any, watermark: tuple[int, int], alloc_round: int, end: int) -> bool:
    return bool(gate(SimpleNamespace(remote_watermarks={SESSION: tuple(watermark)}), SESSION, alloc_round, end))


class UpstreamRing:
    def __init__(self, ctx: Context, total: int) -> None:
        self.ring, self.gate = ctx.up.StagingAllocator(total, "cpu", 0), ctx.up.is_watermark_ready

    def call(self, op: str, args: Any) -> Any:
        if op == "assign":
            got = self.ring.assign(args)
            return None if got is None else {"alloc_id": got[0], "offset": got[1], "round": got[2]}
        self.ring.free(args)  # free and free_unknown
        return None

    def observe(self) -> dict[str, Any]:
        ring = self.ring
        live = [i for i in ring.alloc_order if i in ring.allocations]
        wm = tuple(ring.get_watermark())
        return {"watermark": list(wm), "head": ring.head, "round": ring.round, "live": live,
                "offsets": [ring.get_offset(i) for i in live],
                "ready": [upstream_ready(self.gate, wm, ring.allocations[i][2],
                                         ring.allocations[i][0] + ring.allocations[i][1]) for i in live]}


class ModelRing:
    def __init__(self, ctx: Context, total: int) -> None:
        self.ctx, self.ring = ctx, StagingAllocator(total)

    def call(self, op: str, args: Any) -> Any:
        if op == "assign":
            alloc, self.ring = self.ring.assign(args)
            return None if alloc is None else {"alloc_id": alloc.alloc_id, "offset": alloc.offset,
                                               "round": alloc.round}
        if op == "free":
            self.ring = self.ring.free(args, self.ctx.variant)
            if not self.ring.allocations:
                self.ctx.count("emptied")  # where #37166 acts (a fresh round, or the stale head)
        return None  # free_unknown: the model refuses it, so only upstream steps

    def observe(self) -> dict[str, Any]:
        ring = self.ring
        return {"watermark": list(ring.watermark), "head": ring.head, "round": ring.round,
                "live": list(ring.live_ids), "offsets": [a.offset for a in ring.allocations],
                "ready": [ring.ready(a) for a in ring.allocations]}


def live_pick(view: ModelRing) -> Any:
    live = view.ring.live_ids
    return st.sampled_from(live) if live else None


def unknown_id(view: ModelRing) -> Any:
    live = set(view.ring.live_ids)
    return st.integers(0, 60).filter(lambda i: i not in live)


def ring_note(ctx: Context) -> str:
    rule = "a fresh round (#37166)" if ctx.variant.fresh_round_when_empty else "the stale head (05c7ebf)"
    return f"model variant {ctx.variant.name}; {ctx.counts.get('emptied', 0)} frees emptied the ring: {rule}"


def check_ring(ctx: Context) -> None:
    for name in ("assign", "free", "get_watermark", "get_offset"):
        if not callable(getattr(ctx.up.StagingAllocator, name, None)):
            raise ConfigError(f"{RELPATH}:StagingAllocator.{name}", "a method", f"absent in {ctx.source.label}")


LOCKSTEP = Lockstep(
    loading=lambda upstream, up: {"extra_globals": {"StagingBuffer": StagingBufferStandIn}}
    if upstream.file == RELPATH else {},
    prepare=check_ring,
    start=lambda ctx: st.fixed_dictionaries({"total": st.integers(1, 40)}),
    sides=lambda ctx, config: (ModelRing(ctx, config["total"]), UpstreamRing(ctx, config["total"])),
    operations=(Operation("assign", st.integers(1, 44)), Operation("free", live_pick),
                Operation("free_unknown", unknown_id)),
    steps=30, note=ring_note)


GATE_DOMAIN = (range(0, 6), range(0, 9), range(0, 6), range(0, 9))

GATE = Sweep(
    domain=lambda ctx: ({"alloc_round": r, "end": e, "watermark": [wr, wt]} for r, e, wr, wt in product(*GATE_DOMAIN)),
    model=lambda ctx, c: is_watermark_ready(c["alloc_round"], c["end"], tuple(c["watermark"])),
    upstream=lambda ctx, c: upstream_ready(ctx.up.is_watermark_ready, tuple(c["watermark"]), c["alloc_round"],
                                           c["end"]),
    note=lambda ctx: "exhaustive: rounds 0..5, ends and watermark tails 0..8")


def release_variant(version: str | None) -> Any:
    """(migration bridge, for the send_plan adapter) The pd-staging variant whose ring a release follows."""
    from kvsim.engine.conformance.declare import variant_for
    from kvsim.models.pd_staging.conform import FRESH_ROUND
    from kvsim.models.pd_staging.variants import VARIANTS

    return VARIANTS[variant_for(FRESH_ROUND, version)]
