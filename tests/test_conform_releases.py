"""Releases across a fix: the seed bug reports' properties on the real vllm 0.27.1 / 0.28.0 / 0.33.0 code."""

from __future__ import annotations

import json

from kvsim.conform import cli


def test_release_table_reproduces_d6af803_across_its_fix(capsys):
    code = cli.main(["vllm", "--versions", "0.27.1,0.28.0,0.33.0", "--target", "KVBlockZeroer",
                     "--max-examples", "20", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # the zeroer diverges on the documented page check
    rows = {r["bug"]: r for r in doc["seed_bugs"]}
    d6 = rows["vllm-d6af803-packed-zeroing-stride"]
    assert d6["statuses"] == {"0.27.1": "fails", "0.28.0": "holds", "0.33.0": "holds"}
    assert d6["reproduced_across_fix"] is True
    finding = next(r for b, r in rows.items() if b.startswith("finding: vllm 0.28.0 overlaid"))
    assert finding["statuses"]["0.28.0"] == "fails" and finding["statuses"]["0.33.0"] == "holds"


def test_release_table_says_the_mla_planner_is_absent_before_b38e111d(capsys):
    cli.main(["vllm", "--versions", "0.27.1,0.28.0", "--target", "plan_mla_context_chunks", "--max-examples", "10"])
    out = capsys.readouterr().out
    assert "vllm-b38e111d-mla-chunk-blowup" in out and "0.27.1 not present" in out
    assert "0.27.1 has no per-request planner" in out
