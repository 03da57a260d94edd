"""kvsim conform sglang --target radix_cache_lockstep: SGLang's real RadixCache and paged allocator (imported in a
child, `kvsim.conform.installed_child`) in lockstep with the radix-cache model on 0.5.23; the planted regressions
loaded into the running child (a mutant of the release's module) each end as a shrunk program naming the field
that differs. One child for the whole session (`installed_child.shared`); the runs are derandomized."""

from __future__ import annotations

import os

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import shared
from kvsim.conform.loader import mutated
from kvsim.conform.sglang.radix_lockstep import DRIVER
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.engine.conformance.mutants import planted as planted_mutant

DEV = os.environ.get("KVSIM_PROFILE") == "dev"
EXAMPLES = 500 if DEV else 40
PLANTED_EXAMPLES = 200 if DEV else 60
TARGET = "radix_cache_lockstep"
MEM = "sglang/srt/mem_cache/"


@pytest.fixture(scope="module")
def release():  # type: ignore[no-untyped-def]
    return resolve_source("sglang", version="0.5.23")


def _target():  # type: ignore[no-untyped-def]
    return select_targets("sglang", TARGET)[0]


def planted(source, relpath, after, original, replacement):  # type: ignore[no-untyped-def]
    """A mutant of the release's file: the first `original` after `after`, made `replacement`."""
    return planted_mutant(source.file(relpath).read_text(), relpath, after, original, replacement)


def _planted_result(source, mutant):  # type: ignore[no-untyped-def]
    """The target's run with `mutant` loaded; the shared child gets the released module back after it (the driver's
    own tests call that child directly, outside a target run that would configure it)."""
    try:
        with mutated(mutant):
            return run_target(_target(), source, RunOptions(max_examples=PLANTED_EXAMPLES))
    finally:
        shared(prepare("sglang", source.version), DRIVER, timeout=600.0).configure()


def _run_planted(source, mutant):  # type: ignore[no-untyped-def]
    result = _planted_result(source, mutant)
    assert result.status == "diverges" and result.divergent == 1, (result.status, result.note)
    return result.divergences[0]


def _probe_failure(source, mutant, probe):  # type: ignore[no-untyped-def]
    """The message of the directed program `probe` with `mutant` loaded (the random programs cut to one: the
    directed program's reach is the point)."""
    try:
        with mutated(mutant):
            result = run_target(_target(), source, RunOptions(max_examples=1))
    finally:
        shared(prepare("sglang", source.version), DRIVER, timeout=600.0).configure()
    failed = {p["property"]: p["message"] for p in result.properties if p["status"] == "fails"}
    assert probe in failed, result.properties
    return failed[probe]


def test_the_real_radix_cache_conforms(release):  # type: ignore[no-untyped-def]
    result = run_target(_target(), release, RunOptions(max_examples=EXAMPLES))
    assert result.status == "conforms", (result.note, result.divergences)
    assert result.compared >= 3 * EXAMPLES, result.compared  # the start and at least two steps a program
    assert {p["property"]: p["status"] for p in result.properties} == {
        "evicts_the_least_recently_used_leaf": "holds", "readmitted_after_eviction_splits_at_the_prompt": "holds",
        "staged_pages_wait_while_the_bound_is_met": "holds", "insert_ends_where_the_child_repeats_the_page": "holds",
        "locked_parent_left_childless_stays_cached": "holds", "parent_evicted_once_after_its_last_child": "holds",
        "paged_decode_at_page_size_1_takes_no_page": "holds"}


