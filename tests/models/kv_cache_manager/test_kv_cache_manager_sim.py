"""kv-cache-manager's timed simulation (`kvsim simulate kv-cache-manager`): a timing policy over `CacheManagerSystem`.

Its recorded actions replay through the transition system to the driver's state, with every invariant holding on
every state of a run that preempts; the same seed gives the same digest under any PYTHONHASHSEED; the planted
pre-#48195 connector hit is caught where the workload reaches it (three hybrid groups); bad parameters are one-line
errors; the explorer's bound on requests stays three. The same-digest and command-line tests run the package's
second simulation (`kv-cache-manager-pd`, `test_kv_cache_manager_pd_sim`) too.
"""

import os
import subprocess
import sys

import pytest
from toys import recorded_actions

from kvsim.app.simulate import simulate_model
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import first_violation, run_actions
from kvsim.models.kv_cache_manager import DESCRIPTOR, PD_DESCRIPTOR
from kvsim.models.kv_cache_manager.actions import ACTIONS
from kvsim.models.kv_cache_manager.system import CacheManagerConfig

# a small workload under pressure: 40 requests, a pool for about two of them at once
PRESSED = {"requests": 40, "num_blocks": 24, "arrival_rate": 40.0}


def _recorded(result):
    return recorded_actions(result, ACTIONS)


def test_invariants_hold_along_a_run_that_preempts_on_fixed():
    result = simulate_model(DESCRIPTOR, "fixed", 0, PRESSED)
    summary = result.summary
    assert summary["violations"] == [] and summary["finished"] == 40 and result.complete
    assert summary["preemptions"] > 0 and summary["deferrals"] > 0 and summary["evictions"] > 0
    assert 0 < summary["hit_rate"] < 1 and summary["free_blocks_min"] == 0
    recorded = _recorded(result)
    assert recorded == result.driver.actions
    kinds = {a[0] for a in recorded}
    assert kinds == {"schedule", "decode", "finish", "preempt"}
    states = run_actions(result.driver.system, recorded)
    assert states[-1] == result.driver.state
    for i, state in enumerate(states):
        assert first_violation(result.driver.system, state) is None, (i, recorded[i - 1] if i else None)
    assert all(r.status == "finished" for r in states[-1].requests)


@pytest.mark.parametrize("groups", ["full,swa", "full,swa,mamba"])
def test_hybrid_groups_run_clean_on_fixed(groups):
    result = simulate_model(DESCRIPTOR, "fixed", 0, {"requests": 60, "groups": groups, "num_blocks": 80})
    assert result.summary["violations"] == [] and result.summary["finished"] == 60
    assert run_actions(result.driver.system, result.driver.actions)[-1] == result.driver.state


def test_the_pre_48195_connector_hit_is_caught_on_three_groups():
    params = {"groups": "full,swa,mamba", "num_blocks": 80}
    result = simulate_model(DESCRIPTOR, "pre_48195", 0, params)
    summary = result.summary
    assert summary["crashed"] and len(summary["violations"]) == 1
    assert summary["violations"][0].startswith("hybrid_hit_backed: the local hit handed to the connector")
    assert summary["finished"] < summary["requests"]
    assert run_actions(result.driver.system, _recorded(result))[-1] == result.driver.state
    assert simulate_model(DESCRIPTOR, "fixed", 0, params).summary["violations"] == []


@pytest.mark.parametrize("name,params", [("DESCRIPTOR", ["requests=30", "num_blocks=20"]),
                                         ("PD_DESCRIPTOR", ["requests=30"])])
def test_same_seed_same_digest_under_any_hash_seed(name, params):
    """Both simulations of the package (`kv-cache-manager`, `kv-cache-manager-pd`)."""
    spec = {"DESCRIPTOR": DESCRIPTOR, "PD_DESCRIPTOR": PD_DESCRIPTOR}[name]
    code = (f"from kvsim.app.simulate import simulate_model; from kvsim.models.kv_cache_manager import {name};"
            f"print(simulate_model({name}, 'fixed', 3, {params!r}).digest)")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": h}).stdout for h in ("0", "1")}
    assert len(digests) == 1
    assert simulate_model(spec, "fixed", 3, params).digest == digests.pop().strip()
    assert simulate_model(spec, "fixed", 4, params).digest != simulate_model(spec, "fixed", 3, params).digest


