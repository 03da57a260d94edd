"""vLLM's real `Scheduler` (async scheduling, a producing KV connector) imported from releases across #50297 and
driven in its child (kvsim.conform.vllm.real_scheduler): a producer request preempted while its final prefill step
is in flight. The model's invariant `finished_into_producer_owns_blocks` (the same check, `owns_blocks`) fails on
0.26.0, the release before the fix, and holds on 0.27.0 (the fix), 0.30.0, 0.31.0 and 0.33.0; the model's variants
agree with each release.

#48195 through the same scheduler, over full attention + Mamba (the program of
kvsim.conform.vllm.connector_hit.through_scheduler): a KV connector records the local computed tokens `schedule`
hands its `get_num_new_matched_tokens`, and what the scheduler's block pool caches for the request then. On 0.26.0
(`max(per_group_hits)`) the scheduler hands 4 local tokens for which full attention caches no block: the model's
`checks.connector_hit_backed` fails on the real record; from 0.27.0 (`get_computed_blocks_for_connector`) it holds,
on cases where the groups' hits part. On the releases whose Mamba caching mode is `all` (through 0.31.0) the model's
manager along the same requests hands the same tokens and caches the same blocks.

vLLM #55055 on the same scheduler with a multi-module MTP drafter and the release's NixlConnector
(kvsim.conform.vllm.pd_mtp): the model's invariant `no_unverified_draft_kv_handed` (`draft_kv_handed`) fails on
0.30.0, whose producer computes its whole prompt, and holds on 0.31.0 and 0.33.0, whose producer stops
`num_prefill_lookahead_tokens - 1` short. One child per release, shared with the session's other real-scheduler
runs (kvsim.conform.installed_child.shared: an import takes about 20 s)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import shared
from kvsim.conform.vllm.connector_hit import DECODES, backed, compared, on_model, parted, through_scheduler
from kvsim.conform.vllm.pd_mtp import handoff
from kvsim.conform.vllm.real_scheduler import race
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import run_actions
from kvsim.models.kv_cache_manager import PD_DESCRIPTOR
from kvsim.models.kv_cache_manager.scheduler import Decode, Output, Preempt, Schedule

DRIVER = "kvsim.conform.vllm.real_scheduler:SchedulerDriver"
# release -> the model's variant of it: #50297 landed in 0.27.0
RELEASES = {"0.26.0": "pre_50297", "0.27.0": "fixed", "0.30.0": "fixed", "0.31.0": "fixed", "0.33.0": "fixed"}
# release -> whether its producer backs off the MTP drafter's lookahead: #55055 landed in 0.31.0
MTP_RELEASES = {"0.30.0": False, "0.31.0": True, "0.33.0": True}
# the model's shortest path to the race (kv-cache-manager-pd's default configuration: P is request 0, L is 1)
MODEL_RACE = [Schedule(0), Schedule(1), Output(1), Preempt(0), Output(0)]
# #48195: the local tokens the real scheduler hands request C, per case (B's decode steps before C)
HANDED = {"0.26.0": [4, 0, 0], "0.27.0": [0, 0, 0], "0.30.0": [0, 0, 0], "0.31.0": [0, 0, 0], "0.33.0": [4, 0, 0]}


def started(release: str):  # type: ignore[no-untyped-def]
    running = shared(prepare("vllm", release), DRIVER, timeout=600.0)
    running.release = release
    return running


@pytest.fixture(scope="module", params=sorted(RELEASES))
def child(request):  # type: ignore[no-untyped-def]
    return started(request.param)


@pytest.fixture(scope="module", params=sorted(MTP_RELEASES))
def mtp_child(request):  # type: ignore[no-untyped-def]
    return started(request.param)


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
        # the model's manager runs align, but the program on it does not split prefills at Mamba blocks as 0.33.0's
        # scheduler does (_mamba_block_aligned_split): A's first Mamba state is cached there and not on the model
        pytest.skip(f"{release}'s scheduler splits prefills at Mamba blocks (mode {got[0]['mamba_cache_mode']}), "
                    "which the model's program does not")
    for k, real in zip(DECODES, got):
        model = on_model(release, k)
        assert model["local_tokens"] == real["matched"]["local_tokens"], k
        assert cached(model) == cached(real["matched"]), k


def test_a_request_on_an_empty_pool_is_split_as_the_model_states(child):  # type: ignore[no-untyped-def]
    """Blocks of one token over full attention + Mamba: A's first step, every group's hit 0 and no shared-prefix
    junction, computes 3 of its 4 tokens on 0.33.0 (Mamba's mode align: the split stops at the last cacheable
    state) and all 4 before it (mode all); `first_steps_as_stated` compares that with the model's statement
    (`scheduler.mamba_block_aligned_split`). A junction of 1 reported by the lookup would stop it at 1."""
    case = {"groups": ["full", "mamba"], "num_blocks": 12, "decodes": 1, "c_extra": 0, "block_size": 1}
    got = through_scheduler(child, 1, num_blocks=12, c_extra=0, block_size=1)
    assert got["first_steps"]["a"][1] == (3 if child.release == "0.33.0" else 4)
    assert compared(got["matched"], case, got["mamba_cache_mode"], got["first_steps"])["first_steps_as_stated"]


def test_an_mtp_producer_hands_no_draft_kv_only_after_55055(mtp_child):  # type: ignore[no-untyped-def]
    """A producer with a 2-module MTP drafter and a 2-token prompt: 0.30.0 (no num_prefill_lookahead_tokens) computes
    and hands both positions, the last one's MTP KV a draft's; 0.31.0 on truncates the prompt by one and the
    decode side recomputes it. The verdict is the model's check on the count the release's request_finished saw."""
    result = handoff(mtp_child)
    assert result["status"] == {"P": "FINISHED_LENGTH_CAPPED"} and result["free"] == 2  # delivered, nothing leaks
    assert len(result["handed"]) == 1
    if MTP_RELEASES[mtp_child.release]:
        assert (result["lookahead"], result["scheduled"], result["computed"]) == (2, 1, 1)
        assert result["problems"] == []
    else:
        assert (result["lookahead"], result["scheduled"], result["computed"]) == (None, 2, 2)
        (problem,) = result["problems"]
        assert problem == "request P hands the KV of 2 of its 2 prompt tokens: with lookahead 2 positions 1..1 " \
                          "hold the MTP drafter's KV of unverified draft tokens"


def test_the_backoff_follows_the_drafters_lookahead(mtp_child):  # type: ignore[no-untyped-def]
    """Three MTP modules and a 4-token prompt: the fixed releases stop two tokens short (lookahead 3 - 1), 0.30.0
    none; the model's variant of each release computes as many. (Blocks of 4 tokens: with prefix caching every
    release refuses a multi-module MTP drafter whose lookahead is more than a block.)"""
    from kvsim.conform.vllm.pd_mtp import MTP_RELEASES as VARIANTS, model
    from kvsim.engine.conformance.declare import variant_for

    case = {"num_blocks": 3, "block_size": 4, "prompt_len": 4, "mtp_lookahead": 3}
    result = handoff(mtp_child, **case)
    fixed = MTP_RELEASES[mtp_child.release]
    assert (result["lookahead"], result["computed"]) == ((3, 2) if fixed else (None, 4))
    assert result["problems"] == [] if fixed else len(result["problems"]) == 1
    assert (variant_for(VARIANTS, mtp_child.release) != "pre_55055") == fixed
    ctx = SimpleNamespace(source=SimpleNamespace(version=mtp_child.release))  # what the adapter's model reads
    assert model(ctx, case) == {"computed_tokens": result["computed"], "no_draft_kv": not result["problems"]}


def test_a_producer_asking_for_prompt_logprobs_is_not_truncated_from_0_32(mtp_child):  # type: ignore[no-untyped-def]
    """A producer that skips reading the prefix cache (prompt logprobs), a 2-module drafter, a 3-token prompt:
    0.33.0's NIXL P side does not truncate it (its decode side loads nothing: 0.31.0 on discard a connector's hit for
    such a request), 0.31.0's truncates it by one as any other, 0.30.0's not at all; the model's variant of each
    release computes as many and judges as the release's run."""
    from kvsim.conform.vllm.pd_mtp import model

    case = {"num_blocks": 4, "block_size": 2, "prompt_len": 3, "mtp_lookahead": 2, "prompt_logprobs": 1}
    ctx = SimpleNamespace(source=SimpleNamespace(version=mtp_child.release))
    result = handoff(mtp_child, **case, decode_loads=mtp_child.release == "0.30.0")
    assert result["computed"] == {"0.30.0": 3, "0.31.0": 2, "0.33.0": 3}[mtp_child.release]
    assert model(ctx, case) == {"computed_tokens": result["computed"], "no_draft_kv": not result["problems"]}
