"""SGLang's real UnifiedRadixCache with its Full and SWA components, and Mamba's
(kvsim.conform.sglang.real_unified_swa), 0.5.13 to 0.5.23, in lockstep with the radix-cache-swa model (target
unified_swa_lockstep, run by the engine): answers and trees compared after every step; #28161 and the Mamba lock's
double release read on the real tree's lock counts after their paths.
Slow: one child per release, each importing the release (about a minute each on two cores)."""

from __future__ import annotations

import json

import pytest

from kvsim.conform import cli
from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import shared
from kvsim.conform.sglang.unified_swa_lockstep import DRIVER, verdicts_on_real

pytestmark = pytest.mark.slow

PATH_28161 = [("admit", 0), ("decode", 0), ("decode", 0)]
VARIANT = {"0.5.13": "pre_28161", "0.5.14": "pre_locked_full_recovery", "0.5.23": "tree_core"}
# the first admit of a second request with req 0's prompt after req 0 finished: its match splits the finished
# leaf's parent and the SWA eviction it needs picks the LRU node, which #38482 (0.5.20) changed
PATH_38482 = [("admit", 0), ("decode", 0), ("decode", 0), ("decode", 0), ("admit", 1)]


@pytest.fixture(scope="module", params=sorted(VARIANT))
def release(request):  # type: ignore[no-untyped-def]
    return request.param, shared(prepare("sglang", request.param), DRIVER, timeout=600.0)


def test_28161_on_the_real_tree(release):  # type: ignore[no-untyped-def]
    version, child = release
    verdicts = verdicts_on_real(child, VARIANT[version], PATH_28161)
    assert all(v["lock_order"] is None and v["full_lock_refs"] is None for v in verdicts)
    assert [v["swa_lock_within_window"] is None for v in verdicts[:2]] == [True, True]
    last = verdicts[2]["swa_lock_within_window"]
    if version == "0.5.13":  # no dec_swa_lock_only: the window stays SWA-locked past the window
        assert last.startswith("node [1, 1, 2]: swa lock_ref 1, but only 0 running requests")
    else:
        assert last is None


def test_the_real_path_differs_from_the_other_variant(release):  # type: ignore[no-untyped-def]
    version, child = release
    if version == "0.5.23":  # the TreeCore's split recency: the older variants evict another node at step 4
        with pytest.raises(AssertionError, match=r"^step 4 .*\['match_prefix', \[1, 2, 3\], \[1, 1, 2\]\].*"
                                                 r"\['match_prefix', \[1, 2, 7\], \[1, 1, 2\]\]"):
            verdicts_on_real(child, "fixed", PATH_38482)
        assert verdicts_on_real(child, "tree_core", PATH_38482)[-1]["lock_order"] is None
        return
    other, ran = ("fixed", True) if VARIANT[version] == "pre_28161" else ("pre_28161", False)
    with pytest.raises(AssertionError, match=rf"^step 2 .*\['release_window', {ran}\].*\['release_window', {not ran}\]"):
        verdicts_on_real(child, other, PATH_28161)


def test_the_lockstep_target_conforms_on_each_release_across_the_fixes(capsys):
    versions = ("0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.23")
    code = cli.main(["sglang", "--versions", ",".join(versions), "--target", "unified_swa_lockstep",
                     "--max-examples", "30", "--json"])
    doc = json.loads(capsys.readouterr().out)
    table = doc["table"]["unified_swa_lockstep"]
    assert {v: r["status"] for v, r in table.items()} == dict.fromkeys(versions, "conforms"), table
    assert code == 0 and all(table[v]["compared"] > 30 for v in versions)


def test_a_planted_early_release_that_keeps_the_lock_is_caught_at_its_step():
    """0.5.23's `release_window_lock` planted not to decrement: the early release at the second decode leaves the
    window SWA-locked, and the lockstep names that step (the tree's lock count, not a crash)."""
    from kvsim.conform.source import resolve_source
    from kvsim.engine.conformance.mutants import planted

    relpath = "sglang/srt/mem_cache/unified_cache/components/swa.py"
    text = resolve_source("sglang", version="0.5.23").file(relpath).read_text()
    child = shared(prepare("sglang", "0.5.23"), DRIVER, timeout=600.0)
    child.configure(planted(text, relpath, "def release_window_lock(", "cd.lock_ref -= 1", "cd.lock_ref -= 0"))
    try:
        kept = (r"^step 2 \('decode', 0\): model .*\[1, 1, 2\], [^}]*'swa_lock_ref': 0"
                r".*real .*\[1, 1, 2\], [^}]*'swa_lock_ref': 1")
        with pytest.raises(AssertionError, match=kept):
            verdicts_on_real(child, "tree_core", PATH_28161)
    finally:
        child.configure()
    assert verdicts_on_real(child, "tree_core", PATH_28161)[2]["swa_lock_within_window"] is None


# the Mamba component: request 0 releases its window early (dropping its Mamba lock on [1, 1, 2] with SWA's),
# request 1 locks the node, request 0 ends (dec_lock_ref with skip_swa)
PATH_MAMBA = [("admit", 0), ("decode", 0), ("decode", 0), ("admit", 1), ("decode", 0)]


def test_the_mamba_lock_released_twice_on_the_real_tree(release):  # type: ignore[no-untyped-def]
    version, child = release
    verdicts = verdicts_on_real(child, VARIANT[version], PATH_MAMBA, {"num_mamba_slots": 4})
    assert all(v["lock_order"] is None and v["full_lock_refs"] is None for v in verdicts)
    mamba = [v["mamba_lock_refs"] for v in verdicts]
    if version == "0.5.14":  # dec_lock_ref(skip_swa=True) skips SWA only: request 1's Mamba lock is taken
        assert mamba[:4] == [None] * 4 and mamba[4].startswith("node [1, 1, 2]: expected mamba lock_ref 1")
    else:  # 0.5.13: no early release at all (the window lock kept); 0.5.23: the final release skips SWA and below
        assert mamba == [None] * 5
        assert (verdicts[2]["swa_lock_within_window"] is None) == (version == "0.5.23")
