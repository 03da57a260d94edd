"""vLLM #50297 on the real `Scheduler` through `kvsim conform vllm` (target `pd_preemption_race`): the race of
`real_scheduler.race` (a producer preempted while its final prefill step is in flight) on the release imported in
its child, the model's invariant `finished_into_producer_owns_blocks` (`owns_blocks`) run on what the release's
`request_finished` got.

The differential: the `kv-cache-manager-pd` model on the release's variant (`pre_50297` before 0.27.0, else
`fixed`), along its own path to the race, against the release: how many blocks the producer handed and whether the
invariant holds. The check: the invariant on the release's hand-off; it fails on 0.26.0 (the expected pre-fix
verdict, read by `kvsim.conform.releases`) and holds on 0.27.0 and later.
"""

from __future__ import annotations

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


def model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    from kvsim.engine.system import run_actions
    from kvsim.models.kv_cache_manager import PD_DESCRIPTOR
    from kvsim.models.kv_cache_manager.scheduler import Decode, Output, Preempt, Schedule

    variant = variant_for(PD_RELEASES, ctx.source.version)
    system = PD_DESCRIPTOR.build_system(variant)
    path = [Schedule(0), Schedule(1), Output(1), Preempt(0), Output(0)]  # P is request 0, L is 1
    if variant == "fixed":  # L finishes, P is recomputed and hands its block
        path += [Decode(1), Output(1), Schedule(0), Output(0)]
    last = run_actions(system, path)[-1]
    (invariant,) = [i for i in system.invariants if i.name == PROPERTY]
    return {"handed_blocks": len(last.requests[0].handed), "owns_blocks": invariant.check(last) is None}


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    got = race(ctx.child, **case)
    ctx.state["race"] = got
    ((_, blocks, _),) = got["handed"]
    return {"handed_blocks": len(blocks), "owns_blocks": not got["problems"]}


def problems_sweep(case: dict[str, Any], model: Callable, upstream: Callable, prop: str, key: str,
                   note: Callable[[Context], str], more: tuple[tuple, tuple] = ((), ())) -> Sweep:
    """A real-scheduler target of one `case`: the model against `upstream`, which keeps the release's run under
    `ctx.state[key]`, and the property `prop` failing with that run's model-check `problems` (`pd_mtp` too);
    `more`: further cases, and the checks that read them (`prop` is `case`'s alone)."""
    def check(ctx: Context, seen: dict[str, Any], answer: dict[str, Any]) -> None:
        problems = ctx.state[key]["problems"]
        if seen == case and problems:
            raise PropertyViolation("; ".join(problems))

    cases, checks = more
    return Sweep(installed=DRIVER, domain=lambda ctx: [case, *cases], model=model, upstream=upstream,
                 checks=(Check(prop, check), *checks), note=note)


PD_RACE = problems_sweep(
    RACE, model, upstream, PROPERTY, "race",
    lambda ctx: f"model variant {variant_for(PD_RELEASES, ctx.source.version)}; the race of real_scheduler.race (a "
                "producer preempted while its final step is in flight)")
