"""kvsim conform vllm: the CPU offloading manager in lockstep with the kv-offload model (vLLM 0.33.0), and the
#52615 rename on the real code (vLLM 0.29.0, the old names, against 0.30.0, the new names)."""

from __future__ import annotations

import os
import shutil

import pytest

from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.conform.vllm import offload
from kvsim.models.kv_offload import context, policies
from kvsim.models.kv_offload.conform import ARC
from kvsim.models.kv_offload.conform import MANAGER as RELPATH
from kvsim.models.kv_offload.manager import CPUOffloadingManager
from kvsim.models.kv_offload.names import NEW_NAMES, OLD_NAMES


def _run(name, source, n):  # type: ignore[no-untyped-def]
    return run_target(select_targets("vllm", name)[0], source, RunOptions(max_examples=n))


@pytest.fixture(scope="module")
def v033():  # type: ignore[no-untyped-def]
    return resolve_source("vllm", version="0.33.0")


def _planted(tmp_path, source, old, new, relpath=RELPATH):  # type: ignore[no-untyped-def]
    """A copy of the release tree with one line of the manager (or `relpath`) changed (hard links, the file
    replaced)."""
    tree = tmp_path / "vllm-planted"
    shutil.copytree(source.root, tree, copy_function=os.link)
    target = tree / relpath
    text = target.read_text()
    assert text.count(old) == 1, old
    target.unlink()  # hard link: replace the file, never write through to the cache
    target.write_text(text.replace(old, new))
    return resolve_source("vllm", from_path=str(tree))


def test_lockstep_conforms_and_runs_the_directed_programs(v033):
    """LRU and ARC, several requests, every return value, the events, counters, slots and policy order."""
    result = _run("CPUOffloadingManager", v033, 30)
    assert result.status == "conforms" and result.divergent == 0, result.divergences
    assert result.compared >= 30 * 40, result.compared
    assert "vllm >= 0.30.0 (#52615)" in result.note
    assert {p["property"]: p["status"] for p in result.properties} == dict.fromkeys((
        "arc_evict_falls_back_to_t1", "lru_evict_skips_a_repinned_entry", "lru_compacts_its_heap",
        "failed_store_removal_event", "failed_store_without_events", "arc_b2_ghost_hit_lowers_the_target",
        "stale_request_finished", "lru_ranks_one_call_in_order", "lru_evict_skips_a_pinned_entry",
        "arc_finish_of_an_evicted_reused_key", "arc_finish_keeps_a_key_it_only_saw", "arc_evict_skips_the_offer",
        "arc_two_evictions_track_t1", "arc_two_evictions_from_t1_above_target", "one_chunk_write_usage",
        "arc_failed_store_of_a_t2_key", "arc_b2_ghost_stored_again", "arc_promotions_ghost_hits_failed_store",
        "full_tracker_drops_its_oldest", "lru_evicts_a_request_tail_first", "lru_request_access_raises_a_rank",
        "arc_finishes_in_position_order", "lru_request_rank_renewed_after_a_reset"), "holds")
    assert "contexts with key positions" in result.note


def test_a_model_blind_to_positions_diverges_on_positioned_contexts(v033, monkeypatch):
    """The model as it was before positions (every context answers None): the random programs with positions
    diverge, and the three directed programs with positions fail."""
    monkeypatch.setattr(context.ReqContext, "get_offload_key_position", lambda self, key: None)
    result = _run("CPUOffloadingManager", v033, 30)
    assert result.status == "diverges" and result.divergent == 1
    assert "positions=((" in result.divergences[0]["program"][0], result.divergences[0]["program"]
    failing = {p["property"] for p in result.properties if p["status"] == "fails"}
    assert failing == {"lru_evicts_a_request_tail_first", "lru_request_access_raises_a_rank",
                       "arc_finishes_in_position_order"}, result.properties


def test_positions_are_drawn_only_where_the_lru_ranks_by_them():
    assert offload.load_release(resolve_source("vllm", version="0.33.0")).positional
    assert not offload.load_release(resolve_source("vllm", version="0.32.0")).positional


