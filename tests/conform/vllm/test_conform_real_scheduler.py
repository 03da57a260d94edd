"""vLLM's real `Scheduler` (async scheduling, a producing KV connector) imported from releases across #50297 and
driven in its child (kvsim.conform.vllm.real_scheduler): a producer request preempted while its final prefill step
is in flight. The model's invariant `finished_into_producer_owns_blocks` (the same check, `owns_blocks`) fails on
0.26.0, the release before the fix, and holds on 0.27.0 (the fix) and 0.33.0; the model's variants agree with
each release.

#48195 through the same scheduler, over full attention + Mamba (the program of
kvsim.conform.vllm.connector_hit.through_scheduler): a KV connector records the local computed tokens `schedule`
hands its `get_num_new_matched_tokens`, and what the scheduler's block pool caches for the request then. On 0.26.0
(`max(per_group_hits)`) the scheduler hands 4 local tokens for which full attention caches no block: the model's
`checks.connector_hit_backed` fails on the real record; on 0.27.0 and 0.33.0 (`get_computed_blocks_for_connector`)
it holds, on cases where the groups' hits part. On the releases whose Mamba caching mode the model states (`all`:
0.26.0, 0.27.0) the model's manager along the same requests hands the same tokens and caches the same blocks.
One child per release for the module (an import takes about 20 s)."""

from __future__ import annotations

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import InstalledChild
from kvsim.conform.vllm.connector_hit import DECODES, backed, on_model, parted, through_scheduler
from kvsim.conform.vllm.real_scheduler import race
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import run_actions
from kvsim.models.kv_cache_manager import PD_DESCRIPTOR
from kvsim.models.kv_cache_manager.scheduler import Decode, Output, Preempt, Schedule

DRIVER = "kvsim.conform.vllm.real_scheduler:SchedulerDriver"
# release -> the model's variant of it: #50297 landed in 0.27.0
RELEASES = {"0.26.0": "pre_50297", "0.27.0": "fixed", "0.33.0": "fixed"}
# the model's shortest path to the race (kv-cache-manager-pd's default configuration: P is request 0, L is 1)
MODEL_RACE = [Schedule(0), Schedule(1), Output(1), Preempt(0), Output(0)]
# #48195: the local tokens the real scheduler hands request C, per case (B's decode steps before C)
HANDED = {"0.26.0": [4, 0, 0], "0.27.0": [0, 0, 0], "0.33.0": [4, 0, 0]}


@pytest.fixture(scope="module", params=sorted(RELEASES))
def child(request):  # type: ignore[no-untyped-def]
    with InstalledChild(prepare("vllm", request.param), DRIVER) as running:
        running.release = request.param
        yield running


def test_a_producer_preempted_in_its_final_step_hands_blocks_only_after_the_fix(child):  # type: ignore[no-untyped-def]
    result = race(child)
    assert result["preempted"] == ["P"]  # step 2 preempted P while step 1 (P's whole prefill) was in flight
    assert result["status"] == {"L": "FINISHED_LENGTH_CAPPED", "P": "FINISHED_LENGTH_CAPPED"}
    assert result["free"] == 2  # every block back once P is delivered: nothing leaks, before the fix or after
    ((request, blocks, held),) = result["handed"]
    if RELEASES[child.release] == "pre_50297":  # the stale output finished P after the preemption freed its blocks
        assert request == "P" and blocks == [] and held == []
        (problem,) = result["problems"]
        assert "request_finished got [], expected the 1 block(s) of its 2 prompt tokens" in problem
    else:  # the stale output was dropped, P recomputed, and request_finished got its block, held until delivery
        assert request == "P" and len(blocks) == 1 and held == blocks
        assert result["problems"] == []


def test_the_model_variant_of_the_release_hands_what_the_release_hands(child):  # type: ignore[no-untyped-def]
    """The model's race path on the release's variant: request_finished gets as many blocks as on the release, and
    the invariant's verdict on the path is the release's."""
    real = race(child)
    system = PD_DESCRIPTOR.build_system(RELEASES[child.release])
    path = MODEL_RACE
    if RELEASES[child.release] == "fixed":  # the rest of the run: L finishes, P is recomputed and hands its block
        path = MODEL_RACE + [Decode(1), Output(1), Schedule(0), Output(0)]
    last = run_actions(system, path)[-1]
    (invariant,) = [i for i in system.invariants if i.name == "finished_into_producer_owns_blocks"]
    assert (invariant.check(last) is None) == (real["problems"] == [])
    assert len(last.requests[0].handed) == len(real["handed"][0][1])


def test_without_the_race_every_release_hands_the_blocks(child):  # type: ignore[no-untyped-def]
    """Three usable blocks: step 2 preempts nothing and the check holds on every release (it is the race the
    check catches, not the harness)."""
    result = race(child, num_blocks=4)
    assert result["preempted"] == [] and result["problems"] == []
    assert [len(blocks) for _, blocks, _ in result["handed"]] == [1] and result["free"] == 3


def test_a_request_the_driver_does_not_know_is_refused(child):  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="op"):
        child.call("nope")
    with pytest.raises(ConfigError, match="output"):
        child.call("build", num_blocks=3, block_size=2)
        child.call("output")


def cached(matched: dict) -> list[list[bool]]:
    """Per group, whether the pool caches a block under each of the request's hashes."""
    return [[c is not None and c == k for c, k in zip(g["cached"], g["keys"])] for g in matched["groups"]]


def test_before_48195_the_scheduler_hands_the_connector_tokens_full_attention_does_not_back(child):  # type: ignore[no-untyped-def]
    release, got = child.release, [through_scheduler(child, k) for k in DECODES]
    matched = [g["matched"] for g in got]
    assert [m["local_tokens"] for m in matched] == HANDED[release]
    assert any(parted(m) for m in matched)  # a case where Mamba's state is cached deeper than full attention's
    problems = [backed(m) for m in matched]
    if release == "0.26.0":
        assert cached(matched[0]) == [[False, False], [False, True]]  # max(per_group_hits): Mamba's 4 tokens
        assert problems[0] is not None and problems[0].startswith(
            "the local hit handed to the connector of 4 tokens: group 0 (full) needs block 0 cached"), problems
        assert problems[1:] == [None, None]
    else:
        assert problems == [None, None, None]


def test_the_model_hands_the_real_schedulers_tokens_to_the_connector(child):  # type: ignore[no-untyped-def]
    release, got = child.release, [through_scheduler(child, k) for k in DECODES]
    if got[0]["mamba_cache_mode"] != "all":
        pytest.skip(f"{release}'s Mamba prefix caching is mode {got[0]['mamba_cache_mode']}, which the model does "
                    "not state")
    for k, real in zip(DECODES, got):
        model = on_model(release, k)
        assert model["local_tokens"] == real["matched"]["local_tokens"], k
        assert cached(model) == cached(real["matched"]), k
