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
    target: str | tuple[str, ...]  # the conform target(s) that run the report's property on the real code: in
    # each release the first of them present there (where the code changed shape across the fix)
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
    SeedBug("vllm-b38e111d-mla-chunk-blowup", "vllm", ("mla_uniform_plan_properties", "plan_mla_context_chunks"),
            "chunk_count_within_alignment_slack", "b38e111d (#50613)", "0.27.1", "0.28.0",
            "0.27.1: the uniform plan inline in build_mla_chunked_context_metadata (target "
            "mla_uniform_plan_properties; mla_uniform_plan is its differential alone); "
            "0.28.0 and later: the per-request plan_mla_context_chunks (target plan_mla_context_chunks)"),
    SeedBug("sglang-05c7ebf-staging-slot-overrun", "sglang", "send_plan", "each_send_fits_one_slot",
            "05c7ebf (#30545)", "0.5.17", "0.5.19",
            "upstream's send_kv_chunk itself, driven room by room; 0.5.13-0.5.17 page-floor only (no "
            "compute_grid_segments), 0.5.19+ grid-floor and split at grid lines"),
    SeedBug("vllm-d6af803-packed-zeroing-stride", "vllm", "zero-kv-blocks-kernel", "zeroing_preserves_other_bytes",
            "d6af803 (#50276)", "0.27.1", "0.28.0",
            "kernel side: upstream's KVBlockZeroer plan zeroed by upstream's Triton _zero_kv_blocks_kernel (its "
            "own launcher; 0.27.1 without the stride column), red-zone guard bytes around every allocation"),
    SeedBug("sglang-pd-common-failed-not-sticky", "sglang", "update_status", "failed_is_sticky",
            "early return on Failed in CommonKVManager.update_status", "0.5.19", "0.5.20",
            "upstream's own update_status on every short trace; 0.5.13-0.5.19 take max(Failed, status), 0.5.20+ "
            "return early on Failed (and create an absent room only from an opening status)"),
    SeedBug("sglang-pr35281-mori-draft-layout", "sglang", "_get_mha_mem_desc_slices", "layout_selects_main_kv",
            "PR #35281 (area 4)", "0.5.18", "0.5.19",
            "upstream's own MoriKVManager._get_mha_mem_desc_slices: 0.5.13-0.5.18 split the list in half, 0.5.19+ "
            "the V-offset rule (whose wider cases are the open finding sglang-pr35281-mori-wide-draft-layout)"),
    SeedBug("vllm-48195-connector-hit-max-over-groups", "vllm", "connector_hit_48195", "hybrid_hit_backed",
            "#48195 / #48425", "0.26.0", "0.27.0",
            "upstream's own Scheduler.schedule() over full attention + Mamba and the local tokens it hands a KV "
            "connector: 0.26.0 max(per_group_hits), 0.27.0+ get_computed_blocks_for_connector"),
    SeedBug("vllm-50297-pd-preemption-race", "vllm", "pd_preemption_race", "finished_into_producer_owns_blocks",
            "#50297", "0.26.0", "0.27.0",
            "upstream's own AsyncScheduler with a producing connector, the race of real_scheduler.race"),
    SeedBug("vllm-55055-pd-mtp-draft-kv", "vllm", "pd_mtp_draft_kv", "no_unverified_draft_kv_handed",
            "#55055", "0.30.0", "0.31.0",
            "upstream's own AsyncScheduler with a 2-module MTP drafter (SpeculativeConfig method mtp) and its "
            "NixlConnector: 0.30.0 truncates a producer's prompt for Mamba only, 0.31.0+ by "
            "num_prefill_lookahead_tokens - 1"),
    SeedBug("vllm-49294-mla-empty-span", "vllm", "mla-context-accumulation",
            "context_partial_matches_context_attention",
            "#49294 (fixes #49334)", "0.25.1", "0.26.0",
            "the uniform loop's accumulation on the release's own mask_empty_context (absent in 0.25.1 and earlier) "
            "and merge_attn_states, Triton under the interpreter; the per-chunk attention is the model's backend "
            "(an empty span leaves NaN output, finite LSE); 0.28.0 and later plan no empty spans (not present)"),
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


def bug_targets(bug: SeedBug) -> tuple[str, ...]:
    return (bug.target,) if isinstance(bug.target, str) else tuple(bug.target)


def release_status(bug: SeedBug, version: str, table: Mapping[str, Mapping[str, TargetResult]]) -> tuple[str, str]:
    """(status, target) of the bug's property in one release: the first of its targets that ran it there."""
    found = [(property_status(table[name].get(version), bug.property), name) for name in bug_targets(bug)
             if name in table]
    return next((f for f in found if f[0] in ("fails", "holds")), found[0])


def bug_rows(engine: str, versions: Sequence[str],
             table: Mapping[str, Mapping[str, TargetResult]]) -> list[dict[str, Any]]:
    rows = []
    for bug in SEED_BUGS:
        if bug.engine != engine or not any(name in table for name in bug_targets(bug)):
            continue
        ran = {v: release_status(bug, v, table) for v in versions}
        statuses = {v: status for v, (status, _) in ran.items()}
        shown = None
        if bug.before in statuses and bug.after in statuses and statuses[bug.before] in ("fails", "holds"):
            shown = statuses[bug.before] == "fails" and statuses[bug.after] == "holds"
        rows.append({"bug": bug.bug, "property": bug.property, "fix": bug.fix, "before": bug.before,
                     "after": bug.after, "statuses": statuses, "targets": {v: name for v, (_, name) in ran.items()},
                     "reproduced_across_fix": shown, "note": bug.note})
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
        via = "/".join(dict.fromkeys(row["targets"].values()))
        lines.append(f"  {row['bug']} [{row['property']} on {via}, fix {row['fix']}]: {cells}: {verdict}")
        if row["note"]:
            lines.append(f"      {row['note']}")
    return lines
