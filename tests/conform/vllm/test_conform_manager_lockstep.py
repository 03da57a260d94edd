"""kvsim conform vllm --target kv_cache_manager_lockstep: the real released KVCacheManager (imported in a child,
`kvsim.conform.installed_child`) in lockstep with the kv-cache-manager model, on 0.33.0 and 0.26.0 (lookahead
slots and the hybrids' groups drawn: sliding window, Mamba, chunked local attention); the planted regressions loaded into the running child (a mutant of the release's module) each end
as a shrunk program. One child per release for the whole session (`installed_child.shared`); the runs are
derandomized."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from kvsim.conform.installed_child import Swap, module_name
from kvsim.conform.loader import mutated
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.engine.conformance.mutants import Mutant, planted as planted_mutant

DEV = os.environ.get("KVSIM_PROFILE") == "dev"
EXAMPLES = 1000 if DEV else 60
PLANTED_EXAMPLES = 200 if DEV else 100
TARGET = "kv_cache_manager_lockstep"
CORE = "vllm/v1/core/"


@pytest.fixture(scope="module", params=("0.33.0", "0.26.0"))
def release(request):  # type: ignore[no-untyped-def]
    return resolve_source("vllm", version=request.param)


def _target():  # type: ignore[no-untyped-def]
    return select_targets("vllm", TARGET)[0]


def planted(source, relpath, after, original, replacement):  # type: ignore[no-untyped-def]
    """A mutant of the release's file: the first `original` after `after`, made `replacement`."""
    return planted_mutant(source.file(relpath).read_text(), relpath, after, original, replacement)


def _run_planted(source, mutant, examples=PLANTED_EXAMPLES):  # type: ignore[no-untyped-def]
    with mutated(mutant):
        result = run_target(_target(), source, RunOptions(max_examples=examples))
    assert result.status == "diverges" and result.divergent == 1, (result.status, result.note)
    return result.divergences[0]


def test_the_real_manager_conforms(release):  # type: ignore[no-untyped-def]
    result = run_target(_target(), release, RunOptions(max_examples=EXAMPLES))
    assert result.status == "conforms", (result.note, result.divergences)
    assert result.compared >= 4 * EXAMPLES, result.compared  # the start and at least three calls a program
    # the directed programs: a hash cached under two blocks, one or both evicted; chunk boundaries crossed
    assert {p["property"]: p["status"] for p in result.properties} == {
        "hash_cached_twice_keeps_its_other_block": "holds", "hash_cached_twice_evicted_twice": "holds",
        "chunk_boundary_frees_the_last_chunk": "holds", "one_token_lookup_hits_the_null_chunk": "holds"}


def test_a_shared_block_whose_count_is_not_decremented(release):  # type: ignore[no-untyped-def]
    """`free_blocks` decrements only a count of 1: a block two requests hold keeps 2 after one frees it. (Three
    times the budget: it needs two requests of one prompt family, and half the programs are hybrids of five kinds;
    0.26.0's derandomized search reaches it between 200 and 300 programs.)"""
    found = _run_planted(release, planted(release, CORE + "block_pool.py", "def free_blocks", "block.ref_cnt -= 1",
                                          "block.ref_cnt -= block.ref_cnt < 2"), 3 * PLANTED_EXAMPLES)
    program = found["program"]
    assert found["field"].startswith("ref_cnt["), found
    # two requests share a block, then one ends: the shortest program that reaches it
    assert sum(line.startswith("step(schedule(") for line in program) == 2, program
    assert program[-1].startswith(("step(finish(", "step(preempt(", "step(decode(")), program
    assert len(program) <= 5, program


def test_cached_blocks_freed_to_the_wrong_end_of_the_queue(release):  # type: ignore[no-untyped-def]
    """`free_blocks` puts cached blocks at the front (evicted first) instead of the back."""
    found = _run_planted(release, planted(release, CORE + "block_pool.py", "def free_blocks",
                                          "self.free_block_queue.append_n(", "self.free_block_queue.prepend_n("))
    assert found["field"].startswith("free"), found
    # a request that fills a block and is freed (here: it samples its last token in the step it is scheduled)
    assert found["program"][1:] == ["step(schedule(req=0))"], found["program"]


def test_a_hit_one_block_too_long(release):  # type: ignore[no-untyped-def]
    """`get_computed_blocks` lets the hit cover the whole prompt (no last token left to compute)."""
    found = _run_planted(release, planted(release, CORE + "kv_cache_manager.py", "def get_computed_blocks",
                                          "max_cache_hit_length = request.num_tokens - 1",
                                          "max_cache_hit_length = request.num_tokens"))
    program = found["program"]
    assert found["field"].startswith("returned.hit"), found
    # one request caches a prompt, a second with the same prompt hits it whole
    assert "prompts=[0, 0]" in program[0], program
    assert program[1:] == ["step(schedule(req=0))", "step(schedule(req=1))"], program


