"""Seed bugs across their fix: each bug report's property on the last release before the fix and the first after.

The release table (`kvsim conform ENGINE --versions A,B,...`) runs every target on every release;
this module reads the bug reports' properties out of those results. A bug whose code is not in a
release says so (the target is "not present" there, or the property is not run on it), with why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .targets import TargetResult


@dataclass(frozen=True)
class SeedBug:
    bug: str        # the catalog's bug report id
    engine: str
    target: str     # the conform target that runs the report's property on the real code
    property: str   # the bug report's property
    fix: str        # the upstream change
    before: str     # last release before the fix
    after: str      # first release after it
    note: str = ""  # where the code did not exist yet or changed shape


SEED_BUGS = (
    SeedBug("vllm-d6af803-packed-zeroing-stride", "vllm", "KVBlockZeroer", "zeroing_preserves_other_bytes",
            "d6af803 (#50276)", "0.27.1", "0.28.0"),
    SeedBug("finding: vllm 0.28.0 overlaid groups keep the first view's page", "vllm", "KVBlockZeroer",
            "overlaid_groups_get_the_widest_page", "widest-page merge of overlaid segments (after 0.28.0)",
            "0.28.0", "0.33.0", "fixed upstream: 0.33.0 is the first release checked with the merge (0.29-0.32 "
            "not checked)"),
    SeedBug("vllm-b38e111d-mla-chunk-blowup", "vllm", "plan_mla_context_chunks", "chunk_count_within_alignment_slack",
            "b38e111d (#50613)", "0.27.1", "0.28.0",
            "0.27.1 has no per-request planner (plan_mla_context_chunks is absent: the uniform plan is inline in "
            "the metadata builder), so the report's property cannot run on the release before the fix; on 0.28.0 and "
            "later it runs on upstream's per-request plans"),
    SeedBug("sglang-05c7ebf-staging-slot-overrun", "sglang", "send_plan", "each_send_fits_one_slot",
            "05c7ebf (#30545)", "0.5.17", "0.5.19",
            "upstream's send_kv_chunk itself, driven room by room; 0.5.13-0.5.17 page-floor only (no "
            "compute_grid_segments), 0.5.19+ grid-floor and split at grid lines"),
)


def property_status(result: TargetResult | None, name: str) -> str:
    """"fails" / "holds" / "not present" / "not run" for one property in one target result."""
    if result is None:
        return "not run"
    if result.status in ("not present", "error"):
        return result.status
    for p in result.properties:
        if p["property"] == name:
            return p["status"]
    return "not run"


def bug_rows(engine: str, versions: Sequence[str],
             table: Mapping[str, Mapping[str, TargetResult]]) -> list[dict[str, Any]]:
    rows = []
    for bug in SEED_BUGS:
        if bug.engine != engine or bug.target not in table:
            continue
        statuses = {v: property_status(table[bug.target].get(v), bug.property) for v in versions}
        shown = None
        if bug.before in statuses and bug.after in statuses and statuses[bug.before] in ("fails", "holds"):
            shown = statuses[bug.before] == "fails" and statuses[bug.after] == "holds"
        rows.append({"bug": bug.bug, "property": bug.property, "fix": bug.fix, "before": bug.before,
                     "after": bug.after, "statuses": statuses, "reproduced_across_fix": shown, "note": bug.note})
    return rows


def format_bug_rows(rows: Sequence[Mapping[str, Any]], versions: Sequence[str]) -> list[str]:
    if not rows:
        return []
    lines = ["seed bugs across their fix (the bug report's property on the real code):"]
    for row in rows:
        cells = "  ".join(f"{v} {row['statuses'][v]}" for v in versions)
        verdict = {True: "fails before, holds after: reproduced", False: "NOT reproduced across the fix",
                   None: f"not shown (needs {row['before']} and {row['after']} in --versions, with the code "
                         f"present in {row['before']})"}[row["reproduced_across_fix"]]
        lines.append(f"  {row['bug']} [{row['property']}, fix {row['fix']}]: {cells}: {verdict}")
        if row["note"]:
            lines.append(f"      {row['note']}")
    return lines
