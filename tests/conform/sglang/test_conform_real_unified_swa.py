"""SGLang's real UnifiedRadixCache with its Full and SWA components (kvsim.conform.sglang.real_unified_swa), 0.5.13
and 0.5.14, in lockstep with the radix-cache-swa model (kvsim.conform.sglang.unified_swa_lockstep): every tree call
a model step makes, made on the real tree, answers and trees compared; #28161 read on the real tree's lock counts.
Slow: one child per release, each importing the release (about a minute each on two cores)."""

from __future__ import annotations

import random

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import shared
from kvsim.conform.sglang.unified_swa_lockstep import DRIVER, RELEASES, Diverged, Lockstep

pytestmark = pytest.mark.slow

PATH_28161 = [("admit", 0), ("decode", 0), ("decode", 0)]
SMALL = {"prompts": "0,1,0", "sliding_window_size": 1, "num_swa_slots": 4, "num_slots": 5, "max_tokens": 2}
CONFIGS = [{}, SMALL, {**SMALL, "num_slots": 4}]  # the model tests' default, TOMBSTONES and PRESSURE


@pytest.fixture(scope="module", params=sorted(RELEASES))
def release(request):  # type: ignore[no-untyped-def]
    return request.param, shared(prepare("sglang", request.param), DRIVER, timeout=600.0)


def test_28161_on_the_real_tree(release):  # type: ignore[no-untyped-def]
    version, child = release
    verdicts = Lockstep(child, RELEASES[version]).run(PATH_28161)
    assert all(v["lock_order"] is None and v["full_lock_refs"] is None for v in verdicts)
    assert [v["swa_lock_within_window"] is None for v in verdicts[:2]] == [True, True]
    last = verdicts[2]["swa_lock_within_window"]
    if version == "0.5.13":  # no dec_swa_lock_only: the window stays SWA-locked past the window
        assert last.startswith("node [1, 1, 2]: swa lock_ref 1, but only 0 running requests")
    else:
        assert last is None


@pytest.mark.parametrize("values", CONFIGS)
def test_random_walks_run_in_lockstep_to_the_end(release, values):  # type: ignore[no-untyped-def]
    version, child = release
    for seed in range(3):
        rng, step = random.Random(seed), Lockstep(child, RELEASES[version], values)
        while step.system.enabled(step.state):
            step.run([rng.choice(step.system.enabled(step.state))])
        assert step.system.done(step.state)


def test_the_lockstep_fails_on_the_other_variant(release):  # type: ignore[no-untyped-def]
    version, child = release
    other, ran = ("fixed", True) if RELEASES[version] == "pre_28161" else ("pre_28161", False)
    with pytest.raises(Diverged, match=rf"^step 2 .*: release_window\(\(1, 1, 2\), 1\): model {ran}, real {not ran}$"):
        Lockstep(child, other).run(PATH_28161)
