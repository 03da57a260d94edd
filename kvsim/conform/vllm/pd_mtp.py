"""vLLM #55055 on the real `Scheduler` through `kvsim conform vllm` (target `pd_mtp_draft_kv`): a producer request
(`do_remote_decode`) on a prefill instance whose model has a multi-module MTP drafter of lookahead k, its prompt
handed to the release's own `NixlConnector` (`real_scheduler.SchedulerDriver`, `build(mtp_lookahead=k)`), and the
model's invariant `no_unverified_draft_kv_handed` (`draft_kv_handed`) run on the `num_computed_tokens` the request
had when the connector's `request_finished` got it.

Since 0.31.0 the connector's `on_new_request` truncates the producer's prompt by `_prefill_backoff()`
(`max(Mamba's 1, num_prefill_lookahead_tokens - 1)`), so the decode side recomputes the positions whose MTP-layer KV
embeds unverified drafts; 0.30.0 truncated for Mamba only (`_truncate_mamba_request_for_prefill`), so the producer
computes and hands the whole prompt. The check fails on 0.30.0 (the expected pre-fix verdict, read by
`kvsim.conform.releases`) and holds on 0.31.0 and later.

The differential: the `kv-cache-manager-pd` model on the release's variant (`pre_55055` before 0.31.0, else `fixed`)
in the same configuration (one producer, no local request), along its path to the hand-off (`schedule`, `output`),
against the release: the prompt tokens the producer computed and the invariant's verdict.
"""

from __future__ import annotations

import os
from typing import Any

from kvsim.engine.conformance.adapters import Check, Context
from kvsim.engine.errors import PropertyViolation
from kvsim.engine.conformance.declare import variant_for

from .pd_race import keep, kept, problems_sweep

PROPERTY = "no_unverified_draft_kv_handed"
# the model variant each release follows for #55055's backoff (landed in 0.31.0; 0.32.0 spares a request that skips
# reading the prefix cache from the truncation)
MTP_RELEASES: tuple[tuple[str | None, str], ...] = ((None, "pre_55055"), ("0.31.0", "truncates_skip_reading"),
                                                    ("0.32.0", "fixed"))
# the bug report's configuration (vllm-55055-pd-mtp-draft-kv: lookahead 2), one producer: the drafter's two modules
# make the last prompt position's MTP KV a draft's
HANDOFF = {"num_blocks": 3, "block_size": 2, "prompt_len": 2, "mtp_lookahead": 2}
# a prompt no longer than the backoff (lookahead - 1): no release truncates it, so the fixed ones hand it whole
# (an open-upstream finding, vllm-55055-short-prompt-draft-kv; its property confirms it, the target still conforms)
SHORT = {**HANDOFF, "prompt_len": 1}
SHORT_PROPERTY, SHORT_FINDING = "no_unverified_draft_kv_short_prompt", "vllm-55055-short-prompt-draft-kv"
# more shapes, so the backoff's size and its guard are told apart: a one-module drafter (lookahead 1: no backoff,
# nothing truncated), prompts of 3 tokens under drafters of 2 and 3 modules (a truncation by k - 1 is not a prompt
# cut to k - 1 tokens; a drafter of k modules needs blocks of k tokens or more, the release's own check, and the
# pool room for the whole prompt and its k lookahead slots where the release does not truncate); the two
# above first. The CI profile runs these; KVSIM_PROFILE=dev adds `DEV_HANDOFFS`: a three-module drafter over a
# prompt of 2 (no longer than its backoff: the finding), prompts of 4.
# A producer asking for prompt logprobs last (it skips reading the prefix cache: 0.32.0 on do not truncate it, its
# decode side recomputing the whole prompt; 0.31.0 truncates it as any other), a pool with room for its whole prompt
# and lookahead slots.
HANDOFFS = (HANDOFF, SHORT, {**HANDOFF, "mtp_lookahead": 1}, {**HANDOFF, "num_blocks": 4, "prompt_len": 3},
            {**HANDOFF, "block_size": 4, "prompt_len": 3, "mtp_lookahead": 3},
            {**HANDOFF, "num_blocks": 4, "prompt_len": 3, "prompt_logprobs": 1})
DEV_HANDOFFS = ({**HANDOFF, "block_size": 4, "mtp_lookahead": 3}, {**HANDOFF, "num_blocks": 4, "prompt_len": 4},
                {**HANDOFF, "block_size": 4, "prompt_len": 4, "mtp_lookahead": 3})