@pytest.mark.parametrize("spec,param,expected", [
    (DESCRIPTOR, "num_blocks=5", "param num_blocks: expected at least 13 (one request's prompt and outputs in every "
                                 "group, and the null block), got 5"),
    (DESCRIPTOR, "shared=40", "param shared: expected at most prompt_len (32), got 40"),
    (DESCRIPTOR, "groups=swa", "param groups: expected one of full, full,swa, full,mamba, full,swa,mamba, "
                               "full,local, got 'swa'"),
    (DESCRIPTOR, "requests=0", "param requests: expected an integer (>= 1 and <= 20000), got 0"),
    (PD_DESCRIPTOR, "num_blocks=6", "param num_blocks: expected at least 7 (one request's prompt and outputs, and "
                                    "the null block), got 6"),
    (PD_DESCRIPTOR, "producer_share=1.5", "param producer_share: expected a number (>= 0.0 and <= 1.0), got 1.5"),
    (PD_DESCRIPTOR, "delivery_latency=-1", "param delivery_latency: expected a number (>= 0.0 and <= 3600.0), got "
                                           "-1.0"),
], ids=lambda v: v.name if hasattr(v, "name") else None)
def test_bad_params_are_one_line_errors(spec, param, expected):
    with pytest.raises(ConfigError) as err:
        simulate_model(spec, "fixed", 0, [param])
    assert str(err.value) == expected  # `kvsim simulate` prints it as one line, `kvsim: error: --` before it


@pytest.mark.parametrize("model,param,message", [
    ("kv-cache-manager", "num_blocks=5", "expected at least 13 (one request's prompt and outputs in every group, and "
                                         "the null block), got 5"),
    ("kv-cache-manager-pd", "num_blocks=6", "expected at least 7 (one request's prompt and outputs, and the null "
                                            "block), got 6"),
])
def test_the_cli_prints_a_bad_param_on_one_line(model, param, message):
    out = subprocess.run([sys.executable, "-m", "kvsim", "simulate", model, "--param", param],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [f"kvsim: error: --param {param.split('=')[0]}: {message}"]


@pytest.mark.parametrize("spec,field", [(DESCRIPTOR, "prompt_len + max_tokens"),
                                        (PD_DESCRIPTOR, "prompt_len + max_tokens + mtp_lookahead")],
                         ids=["kv-cache-manager", "kv-cache-manager-pd"])
def test_a_request_longer_than_its_hashes_compare_is_refused(spec, field):
    """A workload of 1,020 blocks a request raised RecursionError mid-run (a traceback): one block past
    `MAX_CHAIN_BLOCKS` is a one-line error before anything runs."""
    from kvsim.models.kv_cache_manager.kv_cache_utils import MAX_CHAIN_BLOCKS

    longest = {"block_size": 1, "prompt_len": MAX_CHAIN_BLOCKS - 16, "max_tokens": 16,
               "num_blocks": 4 * MAX_CHAIN_BLOCKS}
    with pytest.raises(ConfigError) as err:
        spec.build_sim_config({**longest, "max_tokens": 17})  # (`kvsim simulate` prints it as one line)
    assert str(err.value) == (f"param {field}: expected at most {MAX_CHAIN_BLOCKS} tokens a request "
                              f"({MAX_CHAIN_BLOCKS} blocks of 1: its block hashes nest a level a block), "
                              f"got {MAX_CHAIN_BLOCKS + 1}")
    assert spec.build_sim_config(longest).prompt_len == MAX_CHAIN_BLOCKS - 16  # the longest is accepted


def test_hashes_of_the_longest_chain_compare_under_a_deep_caller_and_twice_as_long_do_not():
    """The bound holds with room to spare: two equal chains of `MAX_CHAIN_BLOCKS` blocks, made apart (as two
    requests make them), compare and sort from 300 frames down; chains twice as long raise RecursionError."""
    from kvsim.models.kv_cache_manager.kv_cache_utils import MAX_CHAIN_BLOCKS, request_block_hashes

    def chains(blocks):
        tokens = list(range(blocks))
        return request_block_hashes(tokens, 1)[-1], request_block_hashes(list(tokens[:-1]) + [-1], 1)[-1], \
            request_block_hashes(tokens, 1)[-1]

    def down(frames, fn):
        return fn() if frames == 0 else down(frames - 1, fn)

    a, b, same = chains(MAX_CHAIN_BLOCKS)
    assert a is not same and down(300, lambda: (a == same, sorted([a, b, same]) == [b, a, same])) == (True, True)
    a, b, same = chains(2 * MAX_CHAIN_BLOCKS)
    with pytest.raises(RecursionError):
        down(300, lambda: sorted([a, b, same]))


def test_the_explorer_keeps_its_three_requests():
    with pytest.raises(ConfigError, match="one to 3 requests"):
        CacheManagerConfig(prompts=(0, 1, 0, 1))