def test_the_lockstep_catches_a_model_change(v033, monkeypatch):
    """A model with 0.29.0's LRU touch (evictable keys only) diverges, shrunk to a short program."""
    def touch(self, keys):  # type: ignore[no-untyped-def]
        self._update_recency([k for k in reversed(list(keys)) if k in self.chunks and self.chunks[k].ref_cnt == 0])

    monkeypatch.setattr(policies.LRUCachePolicy, "touch", touch)
    result = _run("CPUOffloadingManager", v033, 30)
    assert result.status == "diverges" and result.divergent == 1
    found = result.divergences[0]
    assert found["program"][-1].startswith("touch(") and len(found["program"]) <= 6, found["program"]
    assert found["field"].startswith("policy.recency"), found["field"]


def test_planted_chunk_not_marked_evictable_again_is_a_shrunk_divergence(tmp_path, v033):
    """The manager's complete_load not marking a chunk evictable again (the issue's planted regression, which the
    old frame reported as an ExceptionGroup error): a divergence with a shrunk program, where a store needs to
    evict the chunk a load released."""
    planted = _planted(tmp_path, v033, "+= 1  # ref_cnt 1 -> 0\n                self._policy.mark_evictable(key)",
                       "+= 1  # ref_cnt 1 -> 0")
    result = _run("CPUOffloadingManager", planted, 30)
    assert result.status == "diverges" and result.divergent == 1, result
    found = result.divergences[0]
    program = found["program"]
    assert program[0].startswith("start(policy='lru'") and len(program) <= 6, program
    assert any(line.startswith(("load_and_complete(", "complete_load(")) for line in program), program
    assert found["difference"] and found["model"] != found["upstream"]
    assert result.subject == "code under test"


def test_planted_upstream_change_makes_the_lockstep_fail(tmp_path, v033):
    """The manager with #35846 reverted (protected = set()) diverges from the model: the loader runs the file."""
    result = _run("CPUOffloadingManager", _planted(tmp_path, v033, "protected = set(keys)", "protected = set()"), 30)
    assert result.status == "diverges" and result.divergent == 1
    assert "prepare_store(" in result.divergences[0]["program"][-1]


@pytest.mark.parametrize("step", ["virtual_t1_size = 1", "virtual_t1_size -= 2"])
def test_planted_first_t1_pick_miscounted_is_caught_by_two_evictions_above_the_target(tmp_path, v033, step):
    """ARC evict's virtual T1 size after its first T1 pick made 1 or decremented twice (two surviving mutants before
    the directed program): with T1 one above the target, the second eviction takes T2's key, not T1's."""
    first_pick = "                    candidate = (*entry, True)\n                    "
    planted = _planted(tmp_path, v033, first_pick + "virtual_t1_size -= 1", first_pick + step, relpath=ARC)
    props = {p["property"]: p for p in _run("CPUOffloadingManager", planted, 5).properties}
    found = props["arc_two_evictions_from_t1_above_target"]
    assert found["status"] == "fails" and "prepare_store([4, 5], 2)" in found["message"], found


def test_planted_missing_failure_event_is_caught_at_a_failed_store(tmp_path, v033):
    """0.31.0's complete_store (no metadata-only removal event on failure), planted into 0.33.0: the lockstep
    reaches failed stores of pending keys and sees the missing event."""
    planted = _planted(tmp_path, v033, "if removed_keys and self.events is not None:", "if False:")
    result = _run("CPUOffloadingManager", planted, 30)
    props = {p["property"]: p for p in result.properties}
    assert result.status == "diverges" and props["failed_store_removal_event"]["status"] == "fails", result
    assert "complete_store([0], 0, False)" in props["failed_store_removal_event"]["message"]
    assert "'events'" in props["failed_store_removal_event"]["message"]
    longer = _run("CPUOffloadingManager", planted, 100)  # random programs reach it too, given more of them
    (found,) = longer.divergences
    assert found["field"].startswith("events") and found["program"][-1].endswith("False)"), found


def test_a_release_before_the_request_scoped_access_is_skipped():
    result = _run("CPUOffloadingManager", resolve_source("vllm", version="0.30.0"), 10)
    assert result.status == "skipped" and "0.31.0" in result.note


