"""SGLang's staging ring (`StagingAllocator`) and prefill write gate (`is_watermark_ready`) against `pd-staging`.

* `LOCKSTEP` (`StagingAllocator`): upstream's class and the model's `StagingAllocator` driven by one state
  machine (assign any size, free a live id, free an unknown id); after every step every observable is
  compared: what `assign` returns (alloc_id, offset, round, or None), the watermark, head and round, the live
  ids in order, `get_offset` and `get_ptr` of each live id (and `get_round`, 0.5.13-0.5.18), `get_base_ptr`,
  `get_total_size`, the buffer the ring was built with, and for every live allocation whether upstream's
  `is_watermark_ready` (given this ring's watermark) lets prefill write it.
* `GATE` (`is_watermark_ready`): exhaustive over a small domain, a session with no watermark received included.

Conventions: upstream's `StagingBuffer` (a device allocation) is a stand-in at address `BASE_PTR` that records
the arguments it was made with (the model's ring is a buffer of `total` bytes on the ring's device; a pointer is
the base plus the offset); a free of an unknown id is a no-op upstream and refused by the model (only upstream
is stepped); `is_watermark_ready` reads the watermark from `staging_state.remote_watermarks[session]` (a
stand-in holding the ring's watermark, or nothing: the model's prefill starts from watermark (0, 0)).

Survivors (documented in the declaration): the arguments of `_device_ptr_type_str` swapped in
`StagingAllocator.__init__` (they make a log line's text, the same off XPU); `alloc_round <= 0` made `< 0` in
`is_watermark_ready` (round 0 is then ready through `-1 < wm_round`, and no watermark round is negative).
A regression of the issue's shape (the watermark advance in `free` written `if` instead of `while`) is a
divergence with a shrunk program: upstream's KeyError is its answer (`tests/conform/sglang/test_conform_ring.py`).

Release -> model variant (the declaration's table): before 0.5.19 `fixed` (05c7ebf: a free that empties the
ring keeps the stale head); 0.5.19 and later, and a tree with no version, `sglang_0_5_23` (SGLang #37166: a free
that empties the ring starts a fresh round at offset 0). The note names the variant and how many frees emptied
the ring, the steps where the two behaviours differ.
"""

from __future__ import annotations

from itertools import product
from types import SimpleNamespace
from typing import Any, Iterator

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Lockstep, Operation, Sweep
from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging.ring import StagingAllocator, is_watermark_ready

RELPATH = "sglang/srt/disaggregation/common/staging_buffer.py"
HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
SESSION = "s"


BASE_PTR, DEVICE, GPU_ID = 1 << 20, "cpu", 3  # the stand-in buffer's address, and what the ring is built with
NO_WATERMARK = (0, 0)  # the model's remote watermark before any WATERMARK message (`system.PdStaging`'s start)


class StagingBufferStandIn:
    """What `StagingAllocator.__init__` reads of its device buffer (its address at `BASE_PTR`, its device), and
    the arguments it was made with (`made`)."""

    def __init__(self, size_bytes: int, device: Any, gpu_id: Any, custom_mem_pool: Any = None) -> None:
        self.data_ptr, self.device = BASE_PTR, SimpleNamespace(type=DEVICE)
        self.made = {"size_bytes": size_bytes, "device": device, "gpu_id": gpu_id, "custom_mem_pool": custom_mem_pool}


def upstream_ready(gate: Any, watermark: tuple[int, int] | None, alloc_round: int, end: int) -> bool:
    """Upstream's gate; `watermark` None: no WATERMARK of the session received yet (absent from the table)."""
    known = {} if watermark is None else {SESSION: tuple(watermark)}
    return bool(gate(SimpleNamespace(remote_watermarks=known), SESSION, alloc_round, end))


