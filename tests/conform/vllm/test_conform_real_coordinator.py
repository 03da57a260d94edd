"""vLLM's KV cache coordinator over two groups on the real releases, imported for real and driven in its child
(kvsim.conform.vllm.real_coordinator); #48195 itself is driven through the real scheduler
(test_conform_real_scheduler.py). On the same operations the model (`kvsim.models.kv_cache_manager`) gives the
real per-group hits, reconciled hits, connector hits (0.27.0+'s `get_computed_blocks_for_connector`; none before
it, where the choice is the scheduler's), block ids and free queue on all three, with a sliding window and with
Mamba in the release's prefix-caching mode (`all` on 0.26.0 and 0.27.0, as the child builds it; `align`, the only
mode, on 0.33.0: a state block per allocation after null padding): on three scenarios (`gap`: a hit's state behind
a padded block, freed at the next step), on admissions with lookahead slots, and on 12 derandomized programs of 12 calls each (admissions with hits,
decodes, refusals, frees, lookups; every answer and the free queue after every call); and the A→B→A family (#50630)
with `hit_state_identity` (kvsim.conform.vllm.aba): with EAGLE 0.26.0's connector hit reuses a Mamba state full
attention does not back, 0.27.0 and 0.33.0 hold, 0.33.0 on derandomized programs, and fails with prefill chunks the
scheduler would clip. Releases are prepared once in the user cache (a failed download fails here with its reason);
one child per release for the module."""

from __future__ import annotations

import os

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import shared
from kvsim.conform.vllm import aba
from kvsim.conform.vllm.connector_hit import BLOCK_SIZE, COORDINATOR, WINDOW, Model, admit, decode, run

# 0.26.0: before #48195 (the scheduler's max); 0.27.0: the first release with the fix; 0.33.0: the pinned release
RELEASES = ("0.26.0", "0.27.0", "0.33.0")


@pytest.fixture(scope="module", params=RELEASES)
def child(request):  # type: ignore[no-untyped-def]
    env = prepare("vllm", request.param)
    running = shared(env, COORDINATOR, timeout=600.0)  # the release's one child for the session, closed at exit
    running.release = request.param
    return running


@pytest.mark.parametrize("groups", [["full", "mamba"], ["full", "swa"]], ids="+".join)
@pytest.mark.parametrize("scenario", ["shared-first-block", "fill", "gap"])
def test_the_model_gives_the_real_hits_blocks_and_free_queue(child, groups, scenario):  # type: ignore[no-untyped-def]
    real = run(child, groups, scenario)
    model = run(Model(8, groups, child.release), groups, scenario)
    assert model == real


@pytest.mark.parametrize("groups", [["full", "mamba"], ["full", "swa"]], ids="+".join)
def test_lookahead_slots_on_two_groups(child, groups):  # type: ignore[no-untyped-def]
    """`num_lookahead_tokens` on a hybrid: attention groups (and Mamba in mode `all`) give the slots blocks, Mamba
    in mode `align` (0.33.0) allocates for the main model's tokens alone; a second request hits the first's cached
    blocks, never a lookahead slot's. The model's answers and the release's agree."""
    def steps(side):  # type: ignore[no-untyped-def]
        answers = [admit(side, "a", [1, 2, 3, 4, 5], lookahead=3), admit(side, "b", [1, 2, 3, 4, 6], lookahead=2)]
        return [a["blocks"] for a in answers], [a["held"] for a in answers]

    child.call("build_hybrid", num_blocks=16, block_size=BLOCK_SIZE, groups=groups, sliding_window=WINDOW)
    assert steps(Model(16, groups, child.release)) == steps(child)


def program(seed: int, length: int = 12) -> list[tuple]:
    """A derandomized program of scheduler calls: requests from three prompt families sharing a first block (so
    hits, evictions and windows meet), admitted, decoded, freed, and looked up."""
    import random

    rng = random.Random(seed)
    ops: list[tuple] = []
    live: list[str] = []
    for i in range(length):
        choice = rng.random()
        if live and choice < 0.3:
            ops.append(("decode", rng.choice(live), 6 + i % 3))
        elif live and choice < 0.5:
            name = rng.choice(live)
            live.remove(name)
            ops.append(("free", name))
        elif choice < 0.65:
            family = rng.randrange(3)
            ops.append(("hits", [1, 1] + [2 + family] * rng.randrange(1, 5)))
        else:
            family, name = rng.randrange(3), f"r{i}"
            live.append(name)
            ops.append(("admit", name, [1, 1] + [2 + family] * rng.randrange(1, 5)))
    return ops


