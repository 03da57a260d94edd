"""SGLang staging ring (`StagingAllocator`) and prefill write gate (`is_watermark_ready`) against `pd-staging`.

`StagingAllocator`: upstream's class and the model's `StagingAllocator` driven in lockstep by one
Hypothesis state machine (assign any size, free a live id, free an unknown id); after every step
every observable is compared: the (alloc_id, offset, round) `assign` returns (or None), the
watermark, head and round, the live ids in order, `get_offset` of each live id, and for every live
allocation whether upstream's `is_watermark_ready` (given this ring's watermark) lets prefill write it.
`is_watermark_ready` is also compared on its own over a small exhaustive domain.

Conventions: upstream's `StagingBuffer` (a device allocation) is a stand-in with pointer 0 (only
offsets are compared); a free of an unknown id is a no-op upstream and refused by the model (not
compared: only upstream is stepped); `is_watermark_ready` reads the watermark from
`staging_state.remote_watermarks[session]` (a stand-in holding the ring's watermark).

Release -> model variant (`release_variant`): before 0.5.19 `fixed` (05c7ebf: a free that empties
the ring keeps the stale head); 0.5.19 and later, and a tree with no version, `sglang_0_5_23` (SGLang
#37166: a free that empties the ring starts a fresh round at offset 0). The note names the variant
and how many frees emptied the ring, the steps where the two behaviours differ.
"""

from __future__ import annotations

import re
import time
from itertools import product
from types import SimpleNamespace
from typing import Any

from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging.ring import StagingAllocator, is_watermark_ready
from kvsim.models.pd_staging.variants import VARIANTS, StagingVariant

from ..loader import load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult

RELPATH = "sglang/srt/disaggregation/common/staging_buffer.py"
HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
FRESH_ROUND_SINCE = (0, 5, 19)  # SGLang #37166: the first release whose free starts a fresh round on an empty ring
SESSION = "s"


def release_variant(version: str | None) -> StagingVariant:
    """The pd-staging variant whose ring a release follows (no version: a working tree, the newest)."""
    if not version:
        return VARIANTS["sglang_0_5_23"]
    nums = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    return VARIANTS["sglang_0_5_23"] if nums >= FRESH_ROUND_SINCE else VARIANTS.fixed


class StagingBufferStandIn:
    """What `StagingAllocator.__init__` reads of its device buffer."""

    def __init__(self, size_bytes: int, *args: Any, **kwargs: Any) -> None:
        self.data_ptr, self.device = 0, SimpleNamespace(type="cpu")


def load(source: EngineSource) -> tuple[type, Any]:
    ring = load_definitions(source.file(RELPATH), ["StagingAllocator"], where=RELPATH, version=source.label,
                            extra_globals={"StagingBuffer": StagingBufferStandIn}).StagingAllocator
    gate = load_definitions(source.file(HANDLER), ["is_watermark_ready"], where=HANDLER,
                            version=source.label).is_watermark_ready
    for name in ("assign", "free", "get_watermark", "get_offset"):
        if not callable(getattr(ring, name, None)):
            raise ConfigError(f"{RELPATH}:StagingAllocator.{name}", "a method", f"absent in {source.label}")
    return ring, gate


def upstream_ready(gate: Any, watermark: tuple[int, int], alloc_round: int, end: int) -> bool:
    return bool(gate(SimpleNamespace(remote_watermarks={SESSION: tuple(watermark)}), SESSION, alloc_round, end))


def observe_upstream(ring: Any, gate: Any) -> dict[str, Any]:
    live = [i for i in ring.alloc_order if i in ring.allocations]
    wm = tuple(ring.get_watermark())
    return {"watermark": list(wm), "head": ring.head, "round": ring.round, "live": live,
            "offsets": [ring.get_offset(i) for i in live],
            "ready": [upstream_ready(gate, wm, ring.allocations[i][2], ring.allocations[i][0] + ring.allocations[i][1])
                      for i in live]}


def observe_model(ring: StagingAllocator) -> dict[str, Any]:
    return {"watermark": list(ring.watermark), "head": ring.head, "round": ring.round, "live": list(ring.live_ids),
            "offsets": [a.offset for a in ring.allocations], "ready": [ring.ready(a) for a in ring.allocations]}


