"""kvsim conform vllm: the CPU offloading manager in lockstep with the kv-offload model (vLLM 0.33.0), and the
#52615 rename on the real code (vLLM 0.29.0, the old names, against 0.30.0, the new names)."""

from __future__ import annotations

import os
import shutil

import pytest

from kvsim.conform.report import run_target
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets
from kvsim.conform.vllm import offload
from kvsim.conform.vllm.offload import RELPATH
from kvsim.models.kv_offload import policies
from kvsim.models.kv_offload.names import NEW_NAMES, OLD_NAMES


def _run(name, source, n):
    return run_target(select_targets("vllm", name)[0], source, RunOptions(max_examples=n))


@pytest.fixture(scope="module")
def v033():
    return resolve_source("vllm", version="0.33.0")


def test_lockstep_ten_thousand_steps_without_divergence(v033):
    """LRU and ARC, several requests, every return value, the events, counters, slots and policy order."""
    result = _run("CPUOffloadingManager", v033, 300)
    assert result.status == "conforms" and result.divergent == 0, result.divergences
    assert result.compared >= 10_000, result.compared
    assert "vllm >= 0.30.0 (#52615)" in result.note


def test_the_lockstep_catches_a_model_change(v033, monkeypatch):
    """A model with 0.29.0's LRU touch (evictable keys only) diverges, shrunk to a short program."""
    def touch(self, keys):
        self._update_recency([k for k in reversed(list(keys)) if k in self.chunks and self.chunks[k].ref_cnt == 0])

    monkeypatch.setattr(policies.LRUCachePolicy, "touch", touch)
    result = _run("CPUOffloadingManager", v033, 300)
    assert result.status == "diverges" and result.divergent == 1
    program = result.divergences[0]["input"]["program"]
    assert program[-1].startswith("touch(") and len(program) <= 6
    assert "observations differ in {'policy'" in result.divergences[0]["note"]


def test_planted_upstream_change_makes_the_lockstep_fail(tmp_path, v033):
    """The manager with #35846 reverted (protected = set()) diverges from the model: the loader runs the file."""
    tree = tmp_path / "vllm-planted"
    shutil.copytree(v033.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "protected = set(keys)"
    assert text.count(line) == 1
    target.unlink()
    target.write_text(text.replace(line, "protected = set()"))
    result = _run("CPUOffloadingManager", resolve_source("vllm", from_path=str(tree)), 300)
    assert result.status == "diverges" and "prepare_store" in result.divergences[0]["note"]


def test_planted_missing_failure_event_is_caught_at_a_failed_store(tmp_path, v033):
    """0.31.0's complete_store (no metadata-only removal event on failure), planted into 0.33.0: the lockstep
    reaches failed stores of pending keys and sees the missing event."""
    tree = tmp_path / "vllm-planted"
    shutil.copytree(v033.root, tree, copy_function=os.link)
    target = tree / RELPATH
    text = target.read_text()
    line = "if removed_keys and self.events is not None:"
    assert text.count(line) == 1
    target.unlink()
    target.write_text(text.replace(line, "if False:"))
    result = _run("CPUOffloadingManager", resolve_source("vllm", from_path=str(tree)), 300)
    assert result.status == "diverges" and "observations differ in {'events'" in result.divergences[0]["note"]
    assert "False)" in result.divergences[0]["input"]["program"][-1]  # a complete_store(..., success=False)


def test_a_release_before_the_request_scoped_access_is_skipped():
    result = _run("CPUOffloadingManager", resolve_source("vllm", version="0.30.0"), 10)
    assert result.status == "skipped" and "0.31.0" in result.note


def test_releases_are_read_through_their_naming():
    assert offload.load(resolve_source("vllm", version="0.29.0")).naming is OLD_NAMES
    assert offload.load(resolve_source("vllm", version="0.30.0")).naming is NEW_NAMES


def test_the_rename_is_behaviour_preserving_on_the_real_releases():
    """vLLM 0.29.0 (old names) and 0.30.0 (new names), LRU and ARC, store_threshold 1: equal traces; the two
    changes 0.30.0 made beside the rename are told apart by their directed programs."""
    result = _run("offload_rename", resolve_source("vllm", version="0.30.0"), 200)
    assert result.status == "conforms" and result.divergent == 0 and result.compared > 5000, result.divergences
    assert "ARC evict falls back to T1 when T2 has no idle key: differs at prepare_store([5], 0): returned None " \
           "vs ([5], [2], [2])" in result.note
    assert "the admission tracker no longer evicts the offer's own keys: differs at prepare_store([0, 1], 0)" \
        in result.note


def test_the_rename_target_refuses_an_old_names_release_and_a_later_one(v033):
    result = _run("offload_rename", resolve_source("vllm", version="0.29.0"), 10)
    assert result.status == "skipped" and "old names" in result.note
    result = _run("offload_rename", v033, 10)
    assert result.status == "skipped" and "--version 0.30.0" in result.note
