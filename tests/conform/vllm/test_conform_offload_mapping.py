"""kvsim conform vllm: kv-offload's worker-side mapping (`models/kv_offload/mapping.py`) against vLLM 0.33.0's own
worker handler (and the earlier releases'), and upstream's Triton swap kernel on the model's triples, each with a
planted change that must diverge."""

from __future__ import annotations

import os
import shutil

import pytest


# --- against vLLM 0.33.0's own SingleDirectionOffloadingHandler ---------------------------------------------

@pytest.fixture(scope="module")
def vllm_src():  # type: ignore[no-untyped-def]
    from kvsim.conform.source import resolve_source

    return resolve_source("vllm", version="0.33.0")


def _run(source, name: str, examples: int):  # type: ignore[no-untyped-def]
    from kvsim.conform.targets import RunOptions, run_target, select_targets

    return run_target(select_targets("vllm", name)[0], source, RunOptions(max_examples=examples))


def _planted_tree(tmp_path, source, relpath: str, plants):  # type: ignore[no-untyped-def]
    """A hard-linked copy of the release tree with lines of one file replaced (the file rewritten, never the cache)."""
    from kvsim.conform.source import resolve_source

    tree = tmp_path / "vllm-planted"
    shutil.copytree(source.root, tree, copy_function=os.link)
    target = tree / relpath
    text = target.read_text()
    for old, new in plants:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    target.unlink()
    target.write_text(text)
    return resolve_source("vllm", from_path=str(tree))


def test_upstream_handler_conforms_to_the_mapping(vllm_src) -> None:  # type: ignore[no-untyped-def]
    result = _run(vllm_src, "offload_transfer_async", 60)
    assert result.status == "conforms" and result.compared >= 60 and result.divergent == 0, result
    assert {p["property"]: p["status"] for p in result.properties} == {
        "worker_mapping_is_a_bijection_with_page_bytes": "holds", "round_trip_gpu_cpu_gpu_is_identity": "holds",
        "no_tensors_refused": "holds"}
    order = _run(vllm_src, "offload_get_finished", 20)
    assert order.status == "conforms" and order.compared >= 20 and order.divergent == 0, order


def test_planted_upstream_changes_make_conformance_fail(vllm_src, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kvsim.models.kv_offload.conform import GPU_WORKER

    planted = _planted_tree(tmp_path, vllm_src, GPU_WORKER, (
        ("src_logical_blocks_to_skip = block_idx % self.src_blocks_per_chunk",
         "src_logical_blocks_to_skip = (block_idx + 1) % self.src_blocks_per_chunk"),
        ("while self._transfers and self._transfers[0].end_event.query():",
         "while self._transfers and self._transfers[-1].end_event.query():")))
    result = _run(planted, "offload_transfer_async", 60)
    assert result.status == "diverges" and result.divergent == 1, result
    assert result.divergences[0]["input"]["direction"] == "cpu_to_gpu"  # shrunk to the side the plant changed
    order = _run(planted, "offload_get_finished", 60)
    assert order.status == "diverges" and order.divergent == 1 and len(order.divergences[0]["program"]) <= 8, order


@pytest.mark.parametrize("version", ["0.27.1", "0.28.0"])
def test_the_earlier_releases_handler_conforms_too(version: str) -> None:
    """The worker mapping is older than #52615's rename: the same adapter on the earlier releases conforms."""
    from kvsim.conform.source import resolve_source

    source = resolve_source("vllm", version=version)
    for name in ("offload_transfer_async", "offload_get_finished"):
        result = _run(source, name, 20)
        assert result.status == "conforms" and result.compared >= 20 and result.divergent == 0, result


# --- upstream's Triton swap kernel on the model's triples (interpreted, in the kernel child) ------------------

def test_upstream_triton_swap_kernel_copies_the_models_triples(vllm_src, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kvsim.models.kv_offload.conform import SWAP_TRITON

    result = _run(vllm_src, "offload-swap-triton", 8)
    assert result.status == "conforms" and result.compared >= 8 and result.divergent == 0, result
    planted = _planted_tree(tmp_path, vllm_src, SWAP_TRITON, (
        ("words = tl.load(sizes + job) // 8", "words = tl.load(sizes + job) // 8 - 1"),))  # the last word of a copy
    found = _run(planted, "offload-swap-triton", 8)
    assert found.status == "diverges" and found.divergent == 1, found
    assert "differ" in found.divergences[0]["difference"]
