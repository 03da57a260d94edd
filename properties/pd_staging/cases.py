"""The inputs of the pd-staging properties and their pinned upstream cases (no Hypothesis here).

Research note ../shared/research/sglang.md, sections 1.1, 2.3, 2.8 and 2.9 (SGLang 05c7ebf, PR #30545).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.engine.errors import check_int, require
from kvsim.engine.system import Sometimes
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_staging import plan
from kvsim.models.pd_staging import ring as ring_model
from kvsim.models.pd_staging.layout import HeadReshard
from kvsim.models.pd_staging.plan import RoomPlan, StagingPlanConfig, cdiv
from kvsim.models.pd_staging.variants import StagingVariant


@dataclass(frozen=True)
class PlanCase:
    """One room's send plan: its geometry, the prefill radix hit, and whether the early send runs."""

    prompt_len: int
    decode_prefix_len: int
    page_size: int
    chunked_prefill_size: int | None
    prefill_hit: int = 0
    host_hit_length: int = 0
    early_send: bool = False

    @property
    def cfg(self) -> StagingPlanConfig:
        return StagingPlanConfig(self.prompt_len, self.decode_prefix_len, self.page_size, self.chunked_prefill_size)

    def plan(self, variant: StagingVariant) -> RoomPlan:
        return plan.plan_room_sends(self.cfg, self.prefill_hit, self.host_hit_length, self.early_send, variant)


# Section 2.9, shared setup ps=16, cps=256, L=1000: A (prefill hit 608) and B (decode hit 512).
SCENARIO_A = PlanCase(1000, 0, 16, 256, prefill_hit=608)
SCENARIO_B = PlanCase(1000, 512, 16, 256)
SCENARIO_D = PlanCase(1000, 500, 16, 256)  # non-aligned decode prefix
SCENARIO_A_EARLY = PlanCase(1000, 0, 16, 256, prefill_hit=608, early_send=True)
PINNED = (SCENARIO_A, SCENARIO_B, SCENARIO_A_EARLY)

LLAMA_31_8B = HeadReshard(total_kv_heads=8, prefill_tp=4, decode_tp=2)  # section 2.3 and 2.8


@dataclass(frozen=True)
class StagedCase:
    """A room's send plan written through the staging path of decode rank 0: TP sizes and KV geometry."""

    room: PlanCase
    reshard: HeadReshard
    num_layers: int = 1
    head_bytes: int = 2


STAGED_A_DOWN = StagedCase(SCENARIO_A, LLAMA_31_8B)  # prefill TP 4 -> decode TP 2: the multi-slot send is refused
STAGED_A_UP = StagedCase(SCENARIO_A, HeadReshard(8, 1, 4))  # prefill TP 1 -> decode TP 4: it fits and overruns


@dataclass(frozen=True)
class LayoutCase:
    cfg: HeadReshard
    decode_rank: int
    tokens: int
    num_layers: int
    head_bytes: int


LLAMA_LAYOUT = LayoutCase(LLAMA_31_8B, 0, 256, 32, 256)  # 256 tokens, 32 layers, head_dim 128 in bf16


@dataclass(frozen=True)
class RingCase:
    total: int
    ops: tuple[tuple[str, int], ...]


# #37166's 100-byte example: free [0, 60), then 70 bytes wrap to round 1 (a liveness hazard, not a safety one).
STALE_HEAD = RingCase(100, (("assign", 60), ("free", 0), ("assign", 70)))
OVERCOMMIT = RingCase(100, (("assign", 60), ("assign", 30), ("assign", 50), ("free", 1), ("free", 0)))


@dataclass(frozen=True)
class StatusTrace:
    """A room's status (None: absent) and a sequence of `update_status` calls under one rule."""

    rule: str
    start: KVPoll | None
    updates: tuple[KVPoll, ...]


# Section 1.1: a stale Transferring after Failed, and a stale Success after clear().
FAILED_THEN_STALE = StatusTrace("mori", KVPoll.Transferring, (KVPoll.Failed, KVPoll.Transferring))
STALE_AFTER_CLEAR = StatusTrace("mori", None, (KVPoll.Success,))

DTYPES = ("float16", "uint8", "float32")