class Divergence(AssertionError):
    pass


def run_lockstep(source: EngineSource, options: RunOptions) -> TargetResult:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

    started = time.perf_counter()
    cls, gate = load(source)
    result = TargetResult("StagingAllocator", source.version)
    variant = release_variant(source.version)
    emptied = [0]
    program: list[str] = []

    class Lockstep(RuleBasedStateMachine):
        @initialize(total=st.integers(1, 40))
        def start(self, total: int) -> None:
            program.clear()
            program.append(f"StagingAllocator({total})")
            self.total = total
            self.up, self.model = cls(total, "cpu", 0), StagingAllocator(total)
            self.compare()

        def compare(self, extra_up: Any = None, extra_model: Any = None) -> None:
            up, model = observe_upstream(self.up, gate), observe_model(self.model)
            up["returned"], model["returned"] = extra_up, extra_model
            result.compared += 1
            if up != model:
                raise Divergence(f"model variant {variant.name}, after {'; '.join(program)}: model {model} "
                                 f"upstream {up}")

        @rule(size=st.integers(1, 44))
        def assign(self, size: int) -> None:
            program.append(f"assign({size})")
            got = self.up.assign(size)
            alloc, self.model = self.model.assign(size)
            self.compare(list(got) if got is not None else None,
                         [alloc.alloc_id, alloc.offset, alloc.round] if alloc is not None else None)

        @rule(pick=st.integers(0, 7))
        def free(self, pick: int) -> None:
            live = self.model.live_ids
            if not live:
                return
            victim = live[pick % len(live)]
            program.append(f"free({victim})")
            self.up.free(victim)
            self.model = self.model.free(victim, variant)
            emptied[0] += not self.model.allocations  # where #37166 acts (fresh round or stale head)
            self.compare()

        @rule(alloc_id=st.integers(0, 60))
        def free_unknown(self, alloc_id: int) -> None:
            if alloc_id in self.model.live_ids:
                return
            program.append(f"free({alloc_id}) [not live]")
            self.up.free(alloc_id)  # a no-op upstream; the model refuses it, so only upstream steps
            self.compare()

    budget = settings(max_examples=options.max_examples, stateful_step_count=30, database=None, deadline=None,
                      derandomize=options.seed is None, suppress_health_check=list(HealthCheck),
                      phases=(Phase.explicit, Phase.generate, Phase.shrink))
    try:
        run_state_machine_as_test(Lockstep, settings=budget)  # --seed: not derandomized
    except Divergence as exc:
        result.diverge({"program": list(program)}, "see message", "see message", str(exc))
    empty_rule = "a fresh round (#37166)" if variant.fresh_round_when_empty else "the stale head (05c7ebf)"
    result.note = f"model variant {variant.name}; {emptied[0]} frees emptied the ring: {empty_rule}"
    return result.finish(started)


def run_gate(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    _, gate = load(source)
    result = TargetResult("is_watermark_ready", source.version)
    span = range(0, 6)
    for alloc_round, end, wm_round, wm_tail in product(span, range(0, 9), span, range(0, 9)):
        model = is_watermark_ready(alloc_round, end, (wm_round, wm_tail))
        upstream = upstream_ready(gate, (wm_round, wm_tail), alloc_round, end)
        result.compared += 1
        if model != upstream:
            result.diverge({"alloc_round": alloc_round, "end": end, "watermark": [wm_round, wm_tail]}, model, upstream)
    result.note = "exhaustive: rounds 0..5, ends and watermark tails 0..8"
    return result.finish(started)


TARGETS = (
    Target("sglang", "StagingAllocator", RELPATH, ("StagingAllocator",), "pd-staging",
           "ring assign/free in lockstep with the model (one Hypothesis state machine), every observable after "
           "every step", run_lockstep),
    Target("sglang", "is_watermark_ready", HANDLER, ("is_watermark_ready",), "pd-staging",
           "prefill write gate, exhaustive over a small domain", run_gate),
)
