"""vLLM #50297 on the real `Scheduler` through `kvsim conform vllm` (target `pd_preemption_race`): the race of
`real_scheduler.race` (a producer preempted while its final prefill step is in flight) on the release imported in
its child, the model's invariant `finished_into_producer_owns_blocks` (`owns_blocks`) run on what the release's
`request_finished` got.

The differential: the `kv-cache-manager-pd` model on the release's variant (`pre_50297` before 0.27.0, else
`fixed`), along its own path to the race, against the release, on each shape of `races()`: how many blocks the
producer handed, whether the invariant holds, and the tokens each step scheduled for the producer (its recompute
after the preemption, from the hit its freed blocks left cached). The check: the invariant on the release's hand-off; it fails on 0.26.0 (the expected pre-fix
verdict, read by `kvsim.conform.releases`) and holds on 0.27.0 and later.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from kvsim.engine.conformance.adapters import Check, Context, Sweep
from kvsim.engine.conformance.declare import variant_for
from kvsim.engine.errors import PropertyViolation

from .real_scheduler import race

DRIVER = "kvsim.conform.vllm.real_scheduler:SchedulerDriver"
PROPERTY = "finished_into_producer_owns_blocks"
# the model variant each release follows (#50297 landed in 0.27.0)
PD_RELEASES: tuple[tuple[str | None, str], ...] = ((None, "pre_50297"), ("0.27.0", "fixed"))
RACE = {"num_blocks": 3, "block_size": 2, "prompt_len": 2, "max_tokens": 2}  # the model's default configuration
# the same race on more shapes (each a pool one block short of L's next step): prompts of two blocks (P's recompute
# hits the block its preemption freed and left cached, unless L's decode took it), blocks of one token, L sampling
# three tokens; smallest first. The CI profile runs these; KVSIM_PROFILE=dev adds `DEV_RACES`.
RACES = (RACE, {**RACE, "prompt_len": 4, "num_blocks": 5}, {**RACE, "block_size": 1, "num_blocks": 5})
DEV_RACES = ({**RACE, "max_tokens": 3}, {**RACE, "prompt_len": 4, "num_blocks": 5, "max_tokens": 3},
             {**RACE, "block_size": 1, "num_blocks": 5, "max_tokens": 3})


def races() -> tuple[dict[str, Any], ...]:
    return RACES + (DEV_RACES if os.environ.get("KVSIM_PROFILE") == "dev" else ())


def model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    from kvsim.models.kv_cache_manager import PD_DESCRIPTOR
    from kvsim.models.kv_cache_manager.scheduler import Allocated, Decode, Output, Preempt, Schedule

    variant = variant_for(PD_RELEASES, ctx.source.version)
    system = PD_DESCRIPTOR.build_system(variant, dict(case))
    path = [Schedule(0), Schedule(1), Output(1), Preempt(0), Output(0)]  # P is request 0, L is 1
    if variant == "fixed":  # L decodes to its end (P waits: no block is free), P is recomputed and hands its blocks
        path += [Decode(1), Output(1)] * (case["max_tokens"] - 1) + [Schedule(0), Output(0)]
    state, scheduled = next(iter(system.initial_states())), []
    for action in path:
        computed = state.requests[0].num_computed_tokens
        state, effects = system.transition(state, action)
        scheduled += [state.requests[0].num_computed_tokens - computed - len(e.hit_blocks) * case["block_size"]
                      for e in effects if isinstance(e, Allocated) and e.req == 0]
    (invariant,) = [i for i in system.invariants if i.name == PROPERTY]
    return {"handed_blocks": len(state.requests[0].handed), "owns_blocks": invariant.check(state) is None,
            "scheduled": scheduled}


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    got = race(ctx.child, **case)
    keep(ctx, "race", case, got)
    ((_, blocks, _),) = got["handed"]
    return {"handed_blocks": len(blocks), "owns_blocks": not got["problems"], "scheduled": got["scheduled"]}


def keep(ctx: Context, key: str, case: dict[str, Any], got: dict[str, Any]) -> None:
    """Keep the release's run of `case` under `ctx.state[key]`, for the checks that read it."""
    ctx.state.setdefault(key, {})[json.dumps(case, sort_keys=True)] = got


def kept(ctx: Context, key: str, case: dict[str, Any]) -> dict[str, Any]:
    return ctx.state[key][json.dumps(case, sort_keys=True)]


def problems_sweep(cases: Callable[[], tuple[dict[str, Any], ...]], model: Callable, upstream: Callable, prop: str,
                   key: str, note: Callable[[Context], str], judged: Callable[[dict[str, Any]], bool] = lambda c: True,
                   more: tuple[Check, ...] = ()) -> Sweep:
    """A real-scheduler target over `cases()` (smallest first): the model against `upstream`, which keeps the
    release's run of each case (`keep`), and the property `prop` failing with a run's model-check `problems` on the
    cases `judged` says it judges (`pd_mtp` too); `more`: further checks."""
    def check(ctx: Context, seen: dict[str, Any], answer: dict[str, Any]) -> None:
        problems = kept(ctx, key, seen)["problems"]
        if judged(seen) and problems:
            raise PropertyViolation("; ".join(problems))

    return Sweep(installed=DRIVER, domain=lambda ctx: list(cases()), model=model, upstream=upstream,
                 checks=(Check(prop, check), *more), note=note)


PD_RACE = problems_sweep(
    races, model, upstream, PROPERTY, "race",
    lambda ctx: f"model variant {variant_for(PD_RELEASES, ctx.source.version)}; the race of real_scheduler.race (a "
                f"producer preempted while its final step is in flight) on {len(races())} shapes")
