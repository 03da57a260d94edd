"""kvsim conform vllm --target pd_preemption_race: vLLM #50297 on the real Scheduler through the conform runner.
The release before the fix (0.26.0) conforms to the model's pre_50297 variant and fails the bug report's property
(the expected pre-fix verdict, not a kvsim error); 0.27.0, the fix, conforms and the property holds. The release
table reads it as the seed bug reproduced across the fix. Releases are prepared once in the user cache; the child is
shared per release (kvsim.conform.installed_child.shared)."""

from __future__ import annotations

from kvsim.conform.releases import bug_rows
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets

BUG = "vllm-50297-pd-preemption-race"


def test_the_race_fails_before_50297_and_holds_after() -> None:
    (target,) = select_targets("vllm", "pd_preemption_race")
    results = {v: run_target(target, resolve_source("vllm", version=v), RunOptions()) for v in ("0.26.0", "0.27.0")}
    before, after = results["0.26.0"], results["0.27.0"]
    assert before.divergences == [] and after.divergences == []  # the model's variant hands what the release hands
    (prop,) = before.properties
    assert prop["status"] == "fails" and "request_finished got []" in prop["message"], before.to_json()
    assert before.status == "diverges"  # a property failing on the real code, not an error
    assert after.status == "conforms" and [p["status"] for p in after.properties] == ["holds"], after.to_json()
    (row,) = [r for r in bug_rows("vllm", ["0.26.0", "0.27.0"], {target.name: results}) if r["bug"] == BUG]
    assert row["reproduced_across_fix"] is True
