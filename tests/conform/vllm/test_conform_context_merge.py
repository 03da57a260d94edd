"""The #49294 seed bug on the real releases: vLLM 0.25.1 (no mask_empty_context) and 0.26.0 (the first with it).

The uniform loop's accumulation runs on each release's own Triton mask_empty_context and merge_attn_states
under the interpreter (a child process); the releases are downloaded once into the user cache (a failed
download fails these tests with pip's reason).
"""

from __future__ import annotations

import pytest

from kvsim.conform.releases import bug_rows
from kvsim.conform.report import release_table
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets, targets
from kvsim.conform.vllm.context_merge import MERGE

NAME = "mla-context-accumulation"

pytest.importorskip("triton")
pytest.importorskip("torch")


def test_49294_reproduced_across_its_fix_on_the_release_kernels():
    chosen = [t for t in targets("vllm") if t.name == NAME]
    versions, table = release_table("vllm", ["0.25.1", "0.26.0", "0.28.0"], chosen, RunOptions(max_examples=2))
    before, after = table[NAME]["0.25.1"], table[NAME]["0.26.0"]
    # both releases' kernels agree with the model's variant for them (uniform_unmasked, pre_b38e111d)
    assert before.divergent == 0 and after.divergent == 0 and before.compared >= 2 + 5, (before, after)
    assert "model variant uniform_unmasked" in before.note and "model variant pre_b38e111d" in after.note
    assert after.status == "conforms" and table[NAME]["0.28.0"].status == "not present"
    row = next(r for r in bug_rows("vllm", versions, table) if r["bug"] == "vllm-49294-mla-empty-span")
    assert row["statuses"] == {"0.25.1": "fails", "0.26.0": "holds", "0.28.0": "not present"}
    assert row["reproduced_across_fix"] is True
    message = next(p["message"] for p in before.properties
                   if p["property"] == "context_partial_matches_context_attention")
    # [64, 0, 64, 0]: the context-free request 1's tokens 4..7 keep the backend's scratch (NaN output, LSE 0)
    assert message.startswith("context partial for contexts [64, 0, 64, 0]")
    assert 'output[4, 0, 0]: model 0.0, upstream "nan"' in message


def test_a_planted_change_in_the_mask_kernel_breaks_the_release(tmp_path):
    """0.26.0's mask with its zeroing of the empty rows' output dropped: the differential diverges on a shrunk
    batch, and the #49294 property fails."""
    release = resolve_source("vllm", version="0.26.0")
    copy = tmp_path / MERGE
    copy.parent.mkdir(parents=True)
    text = release.file(MERGE).read_text()
    line = "output.masked_fill_(is_empty[:, None, None], 0.0)"
    assert text.count(line) == 1
    copy.write_text(text.replace(line, "pass"))
    (tmp_path / "vllm" / "__init__.py").write_text("")
    tree = resolve_source("vllm", from_path=str(tmp_path))
    result = run_target(select_targets("vllm", NAME)[0], tree, RunOptions(max_examples=2))
    assert result.status == "diverges" and result.divergent == 1
    found = result.divergences[0]
    assert found["field"].startswith("output[") and "nan" in found["difference"]
    assert 0 in found["input"]["context_lens"]  # a context-free request (its span is empty in every chunk)
    probe = next(p for p in result.properties if p["property"] == "context_partial_matches_context_attention")
    assert probe["status"] == "fails" and "nan" in probe["message"]