def replay(side, groups: list[str], ops: list[tuple], num_blocks: int) -> list:  # type: ignore[no-untyped-def]
    real = not isinstance(side, Model)
    if real:
        side.call("build_hybrid", num_blocks=num_blocks, block_size=BLOCK_SIZE, groups=groups, sliding_window=WINDOW)
    call = (lambda op, **kw: side.call(op, **kw)) if real else (lambda op, **kw: getattr(side, op)(**kw))
    log: list = []
    for n, op in enumerate(ops):
        if op[0] == "admit":
            answer = admit(side, op[1], op[2])
        elif op[0] == "decode":
            answer = decode(side, op[1], op[2])
        elif op[0] == "free":
            answer = call("free", request=op[1])
        else:
            answer = call("hits", request=f"probe{n}", tokens=op[1])
            if real:
                side.call("free", request=f"probe{n}")  # a lookup only: the child forgets the probe request
        log.append((op, answer, side.call("observe")["free"] if real else side.free_queue()))
    return log


@pytest.mark.parametrize("groups", [["full", "swa"], ["full", "mamba"]], ids="+".join)
def test_the_model_agrees_with_the_real_coordinator_on_derandomized_programs(child, groups):  # type: ignore[no-untyped-def]
    for seed in range(12):
        ops = program(seed)
        real = replay(child, groups, ops, 10)
        model = replay(Model(10, groups, child.release), groups, ops, 10)
        for step, (want, got) in enumerate(zip(real, model)):
            assert got == want, f"seed {seed}, step {step}: {ops[:step + 1]}"


# -- the A→B→A family (#50630, #53912, #49502) on the same children: kvsim.conform.vllm.aba,
# docs/findings/vllm-aba-hybrid-prefix-cache.md; the property's own tests in test_conform_aba.py

def test_aba_with_eagle_parts_the_groups_own_hits_and_the_managers_hits_hold(child):  # type: ignore[no-untyped-def]
    # A, B (sharing A's first two blocks), A' with EAGLE: on every release the groups' own hits of A'
    # (find_longest_cache_hit_per_group, where Mamba ignores the EAGLE drop) part, Mamba's deeper than full
    # attention's, while the reconciled hits, each group's own hits and (0.27.0+) the manager's connector hit hold
    # their state. 0.26.0's scheduler hands the connector the max of the parted hits: the #48195 failure
    # connector_hit_48195 shows through the real scheduler (test_conform_real_scheduler.py). Without B, or without
    # EAGLE, the hits do not part.
    assert aba.run(child, ["full", "mamba"], 16, aba.AA, use_eagle=True).parted == 0
    assert aba.run(child, ["full", "mamba"], 16, aba.ABA, use_eagle=False).parted == 0
    ledger = aba.run(child, ["full", "mamba"], 16, aba.ABA, use_eagle=True)
    assert ledger.problems == [] and ledger.parted == 1, ledger


def test_aba_programs_hold_on_0_33_0(child):  # type: ignore[no-untyped-def]
    if child.release != "0.33.0":
        pytest.skip("the A→B→A programs are the pinned release's check")
    checked = 0
    for seed in range(40 if os.environ.get("KVSIM_PROFILE") == "dev" else 8):
        kinds, num_blocks, use_eagle, ops = aba.program(seed)
        ledger = aba.run(child, kinds, num_blocks, ops, use_eagle=use_eagle)
        assert ledger.problems == [], f"seed {seed}: {ops}"
        checked += ledger.hits
    assert checked >= 50  # the programs reach hits: the property is not vacuous


def test_a_scheduler_that_does_not_clip_chunks_to_the_mamba_grid_fails_on_0_33_0(child):  # type: ignore[no-untyped-def]
    # the write side: A prefilled in 3-token chunks, the first ending inside block 1 (the state after 3 tokens in
    # column 1), the next crossing the boundary; the manager caches column 1 under the 4-token hash, A' reuses it.
    # 0.33.0's scheduler clips the chunk at the boundary (_mamba_block_aligned_split), and then it holds
    if child.release != "0.33.0":
        pytest.skip("0.33.0's manager")
    a = aba.A_PROMPT + [2]
    ops = aba.prefill("a", a, 3) + [("free", "a")] + aba.prefill("a2", a, 8)
    assert aba.run(child, ["full", "mamba"], 16, ops).problems == []
    problems = aba.run(child, ["full", "mamba"], 16, ops, aligned=False).problems
    assert problems == ["a2's hit of 4 tokens: group 1 (mamba) block 1 (id 3) must hold the state of the prefix "
                        "[1, 1, 2, 2], holds mamba state of 3 tokens [1, 1, 2]"]
