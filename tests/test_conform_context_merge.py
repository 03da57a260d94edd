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
from kvsim.conform.targets import RunOptions, targets
from kvsim.conform.triton_child import KernelChild
from kvsim.conform.vllm.context_merge import MERGE, NAME, accumulate_compare, context_partial_probe
from kvsim.properties.mla_chunks.cases import SKIPPED_CASE

pytest.importorskip("triton")
pytest.importorskip("torch")


def test_49294_reproduced_across_its_fix_on_the_release_kernels():
    chosen = [t for t in targets("vllm") if t.name == NAME]
    versions, table = release_table("vllm", ["0.25.1", "0.26.0", "0.28.0"], chosen, RunOptions(max_examples=2))
    before, after = table[NAME]["0.25.1"], table[NAME]["0.26.0"]
    # both releases' kernels agree with the model's variant for them (uniform_unmasked, pre_b38e111d)
    assert before.divergent == 0 and after.divergent == 0 and before.compared >= 2 + 5, (before, after)
    assert after.status == "conforms" and table[NAME]["0.28.0"].status == "not present"
    row = next(r for r in bug_rows("vllm", versions, table) if r["bug"] == "vllm-49294-mla-empty-span")
    assert row["statuses"] == {"0.25.1": "fails", "0.26.0": "holds", "0.28.0": "not present"}
    assert row["reproduced_across_fix"] is True
    message = next(p["message"] for p in before.properties
                   if p["property"] == "context_partial_matches_context_attention")
    # [64, 0, 64, 0]: the context-free request 1's tokens 4..7 keep the backend's scratch (NaN output, LSE 0)
    assert message.startswith("context partial for contexts [64, 0, 64, 0]") and "token 4" in message
    assert "got output [nan, nan, nan]" in message


def test_a_planted_change_in_the_mask_kernel_breaks_the_release(tmp_path):
    """0.26.0's mask with its -inf store dropped: the differential and the property both fail."""
    release = resolve_source("vllm", version="0.26.0")
    copy = tmp_path / MERGE
    copy.parent.mkdir(parents=True)
    text = release.file(MERGE).read_text()
    line = "output.masked_fill_(is_empty[:, None, None], 0.0)"
    assert text.count(line) == 1
    copy.write_text(text.replace(line, "pass"))
    (tmp_path / "vllm" / "__init__.py").write_text("")
    with KernelChild(resolve_source("vllm", from_path=str(tmp_path)), "cpu") as child:
        found = accumulate_compare(child, SKIPPED_CASE)
        assert found is not None and "mask_empty_context" in found.upstream
        assert "nan" in context_partial_probe(child)