# (file, after, original, replacement, the directed program that catches it, where): each a reach only that program
# has. The prompt's re-insert skipped: only a readmission after an eviction reaches that split (a fresh request's
# prompt is cached, split there, by its prefill's checkpoint). A retract that checkpoints: the page its row holds
# past its checkpoint (the prompt's last token and the first output) enters the tree. The extend's page bound
# rounded up: met exactly by the free pages, it merges the staged page and takes it first. The eviction's parent
# push without its lock test: a locked node left childless is evicted under the running request holding it (only a
# fourth request's demand, past the locked node's child, reaches it); without its childless test: a parent whose
# other child is still cached is pushed, and pushed again after that child, then freed twice (only a prompt of
# another length than its family's makes a parent the evicting request does not lock).
EVICT_PUSH = "if len(x.parent.children) == 0 and x.parent.lock_ref == 0:"
DIRECTED = {
    "prompt_not_split": ("radix_cache.py", "    def _insert_cache(", "if split_prompt:", "if False:",
                         "readmitted_after_eviction_splits_at_the_prompt", "after step 12 admit(req=1): tree"),
    "retract_checkpoints": ("common.py", "def release_kv_cache(",
                            "checkpoint = checkpoint and not req.skip_radix_cache_insert",
                            "checkpoint = not req.skip_radix_cache_insert",
                            "readmitted_after_eviction_splits_at_the_prompt", "after step 6 retract(req=1): tree"),
    "bound_rounded_up": ("allocator/paged.py", "    def alloc_extend(", "extend_num_tokens // self.page_size + bs + 1",
                         "-(-extend_num_tokens // self.page_size) + bs + 1",
                         "staged_pages_wait_while_the_bound_is_met", "after step 2 admit(req=1): returned"),
    "locked_parent_pushed": ("radix_cache.py", "    def evict(", EVICT_PUSH, "if len(x.parent.children) == 0:",
                             "locked_parent_left_childless_stays_cached", "after step 8 admit(req=3): returned"),
    "parent_with_children_pushed": ("radix_cache.py", "    def evict(", EVICT_PUSH, "if x.parent.lock_ref == 0:",
                                    # the parent's second pop: _delete_leaf finds it gone
                                    "parent_evicted_once_after_its_last_child", "parent does not have child key"),
}


@pytest.mark.parametrize("name", sorted(DIRECTED))
def test_a_directed_program_catches(release, name):  # type: ignore[no-untyped-def]
    relpath, after, original, replacement, probe, where = DIRECTED[name]
    message = _probe_failure(release, planted(release, MEM + relpath, after, original, replacement), probe)
    assert where in message, message


def test_frees_in_a_group_released_at_once(release):  # type: ignore[no-untyped-def]
    """`free_page_ids` ignores the free group: a finishing request's release puts its row's tail in front of the
    duplicate pages its checkpoint freed, where the group keeps them in call order."""
    found = _run_planted(release, planted(release, MEM + "allocator/paged.py", "    def free_page_ids(",
                                          "self.free_page_ids_group.append(self._copy_for_free_group(page_ids))",
                                          "self._release_page_ids(page_ids)"))
    assert found["field"].startswith("free_pages"), found
    assert found["program"][-1].startswith("step(decode(") or found["program"][-1].startswith("step(admit("), found


def test_the_final_token_keyed_past_the_owned_kv(release):  # type: ignore[no-untyped-def]
    """`checkpoint` keys one token more than it is asked: a finishing request's release, whose sampled token is
    appended first as the scheduler does, keys a page whose last slot the request never allocated."""
    found = _run_planted(release, planted(release, MEM + "radix_cache.py", "    def checkpoint(",
                                          "req.full_untruncated_fill_ids[:up_to]",
                                          "req.full_untruncated_fill_ids[: up_to + 1]"))
    assert found["field"].startswith("tree"), found
    assert len(found["program"]) == 2, found["program"]  # one admit whose prefill finishes the request


def test_a_request_row_never_given_back(release):  # type: ignore[no-untyped-def]
    """`release_kv_cache` keeps the request's row of the request pool (SchedulerInvariantChecker's `_check_req_pool`
    leak): the pool's free rows differ from the model's after the first release."""
    found = _run_planted(release, planted(release, MEM + "common.py", "def release_kv_cache(",
                                          "tree_cache.req_to_token_pool.free(req)", "None"))
    assert found["field"] == "req_slots", found
    assert found["program"][1:] == ["step(admit(req=0))"], found["program"]  # a request finished by its prefill