def test_lookahead_slots_left_out(release):  # type: ignore[no-untyped-def]
    """`allocate_slots` gives no slot to `num_lookahead_tokens`: a program drawing lookahead slots diverges (the
    model asks for more blocks than the release takes)."""
    found = _run_planted(release, planted(release, CORE + "kv_cache_manager.py", "def allocate_slots",
                                          "num_tokens_main_model + num_lookahead_tokens", "num_tokens_main_model"))
    program = found["program"]
    assert "lookahead=0" not in program[0] and "lookahead=" in program[0], program
    assert program[1:] == ["step(schedule(req=0))"], program


def test_a_sliding_window_that_skips_one_token_too_many(release):  # type: ignore[no-untyped-def]
    """`SlidingWindowManager.get_num_skipped_tokens` skips the window's first token too (`+ 1` made `+ 2`): a block
    the window still reads is freed (or replaced by the null block) early; a hybrid program with a sliding-window
    group diverges on what it holds."""
    found = _run_planted(release, planted(release, CORE + "single_type_kv_cache_manager.py",
                                          "class SlidingWindowManager", "num_computed_tokens - self.sliding_window + 1",
                                          "num_computed_tokens - self.sliding_window + 2"))
    assert "groups='full,swa" in found["program"][0], found["program"]
    assert len(found["program"]) <= 6, found["program"]


def test_a_chunk_boundary_off_by_one(release):  # type: ignore[no-untyped-def]
    """`ChunkedLocalAttentionManager.get_num_skipped_tokens` rounds `num_computed_tokens - 1` down to the chunk: at
    a chunk boundary the last chunk's blocks are kept (freed a step late). The directed program across two
    boundaries fails on every release; a random program that diverges is a chunked-local one, shrunk."""
    mutant = planted(release, CORE + "single_type_kv_cache_manager.py", "class ChunkedLocalAttentionManager",
                     "num_computed_tokens // self.attention_chunk_size",
                     "(num_computed_tokens - 1) // self.attention_chunk_size")
    with mutated(mutant):
        result = run_target(_target(), release, RunOptions(max_examples=PLANTED_EXAMPLES))
    assert result.status == "diverges", (result.status, result.note)
    failed = {p["property"]: p["message"] for p in result.properties if p["status"] == "fails"}
    assert set(failed) == {"chunk_boundary_frees_the_last_chunk"}, result.properties
    assert "after step 3 decode(req=0)" in failed["chunk_boundary_frees_the_last_chunk"], failed  # the 2nd boundary
    for found in result.divergences:  # the random search's luck within the budget (0.33.0's finds one)
        assert "groups='full,local'" in found["program"][0], found["program"]
        assert len(found["program"]) <= 6, found["program"]


# cascade attention's common prefix, as each release counts it: 0.26.0 counts the blocks every request holding
# blocks holds (made: every held block); 0.33.0 answers zeros (made: ones)
COMMON_PREFIX_PLANTS = {
    "0.26.0": ("single_type_kv_cache_manager.py", "blocks = self.req_to_blocks[running_request_id]",
               "block.ref_cnt == len(self.req_to_blocks)", "block.ref_cnt >= 1"),
    "0.33.0": ("kv_cache_manager.py", "def get_num_common_prefix_blocks", "[0] * self.num_kv_cache_groups",
               "[1] * self.num_kv_cache_groups"),
}


def test_a_common_prefix_miscounted(release):  # type: ignore[no-untyped-def]
    """`get_num_common_prefix_blocks` is compared after every step, as the release counts it (before 0.32.0 the
    shared leading blocks, zeros from 0.32.0): a planted miscount ends as a shrunk program."""
    file, after, original, replacement = COMMON_PREFIX_PLANTS[release.version]
    found = _run_planted(release, planted(release, CORE + file, after, original, replacement))
    assert found["field"].startswith("common"), found
    assert len(found["program"]) <= 6, found["program"]  # the configuration and at most five steps


def test_a_hash_cached_twice_loses_its_other_block(release):  # type: ignore[no-untyped-def]
    """The cached map drops a hash's entry when one of its two blocks is evicted (`len(blocks) > 1` for `> 0`): the
    directed program whose other block must still hit fails; random programs rarely cache one hash twice."""
    mutant = planted(release, CORE + "block_pool.py", "    def pop(", "if len(blocks) > 0:", "if len(blocks) > 1:")
    with mutated(mutant):
        result = run_target(_target(), release, RunOptions(max_examples=PLANTED_EXAMPLES))
    assert result.status == "diverges", (result.status, result.note)
    failed = {p["property"]: p["message"] for p in result.properties if p["status"] == "fails"}
    assert "hash_cached_twice_keeps_its_other_block" in failed, result.properties
    assert "schedule(req=1)" in failed["hash_cached_twice_keeps_its_other_block"], failed


