"""vLLM's KV cache coordinator over two groups on the real releases, imported for real and driven in its child
(kvsim.conform.vllm.real_coordinator); #48195 itself is driven through the real scheduler
(test_conform_real_scheduler.py). On the same operations the model (`kvsim.models.kv_cache_manager`) gives the
real per-group hits, reconciled hits, connector hits (0.27.0+'s `get_computed_blocks_for_connector`; none before
it, where the choice is the scheduler's), block ids and free queue, on every release whose Mamba prefix
caching it models (mode `all`: 0.26.0, 0.27.0) and, with a sliding window, on all three: on the two scenarios and
on 12 derandomized programs of 12 calls each (admissions with hits, decodes, refusals, frees, lookups; every
answer and the free queue after every call). Releases are prepared once
in the user cache (a failed download fails here with its reason); one child per release for the module."""

from __future__ import annotations

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import InstalledChild
from kvsim.conform.vllm.connector_hit import BLOCK_SIZE, COORDINATOR, WINDOW, Model, admit, decode, run

# 0.26.0: before #48195 (the scheduler's max); 0.27.0: the first release with the fix; 0.33.0: the pinned release
RELEASES = ("0.26.0", "0.27.0", "0.33.0")


@pytest.fixture(scope="module", params=RELEASES)
def child(request):  # type: ignore[no-untyped-def]
    env = prepare("vllm", request.param)
    with InstalledChild(env, COORDINATOR) as running:
        running.release = request.param
        yield running


@pytest.mark.parametrize("groups", [["full", "mamba"], ["full", "swa"]])
@pytest.mark.parametrize("scenario", ["shared-first-block", "fill"])
def test_the_model_gives_the_real_hits_blocks_and_free_queue(child, groups, scenario):  # type: ignore[no-untyped-def]
    if "mamba" in groups and child.release == "0.33.0":
        pytest.skip("0.33.0's Mamba prefix caching is mode align, whose allocation the model does not state")
    real = run(child, groups, scenario)
    model = run(Model(8, groups, child.release), groups, scenario)
    assert model == real


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


@pytest.mark.parametrize("groups", [["full", "swa"], ["full", "mamba"]])
def test_the_model_agrees_with_the_real_coordinator_on_derandomized_programs(child, groups):  # type: ignore[no-untyped-def]
    if "mamba" in groups and child.release == "0.33.0":
        pytest.skip("0.33.0's Mamba prefix caching is mode align, whose allocation the model does not state")
    for seed in range(12):
        ops = program(seed)
        real = replay(child, groups, ops, 10)
        model = replay(Model(10, groups, child.release), groups, ops, 10)
        for step, (want, got) in enumerate(zip(real, model)):
            assert got == want, f"seed {seed}, step {step}: {ops[:step + 1]}"