@dataclass(frozen=True)
class TransferCase:
    """One room moved from every prefill rank to every decode rank: plan, TP sizes, KV shape, pools, timing."""

    room: PlanCase
    reshard: HeadReshard
    num_layers: int = 1
    head_dim: int = 2
    dtype: str = "float16"
    spare_pages: int = 2  # pages of other requests in each pool (their bytes must survive)
    deferred_scatter: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.room, PlanCase), "room", "a PlanCase", type(self.room).__name__)
        require(isinstance(self.reshard, HeadReshard), "reshard", "a HeadReshard", type(self.reshard).__name__)
        check_int(self.num_layers, "num_layers", minimum=1)
        check_int(self.head_dim, "head_dim", minimum=1)
        require(self.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}", self.dtype)
        check_int(self.spare_pages, "spare_pages", minimum=0)
        require(isinstance(self.deferred_scatter, bool), "deferred_scatter", "a bool", self.deferred_scatter)
        check_int(self.seed, "seed", minimum=0)

    @property
    def head_bytes(self) -> int:
        return self.head_dim * np.dtype(self.dtype).itemsize

    @property
    def request_pages(self) -> int:
        return cdiv(self.room.prompt_len, self.room.page_size)


# Upstream's accuracy test (section 2.8): Llama-3.1-8B KV heads, prefill TP 4 -> decode TP 2, chunked prefill
# 256, page 16 (section 2.9's setup), the second request of a ~900-token shared prefix. Two layers of head_dim
# 128 in a 2-byte dtype keep it fast; the layout does not depend on the layer count.
def llama_case(decode_prefix: int, prefill_hit: int, early: bool = True, deferred: bool = False) -> TransferCase:
    return TransferCase(PlanCase(1000, decode_prefix, 16, 256, prefill_hit, 0, early), LLAMA_31_8B, 2, 128,
                        "float16", 2, deferred)


LLAMA_COLD = llama_case(0, 0)
LLAMA_PREFILL_HIT = llama_case(0, 896)  # the prefix crosses three grid lines: 0, 256, 512, 768 | 896
LLAMA_DECODE_HIT = llama_case(896, 896)  # both sides cached the shared prefix
LLAMA_CASES = (LLAMA_COLD, LLAMA_PREFILL_HIT, LLAMA_DECODE_HIT)


# -- what some drawn room or ring must be (`sometimes`: a strategy that never draws these corners checks nothing there)

def _decode_prefix(case: PlanCase) -> bool:
    return case.decode_prefix_len > 0


def _prefill_hit(case: PlanCase) -> bool:
    return case.prefill_hit > 0


def _unchunked(case: PlanCase) -> bool:
    return case.chunked_prefill_size is None or case.chunked_prefill_size < 0


def _early_send(case: PlanCase) -> bool:
    return case.early_send


# the strategy of the send-plan properties (`PLAN_CASES`): section 2.9's scenarios A (a prefill radix hit) and B (a
# decode prefix), chunking off, the early send
PLAN_SOMETIMES = (
    Sometimes("a_decode_prefix", _decode_prefix, "the decode holds a page-aligned prefix (scenario B)"),
    Sometimes("a_prefill_radix_hit", _prefill_hit, "the prefill's radix cache hits whole pages (scenario A)"),
    Sometimes("chunking_off", _unchunked, "chunked prefill disabled: one page a slot"),
    Sometimes("an_early_send", _early_send, "the early send runs before the prefill ends"),
)


def _ring_steps(case: RingCase) -> list[ring_model.RingStep]:
    return ring_model.apply_ring_ops(ring_model.StagingAllocator(case.total), case.ops)


def _wraps(case: RingCase) -> bool:
    return any(step.ring.round > 0 for step in _ring_steps(case))


def _oversized(case: RingCase) -> bool:
    return any(step.op == "assign" and step.alloc is None for step in _ring_steps(case))


def _rounds_overlap(case: RingCase) -> bool:
    return any(a.round != b.round and a.offset < b.end and b.offset < a.end
               for step in _ring_steps(case) for a in step.ring.allocations for b in step.ring.allocations)


# the strategy of the ring properties (`RING_CASES`): the overcommit the watermark must guard
RING_SOMETIMES = (
    Sometimes("the_ring_wraps", _wraps, "an allocation goes to round 1 or later"),
    Sometimes("an_oversized_assign", _oversized, "an assign larger than the ring (ALLOC_OVERSIZED)"),
    Sometimes("live_rounds_overlap", _rounds_overlap,
              "a live allocation overlaps a live one of another round (the overcommit the watermark guards)"),
)
