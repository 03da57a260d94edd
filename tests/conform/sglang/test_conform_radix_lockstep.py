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


def test_the_real_radix_cache_conforms(release):  # type: ignore[no-untyped-def]
    result = run_target(_target(), release, RunOptions(max_examples=EXAMPLES))
    assert result.status == "conforms", (result.note, result.divergences)
    assert result.compared >= 3 * EXAMPLES, result.compared  # the start and at least two steps a program
    assert {p["property"]: p["status"] for p in result.properties} == {
        "evicts_the_least_recently_used_leaf": "holds", "paged_decode_at_page_size_1_takes_no_page": "holds"}


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
    assert set(failed) == {"evicts_the_least_recently_used_leaf"}, result.properties
    assert "after step 3 admit(req=2): returned" in failed["evicts_the_least_recently_used_leaf"], failed


def test_a_locked_leaf_evictable(release):  # type: ignore[no-untyped-def]
    """`_update_leaf_status` lists a locked leaf as evictable: a decode's eviction frees a running request's leaf,
    whose slots its release's checkpoint puts back into the tree: the page is both free and cached."""
    found = _run_planted(release, planted(release, MEM + "radix_cache.py", "    def _update_leaf_status(",
                                          "if node.evicted or node.lock_ref > 0:", "if node.evicted:"))
    assert found["field"].startswith("free_pages"), found
    assert found["program"][-1].startswith("step(decode("), found["program"]
    assert len(found["program"]) <= 5, found["program"]


def test_an_evicted_page_freed_twice(release):  # type: ignore[no-untyped-def]
    """`evict` frees each leaf's pages twice."""
    found = _run_planted(release, planted(release, MEM + "radix_cache.py", "    def evict(",
                                          "num_evicted += len(x.value)",
                                          "num_evicted += len(x.value)\n            "
                                          "self.token_to_kv_pool_allocator.free_segment(x.value, start_pos=0)"))
    assert found["field"] == "free_pages[0]", found
    # two requests of one prompt and a pool of two pages: the second's demand evicts the first's cached page
    assert found["program"][1:] == ["step(admit(req=0))", "step(admit(req=1))"], found["program"]


def test_an_older_release_is_skipped_with_the_reason() -> None:
    """0.5.16-0.5.22 have the allocation module but not 0.5.23's request life cycle: skipped, with the reason;
    before 0.5.16 the declared allocation module is absent: not present."""
    result = run_target(_target(), resolve_source("sglang", version="0.5.20"), RunOptions(max_examples=5))
    assert result.status == "skipped" and "predates the request life cycle" in result.note, result.note
    result = run_target(_target(), resolve_source("sglang", version="0.5.14"), RunOptions(max_examples=5))
    assert result.status == "not present" and "allocation.py: absent" in result.note, result.note