def handoffs() -> tuple[dict[str, Any], ...]:
    return HANDOFFS + (DEV_HANDOFFS if os.environ.get("KVSIM_PROFILE") == "dev" else ())


def short(case: dict[str, Any]) -> bool:
    """The prompt is no longer than the fixed backoff (k - 1 for a drafter of k modules): the finding's case."""
    return case["mtp_lookahead"] >= 2 and case["prompt_len"] <= case["mtp_lookahead"] - 1


def handoff(child: Any, num_blocks: int = 3, block_size: int = 2, prompt_len: int = 2,
            mtp_lookahead: int = 2, prompt_logprobs: int = 0, decode_loads: bool = True) -> dict[str, Any]:
    """One producer P (`prompt_len` tokens, one output) on the real scheduler with an MTP drafter of
    `mtp_lookahead` modules (`child` runs `SchedulerDriver`), asking for prompt logprobs where `prompt_logprobs` (1):
    scheduled, its output returned (it finishes into the connector), then delivered in the next step's output.
    `decode_loads`: the decode side loads what it hands (the model's reading of the release, `decode_loads`).

    Answers `{"lookahead": the release's num_prefill_lookahead_tokens (None: it has none), "scheduled": the tokens
    P's prefill step computed, "computed": P's num_computed_tokens when request_finished got it, "handed": the
    blocks it got, "problems": [model check messages], "status", "free"}`; `problems` is empty exactly when the
    model's `no_unverified_draft_kv_handed` (`draft_kv_handed`) holds at the hand-off."""
    from kvsim.models.kv_cache_manager.scheduler import draft_kv_handed

    built = child.call("build", num_blocks=num_blocks, block_size=block_size, mtp_lookahead=mtp_lookahead)
    child.call("add", request="P", tokens=[1] * prompt_len, max_tokens=1, producer=True,
               prompt_logprobs=1 if prompt_logprobs else None)
    scheduled = child.call("schedule")["scheduled"].get("P", 0)
    state = child.call("output")
    ((request, blocks, _),), (computed,) = state["handed"], state["computed"]
    child.call("schedule")
    state = child.call("output", deliver=[request])  # the decode side read the blocks: they are freed
    problem = draft_kv_handed(computed, prompt_len, mtp_lookahead, decode_loads)
    return {"lookahead": built["lookahead"], "scheduled": scheduled, "computed": computed, "handed": blocks,
            "problems": [] if problem is None else [f"request {request} {problem}"], "status": state["status"],
            "free": state["free"]}


def system(ctx: Context, case: dict[str, Any]) -> Any:
    """The model's P/D system of the release's variant in the case's configuration (one producer, no local one)."""
    from kvsim.models.kv_cache_manager import PD_DESCRIPTOR

    return PD_DESCRIPTOR.build_system(variant_for(MTP_RELEASES, ctx.source.version), dict(case, producers=1, local=0))


def model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    from kvsim.engine.system import run_actions
    from kvsim.models.kv_cache_manager.scheduler import Output, Schedule

    system_ = system(ctx, case)
    last = run_actions(system_, [Schedule(0), Output(0)])[-1]
    (invariant,) = [i for i in system_.invariants if i.name == PROPERTY]
    return {"computed_tokens": last.requests[0].num_computed_tokens, "no_draft_kv": invariant.check(last) is None}


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    got = handoff(ctx.child, **case, decode_loads=system(ctx, case).decode_loads(0))
    keep(ctx, "handoff", case, got)
    return {"computed_tokens": got["computed"], "no_draft_kv": not got["problems"]}


def short_prompt_check(ctx: Context, case: dict[str, Any], answer: dict[str, Any]) -> None:
    """The finding's property on the short prompts' hand-offs (the others are the seed bug's)."""
    problems = kept(ctx, "handoff", case)["problems"]
    if short(case) and problems:
        raise PropertyViolation("; ".join(problems))


PD_MTP = problems_sweep(
    handoffs, model, upstream, PROPERTY, "handoff",
    lambda ctx: f"model variant {variant_for(MTP_RELEASES, ctx.source.version)}; a producer with an MTP drafter "
                f"handed to the release's NixlConnector, {len(handoffs())} shapes (drafters of 1-3 modules, prompts "
                f"of 1-4 tokens; the short ones: finding {SHORT_FINDING})",
    judged=lambda case: not short(case),
    more=(Check(SHORT_PROPERTY, short_prompt_check, finding=SHORT_FINDING),))
