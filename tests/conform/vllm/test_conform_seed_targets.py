"""The seed bugs of the KV cache manager on the real releases, through the conform runner:
`kvsim conform vllm --target pd_preemption_race` (vLLM #50297 on the real Scheduler), `connector_hit_48195`
(#48195 on the real Scheduler over full attention + Mamba) and `pd_mtp_draft_kv` (#55055 on the real Scheduler with
an MTP drafter and NIXL's connector). The release before each fix (0.26.0; 0.30.0 for #55055) agrees with the
model's pre-fix variant and fails the bug report's property (the expected pre-fix verdict, not a kvsim error); the
fix (0.27.0; 0.31.0 for #55055) conforms and the property holds. The release table reads it as the seed bug
reproduced across the fix. Releases are prepared once in the user cache; the child is shared per release
(kvsim.conform.installed_child.shared)."""

from __future__ import annotations

import pytest

from kvsim.conform.releases import bug_rows
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets


@pytest.mark.parametrize("name, bug, message, versions", [
    ("pd_preemption_race", "vllm-50297-pd-preemption-race", "request_finished got []", ("0.26.0", "0.27.0")),
    ("connector_hit_48195", "vllm-48195-connector-hit-max-over-groups", "group 0 (full) needs block 0 cached",
     ("0.26.0", "0.27.0")),
    ("pd_mtp_draft_kv", "vllm-55055-pd-mtp-draft-kv", "hands the KV of 2 of its 2 prompt tokens", ("0.30.0", "0.31.0")),
])
def test_the_property_fails_before_the_fix_and_holds_after(name: str, bug: str, message: str,
                                                           versions: tuple[str, str]) -> None:
    (target,) = select_targets("vllm", name)
    results = {v: run_target(target, resolve_source("vllm", version=v), RunOptions()) for v in versions}
    before, after = (results[v] for v in versions)
    assert before.divergences == [] and after.divergences == []  # the model's variant answers as the release does
    seed = [p for p in before.properties if p["status"] != "finding confirmed"]  # open-upstream findings aside
    (prop,) = seed
    assert prop["status"] == "fails" and message in prop["message"], before.to_json()
    assert before.status == "diverges"  # a property failing on the real code, not an error
    assert after.status == "conforms", after.to_json()
    assert [p["status"] for p in after.properties if p["property"] == prop["property"]] == ["holds"], after.to_json()
    (row,) = [r for r in bug_rows("vllm", list(versions), {target.name: results}) if r["bug"] == bug]
    assert row["reproduced_across_fix"] is True


def test_a_prompt_no_longer_than_the_backoff_still_hands_draft_kv_after_the_fix() -> None:
    """The finding vllm-55055-short-prompt-draft-kv on the real fixed scheduler: a 1-token prompt with a 2-module
    drafter is not truncated (0.33.0 checks num_prompt_tokens > backoff), so its position's draft-derived MTP KV is
    handed; the model's fixed variant agrees (no divergence) and the target still conforms."""
    (target,) = select_targets("vllm", "pd_mtp_draft_kv")
    result = run_target(target, resolve_source("vllm", version="0.33.0"), RunOptions())
    assert result.status == "conforms" and result.divergences == [], result.to_json()
    (short,) = [p for p in result.properties if p["property"] == "no_unverified_draft_kv_short_prompt"]
    assert short["status"] == "finding confirmed", short
    assert short["message"].startswith("vllm-55055-short-prompt-draft-kv: ") and \
        "hands the KV of 1 of its 1 prompt tokens" in short["message"], short


def test_the_connector_path_runs_the_fixed_method_on_a_release_that_gates_it() -> None:
    """From 0.30.0 the scheduler asks `get_computed_blocks_for_connector` (the #48195 fix) only for a connector
    that says `supports_divergent_local_hybrid_hits` (NIXL's does; the base class does not): the recording
    connector says so, so 0.33.0's schedule() runs that method's lines, not `get_computed_blocks` alone."""
    from dataclasses import replace

    from kvsim.conform.run import run_targets
    from kvsim.conform.targets import descriptors

    (target,) = select_targets("vllm", "connector_hit_48195")
    manager = replace(target.upstream[0], checked=("KVCacheManager.get_computed_blocks_for_connector",))
    traced = replace(target, upstream=(manager,) + tuple(target.upstream[1:]))
    (result,) = run_targets([traced], resolve_source("vllm", version="0.33.0"), descriptors(), RunOptions(),
                            measure=True)
    assert result.status == "conforms" and result.coverage["percent"] >= 75, result.coverage


def test_a_mutant_of_the_scheduler_reaches_the_async_scheduler_the_race_builds() -> None:
    """The driver builds `AsyncScheduler`, a subclass of the mutated `Scheduler` in another module: a preempted
    request restarted from token 1 instead of 0 (`_preempt_request`) is what the race runs, and the tokens the
    producer's recompute schedules (1, not its 2 prompt tokens) are its divergence. The release runs first, so the
    child has imported `AsyncScheduler` over the released class before the mutant is loaded (as `--mutants` does)."""
    from kvsim.conform.loader import mutated
    from kvsim.engine.conformance.mutants import planted

    source = resolve_source("vllm", version="0.33.0")
    relpath = "vllm/v1/core/sched/scheduler.py"
    mutant = planted(source.file(relpath).read_text(), relpath, "    def _preempt_request(",
                     "request.num_computed_tokens = 0", "request.num_computed_tokens = 1")
    (target,) = select_targets("vllm", "pd_preemption_race")
    assert run_target(target, source, RunOptions()).status == "conforms"
    with mutated(mutant):
        result = run_target(target, source, RunOptions())
    assert result.status == "diverges", result.to_json()
    (d,) = result.divergences
    assert d["input"] == {"num_blocks": 3, "block_size": 2, "prompt_len": 2, "max_tokens": 2}, d
    assert "scheduled" in d["difference"], d
