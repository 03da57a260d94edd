"""The real upstream Triton kernels (vLLM 0.33.0, SGLang 0.5.23) against the models, under the interpreter.

The releases are downloaded once into the user cache by `resolve_source` (a failed download fails
these tests with pip's reason). Each target runs a small derandomized budget in a child process
with TRITON_INTERPRET=1; a planted wrong stride or offset in a copy of the upstream file, loaded
with `--from`, must make its target diverge.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvsim.conform.kernels import kernel_examples
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, targets
from kvsim.conform.triton_child import KernelChild
from kvsim.engine.conformance.answers import Answered
from kvsim.engine.errors import ConfigError

pytest.importorskip("triton")
pytest.importorskip("torch")

KERNEL_TARGETS = {"vllm": ("zero-kv-blocks-kernel", "merge-attn-states-triton"),
                  "sglang": ("staging-gather-triton", "staging-gather-torch", "staging-scatter-triton",
                             "staging-scatter-torch")}
VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}
CI = RunOptions(max_examples=10)


def _target(engine: str, name: str):  # type: ignore[no-untyped-def]
    return next(t for t in targets(engine) if t.name == name)


@pytest.fixture(scope="module")
def sources():  # type: ignore[no-untyped-def]
    return {engine: resolve_source(engine, version=version) for engine, version in VERSIONS.items()}


@pytest.mark.parametrize("engine,name", [(e, n) for e, names in KERNEL_TARGETS.items() for n in names])
def test_kernel_target_conforms_on_the_release(sources, engine: str, name: str) -> None:
    result = run_target(_target(engine, name), sources[engine], CI)
    assert result.status == "conforms", result
    assert result.compared >= CI.max_examples
    assert all(p["status"] == "holds" for p in result.properties), result.properties


def test_documented_conventions_are_probed(sources) -> None:  # type: ignore[no-untyped-def]
    merge = run_target(_target("vllm", "merge-attn-states-triton"), sources["vllm"], RunOptions(max_examples=1))
    assert [p["property"] for p in merge.properties] == ["merge_nan_lse_beside_empty"]
    assert "NaN" in _target("vllm", "merge-attn-states-triton").doc
    gather = run_target(_target("sglang", "staging-gather-triton"), sources["sglang"], RunOptions(max_examples=1))
    assert [p["property"] for p in gather.properties] == ["triton_staging_8_byte_elements"]


def _planted(tmp_path: Path, source, relpath: str, old: str, new: str) -> str:  # type: ignore[no-untyped-def]
    """A copy of the release's file under tmp_path/<engine>/..., with one line changed; the tree to --from."""
    copy = tmp_path / relpath
    copy.parent.mkdir(parents=True)
    text = source.file(relpath).read_text()
    assert text.count(old) >= 1, f"{old!r} not in {relpath}: the plant needs updating"
    copy.write_text(text.replace(old, new, 1))
    for extra in (f"{source.engine}/__init__.py", "sglang/kernels/ops/memory/ptr_table.py"):
        if source.has(extra) and not (tmp_path / extra).exists():
            (tmp_path / extra).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source.file(extra), tmp_path / extra)
    return str(tmp_path)


PLANTS = [
    ("vllm", "zero-kv-blocks-kernel", "vllm/v1/worker/utils.py",
     "block_offset = block_id.to(tl.int64) * block_stride_el.to(tl.int64)",
     "block_offset = block_id.to(tl.int64) * page_size_el.to(tl.int64)"),  # the pre-d6af803 stride
    ("vllm", "merge-attn-states-triton", "vllm/v1/attention/ops/triton_merge_attn_states.py",
     "s_scale = s_se / out_se", "s_scale = s_se / (out_se + 1e-3)"),
    ("sglang", "staging-gather-triton", "sglang/srt/disaggregation/common/staging_buffer.py",
     "pool_token * stride_pool_token.to(tl.int64) + head_offset.to(tl.int64) + e_idx",
     "pool_token * stride_pool_token.to(tl.int64) + e_idx"),  # the head offset dropped
    ("sglang", "staging-scatter-torch", "sglang/srt/disaggregation/common/staging_buffer.py",
     "rank_base = writer_rank * per_rank_bytes", "rank_base = writer_rank * per_layer_bytes"),
    # the two input gaps a mutation run of the torch paths found, closed by the targets' pinned cases
    ("sglang", "staging-gather-torch", "sglang/srt/disaggregation/common/staging_buffer.py",
     "if page_size == 1:\n        token_indices = page_idx_tensor",
     "if page_size == 2:\n        token_indices = page_idx_tensor"),  # the page-size-1 shortcut at size 2
    ("sglang", "staging-scatter-torch", "sglang/srt/disaggregation/common/staging_buffer.py",
     "num_writers = prefill_attn_tp_size // max(1, decode_attn_tp_size)",
     "num_writers = prefill_attn_tp_size // max(2, decode_attn_tp_size)"),  # one writer short at decode TP 1
]