class UpstreamRing:
    def __init__(self, ctx: Context, total: int) -> None:
        self.ring, self.gate = ctx.up.StagingAllocator(total, DEVICE, GPU_ID), ctx.up.is_watermark_ready
        self.rounds = ctx.state["get_round"]

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
        seen = {"watermark": list(wm), "head": ring.head, "round": ring.round, "live": live,
                "offsets": [ring.get_offset(i) for i in live], "pointers": [ring.get_ptr(i) for i in live],
                "ready": [upstream_ready(self.gate, wm, ring.allocations[i][2],
                                         ring.allocations[i][0] + ring.allocations[i][1]) for i in live],
                "base_ptr": ring.get_base_ptr(), "total_size": ring.get_total_size(), "buffer": ring.buffer.made}
        if self.rounds:  # before 0.5.19
            seen["rounds"] = [ring.get_round(i) for i in live]
        return seen


class ModelRing:
    def __init__(self, ctx: Context, total: int) -> None:
        self.ctx, self.ring = ctx, StagingAllocator(total)
        self.buffer = {"size_bytes": total, "device": DEVICE, "gpu_id": GPU_ID, "custom_mem_pool": None}

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
        seen = {"watermark": list(ring.watermark), "head": ring.head, "round": ring.round,
                "live": list(ring.live_ids), "offsets": [a.offset for a in ring.allocations],
                "pointers": [BASE_PTR + a.offset for a in ring.allocations],
                "ready": [ring.ready(a) for a in ring.allocations],
                "base_ptr": BASE_PTR, "total_size": ring.total, "buffer": self.buffer}
        if self.ctx.state["get_round"]:
            seen["rounds"] = [a.round for a in ring.allocations]
        return seen


def live_pick(view: ModelRing) -> Any:
    live = view.ring.live_ids
    return st.sampled_from(live) if live else None


def unknown_id(view: ModelRing) -> Any:
    live = set(view.ring.live_ids)
    return st.integers(0, 60).filter(lambda i: i not in live)


def ring_note(ctx: Context) -> str:
    rule = "a fresh round (#37166)" if ctx.variant.fresh_round_when_empty else "the stale head (05c7ebf)"
    return f"model variant {ctx.variant.name}; {ctx.counts.get('emptied', 0)} frees emptied the ring: {rule}"


RING_METHODS = ("assign", "free", "get_watermark", "get_ptr", "get_offset", "get_base_ptr", "get_total_size")


def check_ring(ctx: Context) -> None:
    for name in RING_METHODS:
        if not callable(getattr(ctx.up.StagingAllocator, name, None)):
            raise ConfigError(f"{RELPATH}:StagingAllocator.{name}", "a method", f"absent in {ctx.source.label}")
    ctx.state["get_round"] = callable(getattr(ctx.up.StagingAllocator, "get_round", None))  # 0.5.13-0.5.18


LOCKSTEP = Lockstep(
    loading=lambda upstream, up: {"extra_globals": {"StagingBuffer": StagingBufferStandIn}}
    if upstream.file == RELPATH else {},
    prepare=check_ring,
    start=lambda ctx: st.fixed_dictionaries({"total": st.integers(1, 40)}),
    sides=lambda ctx, config: (ModelRing(ctx, config["total"]), UpstreamRing(ctx, config["total"])),
    operations=(Operation("assign", st.integers(1, 44)), Operation("free", live_pick),
                Operation("free_unknown", unknown_id)),
    steps=30, note=ring_note)


ROUNDS, ENDS = range(0, 6), range(0, 9)  # rounds 0..5; ends and watermark tails 0..8
WATERMARKS = (None,) + tuple(product(ROUNDS, ENDS))  # None: the session's watermark not received yet


def gate_cases(ctx: Context) -> Iterator[dict[str, Any]]:
    for r, e, wm in product(ROUNDS, ENDS, WATERMARKS):
        yield {"alloc_round": r, "end": e, "watermark": None if wm is None else list(wm)}


GATE = Sweep(
    domain=gate_cases,
    model=lambda ctx, c: is_watermark_ready(c["alloc_round"], c["end"],
                                            NO_WATERMARK if c["watermark"] is None else tuple(c["watermark"])),
    upstream=lambda ctx, c: upstream_ready(ctx.up.is_watermark_ready, c["watermark"], c["alloc_round"], c["end"]),
    note=lambda ctx: "exhaustive: rounds 0..5, ends and watermark tails 0..8, and no watermark received yet")