def test_releases_are_read_through_their_naming():
    assert offload.naming_of(resolve_source("vllm", version="0.29.0")) is OLD_NAMES
    assert offload.naming_of(resolve_source("vllm", version="0.30.0")) is NEW_NAMES
    assert (OLD_NAMES.chunk_level, NEW_NAMES.chunk_level) == ("block_level", "chunk_level")  # OffloadPolicy's value


def test_the_model_answers_the_request_calls_it_lacked():
    """Model fix (coverage of the lockstep): on_new_request and get_load_source, as 0.33.0 answers them."""
    m = CPUOffloadingManager(2, "lru")
    assert m.on_new_request(7) == "chunk_level" and m.get_load_source(0) == "host"
    assert m.freeze().requests[0][0] == 7  # the request's access record starts at on_new_request


def test_the_rename_is_behaviour_preserving_on_the_real_releases():
    """vLLM 0.29.0 (old names) and 0.30.0 (new names), LRU, store_threshold 1 and 2: equal traces; ARC and a full
    tracker by directed programs; the two changes 0.30.0 made beside the rename told apart by theirs."""
    result = _run("offload_rename", resolve_source("vllm", version="0.30.0"), 30)
    assert result.status == "conforms" and result.divergent == 0 and result.compared > 1000, result.divergences
    assert all(p["status"] == "holds" for p in result.properties), result.properties
    assert "ARC evict falls back to T1 when T2 has no idle key: differs at prepare_store([5], 0): returned None " \
           "vs {'keys_to_store': [5], 'chunk_ids': [2], 'evicted_keys': [2]}" in result.note
    assert "the admission tracker no longer evicts the offer's own keys: differs at prepare_store([0, 1], 0)" \
        in result.note


def test_a_planted_rename_slip_diverges(tmp_path):
    """0.30.0 with one line dropped: a failed store no longer counts its chunk off the write-pending ones."""
    planted = _planted(tmp_path, resolve_source("vllm", version="0.30.0"),
                       "self._num_write_pending_chunks -= 1\n                    self._policy.remove(key)",
                       "self._policy.remove(key)")
    result = _run("offload_rename", planted, 30)
    assert result.status == "diverges" and result.divergent == 1
    assert result.divergences[0]["field"] == "write_pending" and "False)" in result.divergences[0]["program"][-1]


def test_the_rename_target_refuses_an_old_names_release_and_a_later_one(v033):
    result = _run("offload_rename", resolve_source("vllm", version="0.29.0"), 10)
    assert result.status == "skipped" and "old names" in result.note
    result = _run("offload_rename", v033, 10)
    assert result.status == "skipped" and "--version 0.30.0" in result.note


def test_the_lockstep_makes_a_state_dependent_strategy_once_per_state():
    """`completions`, `loads` and `load_completions` draw from what the model holds: equal holdings and requests give
    the one strategy (Hypothesis validates a new one at its first draw), other holdings another, none where nothing
    is held; what it draws stays within what is held."""
    from types import SimpleNamespace

    from hypothesis import find

    def view(refs, active=(0, 1)):  # type: ignore[no-untyped-def]
        chunks = {k: SimpleNamespace(ref_cnt=r) for k, r in refs.items()}
        return SimpleNamespace(m=SimpleNamespace(resident=lambda: dict(chunks)), active=list(active))

    held = {0: -1, 2: -1, 3: 0, 4: 1}
    for make in (offload.completions, offload.loads, offload.load_completions):
        assert make(view(held)) is make(view(dict(held)))
        assert make(view(held)) is not make(view(held, active=(0, 2)))
    assert offload.completions(view(held)) is not offload.completions(view({0: -1}))
    assert offload.loads(view({0: -1})) is None and offload.load_completions(view({3: 0})) is None
    keys, req, _ = find(offload.completions(view(held)), lambda drawn: len(drawn[0]) == 1)
    assert keys in ([0], [2]) and req in (0, 1)
    keys, req = find(offload.loads(view(held)), lambda drawn: len(drawn[0]) == 2)
    assert set(keys) <= {3, 4} and req in (0, 1)