def test_a_one_token_lookup_that_reads_the_chunk_it_should_skip(release):  # type: ignore[no-untyped-def]
    """`ChunkedLocalAttentionManager.find_longest_cache_hit` with `if max_length > 0` made `> 1`: a lookup of one
    token in one-token chunks starts the chunk at 0 and takes the cached local block where the null block belongs.
    The directed program (run alone on the release's child, the mutant loaded, then the release put back) tells it
    at the second schedule of the prompt; random programs rarely draw that chunk, block size and prompt length."""
    from types import SimpleNamespace

    from kvsim.conform.installed import prepare
    from kvsim.conform.installed_child import shared
    from kvsim.conform.vllm.manager_lockstep import DRIVER, PROBES

    (probe,) = [p for p in PROBES if p.name == "one_token_lookup_hits_the_null_chunk"]
    child = shared(prepare("vllm", release.version), DRIVER, timeout=600.0)
    ctx = SimpleNamespace(child=child, source=release)
    child.configure(planted(release, CORE + "single_type_kv_cache_manager.py", "class ChunkedLocalAttentionManager",
                            "if max_length > 0:", "if max_length > 1:"))
    try:
        message = probe.check(ctx)
    finally:
        child.configure(None)
    assert message is not None and "after step 3 schedule(req=2): returned" in message, message
    assert "'hit': [[1], [0]]" in message, message  # the model's: the null block for the chunked-local group
    assert probe.check(ctx) is None


def test_a_mutant_of_a_class_vllm_keeps_in_a_registry(release):  # type: ignore[no-untyped-def]
    """The full-attention manager's class reaches the coordinator through vLLM's spec registry (0.33.0's
    `KVCacheSpecRegistry`: frozen records in a dict), not an import: the swapped module's class replaces it there too,
    so a mutant of `find_longest_cache_hit` (the hit's block count rounded up) is the manager the lockstep runs."""
    found = _run_planted(release, planted(release, CORE + "single_type_kv_cache_manager.py",
                                          "    def find_longest_cache_hit", "max_length // block_size",
                                          "-(-max_length // block_size)"))
    assert found["field"].startswith("returned.hit"), found


def test_the_child_puts_the_released_module_back_after_a_mutant(release):  # type: ignore[no-untyped-def]
    """A mutant is undone in the running child: the next run without one conforms (derandomized: the same
    programs that the planted runs failed on)."""
    bad = planted(release, CORE + "block_pool.py", "def free_blocks", "self.free_block_queue.append_n(",
                  "self.free_block_queue.prepend_n(")
    _run_planted(release, bad)
    result = run_target(_target(), release, RunOptions(max_examples=20))
    assert result.status == "conforms", (result.note, result.divergences)


def test_a_mutant_that_does_not_load_is_one_line(release):  # type: ignore[no-untyped-def]
    """A changed module that raises when the child executes it: the target errs (a mutation run's "not loadable"),
    in one line, and the child keeps the released module."""
    text = release.file(CORE + "block_pool.py").read_text()
    start = text.index("class BlockPool")
    raises = Mutant(CORE + "block_pool.py", "BlockPool", "planted", text.count("\n", 0, start) + 1, start, start + 5,
                    "class", "raise ValueError('planted')\nclass")
    with mutated(raises):
        result = run_target(_target(), release, RunOptions(max_examples=5))
    assert result.status == "error" and "ValueError: planted" in result.note and "\n" not in result.note, result.note
    assert run_target(_target(), release, RunOptions(max_examples=5)).status == "conforms"


def test_a_tree_without_a_version_is_skipped_with_the_reason(release):  # type: ignore[no-untyped-def]
    tree = replace(release, version=None, origin=f"tree {release.root}")  # a working tree: no release to import
    result = run_target(_target(), tree, RunOptions(max_examples=5))
    assert result.status == "skipped" and "needs a release" in result.note, result.note


def test_a_swap_rebinds_every_importer_and_undoes_it() -> None:
    """The child's module swap, on a module of kvsim's own: the importer's name follows the new definition and
    comes back on undo."""
    import kvsim.engine.conformance.mutants as target
    import kvsim.conform.mutate as importer

    released = target.sample
    swap = Swap()
    text = open(target.__file__, encoding="utf-8").read().replace("def sample(", "def sample(*a, **k):\n"
                                                                   "    return 'planted'\n\n\ndef _sample(")
    swap.apply(target, text, target.__file__)
    try:
        assert importer.sample is target.sample and importer.sample([], 0) == "planted"
    finally:
        swap.undo()
    assert importer.sample is released and target.sample is released
    assert module_name("vllm/v1/core/block_pool.py") == "vllm.v1.core.block_pool"


def test_a_swap_reaches_a_subclass_in_another_module(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A mutant of a class another module subclasses (vLLM's `Scheduler`, which the driver builds as
    `AsyncScheduler`) is what the subclass inherits, and the released class again after undo."""
    import importlib
    import sys

    package = tmp_path / "swaptoy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("class Base:\n    def f(self):\n        return 1\n")
    (package / "sub.py").write_text("from swaptoy.base import Base\n\n\nclass Sub(Base):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        base, sub = importlib.import_module("swaptoy.base"), importlib.import_module("swaptoy.sub")
        swap = Swap()
        swap.apply(base, "class Base:\n    def f(self):\n        return 2\n", str(package / "base.py"))
        try:
            assert sub.Sub().f() == 2 and sub.Sub.__bases__ == (base.Base,)
        finally:
            swap.undo()
        assert sub.Sub().f() == 1
    finally:
        for name in ("swaptoy.sub", "swaptoy.base", "swaptoy"):
            sys.modules.pop(name, None)