def test_a_lock_count_not_decremented_at_the_top_of_the_path(release):  # type: ignore[no-untyped-def]
    """`dec_lock_ref` skips the node under the root: it keeps its count (and stays protected)."""
    found = _run_planted(release, planted(release, MEM + "radix_cache.py", "    def dec_lock_ref(",
                                          "node.lock_ref -= 1", "node.lock_ref -= node.parent is not self.root_node"))
    # the lock_ref of the first node: one request, released in the step that admits it, leaves it locked
    assert found["field"] == "tree[0][3]", found
    assert found["program"][1:] == ["step(admit(req=0))"], found["program"]


def test_eviction_from_the_wrong_end_of_the_lru(release):  # type: ignore[no-untyped-def]
    """`evict` takes the most recently used leaf first: the directed program whose third request must evict the
    first's leaf fails, naming the tree; random programs rarely leave two leaves of which one is evicted."""
    mutant = planted(release, MEM + "radix_cache.py", "    def evict(",
                     "(self.eviction_strategy.get_priority(node), node)",
                     "(-self.eviction_strategy.get_priority(node), node)")
    result = _planted_result(release, mutant)
    assert result.status == "diverges", (result.status, result.note)
    failed = {p["property"]: p["message"] for p in result.properties if p["status"] == "fails"}
    # the directed programs that evict one leaf of several fail too: the readmission's third request must take the
    # retracted one's prompt, and the parent-push programs' last request must begin with the oldest leaf
    assert set(failed) == {"evicts_the_least_recently_used_leaf", "readmitted_after_eviction_splits_at_the_prompt",
                           "locked_parent_left_childless_stays_cached", "parent_evicted_once_after_its_last_child"}, \
        result.properties
    assert "after step 3 admit(req=2): returned" in failed["evicts_the_least_recently_used_leaf"], failed


def test_a_locked_leaf_evictable(release):  # type: ignore[no-untyped-def]
    """`_update_leaf_status` lists a locked leaf as evictable: a decode's eviction frees a running request's leaf
    (the tree loses a locked node; its page is free while the request's row holds it)."""
    found = _run_planted(release, planted(release, MEM + "radix_cache.py", "    def _update_leaf_status(",
                                          "if node.evicted or node.lock_ref > 0:", "if node.evicted:"))
    assert found["field"].startswith(("tree", "free_pages")), found
    assert found["program"][-1].startswith("step(decode("), found["program"]
    assert len(found["program"]) <= 6, found["program"]


def test_an_evicted_page_freed_twice(release):  # type: ignore[no-untyped-def]
    """`evict` frees each leaf's pages twice."""
    found = _run_planted(release, planted(release, MEM + "radix_cache.py", "    def evict(",
                                          "num_evicted += len(x.value)",
                                          "num_evicted += len(x.value)\n            "
                                          "self.token_to_kv_pool_allocator.free_segment(x.value, start_pos=0)"))
    # the second request's demand evicts the first's cached page: freed twice, it is handed out twice (or listed
    # twice in the free pages)
    assert found["field"].startswith(("returned.new", "free_pages")), found
    assert found["program"][1:] == ["step(admit(req=0))", "step(admit(req=1))"], found["program"]


def test_an_older_release_is_skipped_with_the_reason() -> None:
    """0.5.16-0.5.22 have the allocation module but not 0.5.23's request life cycle: skipped, with the reason;
    before 0.5.16 the declared allocation module is absent: not present."""
    result = run_target(_target(), resolve_source("sglang", version="0.5.20"), RunOptions(max_examples=5))
    assert result.status == "skipped" and "predates the request life cycle" in result.note, result.note
    result = run_target(_target(), resolve_source("sglang", version="0.5.14"), RunOptions(max_examples=5))
    assert result.status == "not present" and "allocation.py: absent" in result.note, result.note
