"""The A→B→A hybrid prefix-cache family (vLLM #50630, #53912, #49502) at the KV-manager level
(kvsim.conform.vllm.aba, docs/findings/vllm-aba-hybrid-prefix-cache.md): the runner's writes the ledger records, the
property `hit_state_identity` failing on planted wrong reuses, and (under KVSIM_PROFILE=dev) the A→B→A sequence on
0.25.1, before the read-side gate. The sequence and the programs on 0.26.0, 0.27.0 and 0.33.0 run in
tests/conform/vllm/test_conform_real_coordinator.py, on its children."""

from __future__ import annotations

import os

import pytest

from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import InstalledChild
from kvsim.conform.vllm import aba
from kvsim.models.kv_cache_manager import checks
from kvsim.models.kv_cache_manager.model_runner import step_writes

DEV = os.environ.get("KVSIM_PROFILE") == "dev"
def test_step_writes_follow_the_runner():
    # full attention: each token's KV in its block; Mamba align: the state after `end` in column cdiv(end, 2) - 1
    writes = step_writes(("full", "mamba"), [[5, 6, 7], [0, 8, 9]], [1, 1, 2, 2, 2], 2, 5, 2)
    assert writes == {6: ("full", (1, 1, 2, 2)), 7: ("full", (1, 1, 2, 2, 2)), 9: ("mamba", (1, 1, 2, 2, 2))}
    with pytest.raises(ValueError):
        step_writes(("full",), [[5]], [1], 0, 2, 2)


def test_hit_state_identity_fails_on_a_planted_wrong_reuse():
    written = {1: ("full", (1, 1)), 2: ("full", (1, 1, 2, 2)), 3: ("mamba", (1, 1, 2, 2))}
    hit = [[1, 2], [0, 3]]
    assert checks.hit_state_identity(("full", "mamba"), hit, written, aba.A_PROMPT, 4, 2, 3, "hit") is None
    # the Mamba block reused for A's prefix holds B's state (a write into a cached block), or a state of 3 tokens
    for wrong in (("mamba", (1, 1, 3, 3)), ("mamba", (1, 1, 2)), ("full", (1, 1, 2, 2))):
        problem = checks.hit_state_identity(("full", "mamba"), hit, {**written, 3: wrong}, aba.A_PROMPT, 4, 2, 3, "hit")
        assert problem is not None and "group 1 (mamba) block 1 (id 3)" in problem
    # a hit deeper than full attention's blocks: nothing backs block 1 of group 0
    problem = checks.hit_state_identity(("full", "mamba"), [[1], [0, 3]], written, aba.A_PROMPT, 4, 2, 3, "hit")
    assert problem == "hit of 4 tokens: group 0 (full) block 1 (id None) must hold the state of the prefix " \
                      "[1, 1, 2, 2], holds nothing written"


@pytest.mark.skipif(not DEV, reason="0.25.1's child (about 30 s to import vLLM) runs under KVSIM_PROFILE=dev")
def test_aba_reuses_a_mamba_state_full_attention_does_not_back_on_0_25_1():
    # the main read path before the gate: A then A' (a stable cache) holds; A, B, A' with EAGLE hands A' B's Mamba
    # state at 4 tokens over one full-attention block (B shares A's first two blocks, so its state sits level with
    # A's last full-attention block, which the EAGLE drop takes away)
    with InstalledChild(prepare("vllm", "0.25.1"), aba.DRIVER) as child:
        assert aba.run(child, ["full", "mamba"], 16, aba.AA, use_eagle=True).problems == []
        assert aba.run(child, ["full", "mamba"], 16, aba.ABA, use_eagle=False).problems == []
        tail = " of 4 tokens: group 0 (full) block 1 (id None) must hold the state of the prefix [1, 1, 2, 2], " \
               "holds nothing written"
        assert aba.run(child, ["full", "mamba"], 16, aba.ABA, use_eagle=True).problems == [
            "reconciled hit" + tail, "connector hit" + tail, "a2's hit" + tail]
