"""`kvsim conform sglang --target send_plan`: upstream's prefill send planner against pd-staging's plan.

Real releases from the cache (downloaded once if absent): 0.5.17 (before 05c7ebf) and 0.5.23 (after).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvsim.conform.releases import bug_rows
from kvsim.conform.sglang.send_plan import MISALIGNED_S3
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets

OPTIONS = RunOptions(max_examples=40)
TARGET = select_targets("sglang", "send_plan")[0]
FILES = ("sglang/srt/disaggregation/prefill.py", "sglang/srt/disaggregation/common/conn.py",
         "sglang/srt/disaggregation/common/staging_handler.py", "sglang/srt/disaggregation/common/staging_buffer.py",
         "sglang/srt/mem_cache/common.py")


def run(version: str, source=None):
    return run_target(TARGET, source or resolve_source("sglang", version=version), OPTIONS)


def props(result) -> dict[str, str]:
    return {p["property"]: p["status"] for p in result.properties}


def test_after_fix_conforms_and_the_seed_property_holds():
    result = run("0.5.23")
    assert result.status == "conforms", result.divergences[:1] or result.note
    assert result.compared == 40 + 5  # the pinned scenarios (A, B, A early; D refused: not page-aligned) first
    assert set(props(result).values()) == {"holds"}
    assert result.note.startswith("model variant sglang_0_5_23; 0 inputs drawn with D not page-aligned; ")


def test_before_fix_the_slot_overrun_fails_on_the_real_planner():
    result = run("0.5.17")
    assert result.status == "diverges" and result.note.startswith("model variant pre_05c7ebf")
    p = props(result)
    assert p["each_send_fits_one_slot"] == "fails" and p["exactly_one_last_send"] == "holds"
    assert p[MISALIGNED_S3] == "fails"  # upstream finding: is_last never fires / fires early with D unaligned
    slot = next(x for x in result.properties if x["property"] == "each_send_fits_one_slot")
    assert slot["input"]["prefill_hit"] > 0  # a prefill radix hit makes the first send span several slots
    # the plan is upstream's exactly (the unaligned-D page count was a model bug, fixed): what diverges is the
    # seed bug's property failing on the real pre-fix planner
    assert result.divergent == 0 and result.compared == 40 + 6
    table = {"send_plan": {"0.5.17": result, "0.5.23": run("0.5.23")}}
    row = [r for r in bug_rows("sglang", ["0.5.17", "0.5.23"], table)
           if r["bug"] == "sglang-05c7ebf-staging-slot-overrun"]
    assert row and row[0]["statuses"] == {"0.5.17": "fails", "0.5.23": "holds"}


def _copy(version: str, dest: Path) -> Path:
    src = resolve_source("sglang", version=version).root
    for rel in FILES:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)
        for parent in target.relative_to(dest).parents:
            if str(parent) != ".":
                (dest / parent / "__init__.py").touch()
    return dest


@pytest.mark.parametrize("old,new", [("// grid_tokens + 1) * grid_tokens", "// grid_tokens + 2) * grid_tokens")])
def test_a_planted_change_in_the_upstream_planner_is_caught(tmp_path, old, new):
    root = _copy("0.5.23", tmp_path)
    path = root / "sglang/srt/disaggregation/common/staging_buffer.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    result = run("", resolve_source("sglang", from_path=str(root)))
    assert result.status == "diverges" and result.divergent == 1
    first = result.divergences[0]  # a send one grid slot longer than the model's
    assert first["field"].startswith("sends[") and first["input"]["L"] <= 1000
    assert props(result)["each_send_fits_one_slot"] == "fails"