@pytest.mark.parametrize("engine,name,relpath,old,new", PLANTS, ids=[f"{p[1]}-{i}" for i, p in enumerate(PLANTS)])
def test_a_planted_stride_or_offset_makes_the_target_diverge(sources, tmp_path, engine, name, relpath, old,
                                                             new) -> None:
    mutant = resolve_source(engine, from_path=_planted(tmp_path, sources[engine], relpath, old, new))
    result = run_target(_target(engine, name), mutant, RunOptions(max_examples=40))
    assert result.status == "diverges", result
    assert result.divergences and result.divergences[0]["difference"]


def test_the_merge_cut_off_is_checked_at_its_boundary(sources, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`token_idx < prefill_tokens_with_context` planted as `<=`: the first token past the cut merges instead of taking
    the suffix as is; the shrunk input has a cut inside the batch."""
    relpath = "vllm/v1/attention/ops/triton_merge_attn_states.py"
    tree = _planted(tmp_path, sources["vllm"], relpath, "prefix_mask = token_idx < prefill_tokens_with_context",
                    "prefix_mask = token_idx <= prefill_tokens_with_context")
    result = run_target(_target("vllm", "merge-attn-states-triton"), resolve_source("vllm", from_path=tree),
                        RunOptions(max_examples=40))
    assert result.status == "diverges" and result.divergent == 1, result
    found = result.divergences[0]
    tokens = found["input"]["T_H_D"][0]
    assert 0 <= found["input"]["prefill_tokens_with_context"] < tokens, found["input"]
    assert found["field"].startswith(("output[", "lse["))


def test_a_missing_kernel_is_a_config_error_naming_it(sources, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tree = _planted(tmp_path, sources["vllm"], "vllm/v1/worker/utils.py", "def _zero_kv_blocks_kernel(",
                    "def _renamed_kernel(")
    result = run_target(_target("vllm", "zero-kv-blocks-kernel"), resolve_source("vllm", from_path=tree), CI)
    assert result.status in ("not present", "error") and "_zero_kv_blocks_kernel" in result.note


def test_cuda_without_a_gpu_is_a_skip_with_its_reason(sources) -> None:  # type: ignore[no-untyped-def]
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: scripts/gpu_check.sh covers --device cuda")
    result = run_target(_target("vllm", "zero-kv-blocks-kernel"), sources["vllm"], RunOptions(max_examples=1, device="cuda"))
    assert result.status == "skipped" and "CUDA" in result.note


def test_the_child_reports_an_unknown_kernel_and_survives(sources) -> None:  # type: ignore[no-untyped-def]
    with KernelChild(sources["vllm"], "cpu") as child:
        with pytest.raises(ConfigError, match="unknown kernel"):
            child.call("kvsim.conform.vllm.kernels:no_such_kernel", {})
        with pytest.raises(ConfigError, match="unknown kernel"):  # only runners under kvsim.conform are imported
            child.call("os:system", {})
        with pytest.raises(Answered) as raised:  # the kernel's raise is its answer, with where it was raised
            child.call("kvsim.conform.vllm.kernels:run_zero", {})
        assert raised.value.answer.type == "KeyError"
        with pytest.raises(ConfigError, match="unknown kernel"):  # the same child still answers
            child.call("kvsim.conform.vllm.kernels:no_such_kernel", {})
        assert child.started == 1


def test_kernel_examples_are_capped_in_ci(sources, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("KVSIM_PROFILE", raising=False)
    assert kernel_examples() == 40
    monkeypatch.setenv("KVSIM_PROFILE", "dev")
    assert kernel_examples() == 200
    monkeypatch.delenv("KVSIM_PROFILE")
    few = run_target(_target("sglang", "staging-gather-torch"), sources["sglang"], RunOptions(max_examples=3))
    assert few.status == "conforms" and few.compared < 10, few  # the command's smaller budget wins


def test_a_planted_change_in_the_pre_fix_kernel_diverges(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """0.27.1's launcher (no stride column) driven with the model's pre_d6af803 plan: the release's kernel agrees
    byte for byte on every pinned case (only the seed bug's frame probe fails there); one word off in a copy of
    its kernel is a byte difference on the first pinned case, named by its element."""
    release = resolve_source("vllm", version="0.27.1")
    target = _target("vllm", "zero-kv-blocks-kernel")
    clean = run_target(target, release, RunOptions(max_examples=1))
    assert clean.divergent == 0 and clean.compared >= 6 and "pre_d6af803" in clean.note, clean
    assert [p["status"] for p in clean.properties] == ["fails"]  # the d6af803 frame property, the seed bug
    tree = _planted(tmp_path, release, "vllm/v1/worker/utils.py", "cols = tl.arange(0, BLOCK_SIZE).to(tl.int64)",
                    "cols = tl.arange(0, BLOCK_SIZE).to(tl.int64) + 1")
    planted = run_target(target, resolve_source("vllm", from_path=tree), RunOptions(max_examples=1))
    assert planted.status == "diverges" and planted.divergent == 1, planted
    found = planted.divergences[0]
    assert found["input"]["case"]["name"].startswith("last block page") and found["field"].startswith("memory[")
    assert "elements differ" in found["difference"]
    # the probe ran upstream's constructor in a one-file tree: its raise fails the probe, with where
    assert planted.properties[0]["status"] == "fails"


# before ptr_table.py: gpu_id and cuda:{gpu_id} in the gather (0.5.17: streams kept on the buffer; 0.5.19:
# get_gather_stream); the scatter is the same in both
OLD_SGLANG = [("0.5.17", name) for name in KERNEL_TARGETS["sglang"]] + [("0.5.19", "staging-gather-triton"),
                                                                        ("0.5.19", "staging-gather-torch"),
                                                                        # ptr_table.py shipped, the old gather kept
                                                                        ("0.5.20", "staging-gather-triton")]


@pytest.mark.parametrize("version,name", OLD_SGLANG)
def test_staging_kernels_before_the_ptr_table_conform(version: str, name: str) -> None:
    result = run_target(_target("sglang", name), resolve_source("sglang", version=version), RunOptions(max_examples=4))
    assert result.status == "conforms", result
    assert result.compared >= 4 and result.divergent == 0


def test_a_planted_change_in_the_0_5_17_gather_diverges(tmp_path) -> None:  # type: ignore[no-untyped-def]
    release = resolve_source("sglang", version="0.5.17")
    tree = _planted(tmp_path, release, "sglang/srt/disaggregation/common/staging_buffer.py",
                    "pool_token * stride_pool_token.to(tl.int64) + head_offset.to(tl.int64) + e_idx",
                    "pool_token * stride_pool_token.to(tl.int64) + e_idx")
    result = run_target(_target("sglang", "staging-gather-triton"), resolve_source("sglang", from_path=tree),
                                                           RunOptions(max_examples=20))
    assert result.status == "diverges", result


# the torch paths' equivalent mutants, all of them measured (`kvsim conform sglang --target T --mutants 0`): each
# declaration covers these and no sibling of the same operator and text (docs/conform.md#mutation-scores)
DOCUMENTED = {
    "staging-gather-torch": ["442 _gather_all_layers_torch constant: '1' -> '0'",
                             "458 _gather_all_layers_torch arguments: 'num_tokens, num_heads'",
                             "458 _gather_all_layers_torch arguments: 'num_heads, head_dim'",
                             "472 _gather_all_layers_torch arguments: 'num_tokens, num_heads'",
                             "472 _gather_all_layers_torch arguments: 'num_heads, head_dim'",
                             "564 gather_all_layers_to_staging arguments: 'k_buffers, v_buffers'"],
    "staging-scatter-torch": ["406 scatter_kv_head_slices constant: '1' -> '0'",
                              "603 _scatter_staging_to_kv_torch comparison: '>' -> '>='",
                              "604 _scatter_staging_to_kv_torch division:",
                              "604 _scatter_staging_to_kv_torch constant: '1' -> '0'",
                              "604 _scatter_staging_to_kv_torch arguments: '1, decode_attn_tp_size'",
                              "623 _scatter_staging_to_kv_torch arguments: 'num_tokens, num_heads'",
                              "623 _scatter_staging_to_kv_torch arguments: 'num_heads, head_dim'",
                              "638 _scatter_staging_to_kv_torch arguments: 'num_tokens, num_heads'",
                              "638 _scatter_staging_to_kv_torch arguments: 'num_heads, head_dim'",
                              "747 scatter_staging_to_kv arguments: 'k_buffers, v_buffers'"]}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_torch_paths_document_exactly_their_equivalent_mutants(sources, name: str) -> None:
    from kvsim.conform.mutate import target_mutants
    from kvsim.conform.run import upstream_texts

    target = _target("sglang", name)
    texts = {u.file: text for u, text in upstream_texts(target, sources["sglang"])}
    covered = [m.label.split(":", 1)[1] for m in target_mutants(target, sources["sglang"])
               if any(s.covers(m, texts[m.file]) for s in target.survivors)]
    assert len(covered) == len(DOCUMENTED[name]), covered
    assert all(label.startswith(want) for label, want in zip(covered, DOCUMENTED[name])), covered
