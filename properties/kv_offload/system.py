"""The kv-offload transition system's stateful property, and the #35846 bug report."""

from __future__ import annotations

from kvsim.engine.property import stateful_property
from kvsim.engine.registry import BugReport, UpstreamSite, Verdict

MODEL = "kv-offload"

OFFLOAD_INVARIANTS = stateful_property(
    model=MODEL, name="offload_system_invariants", home=__name__,
    doc="The manager's invariants hold on every step of Hypothesis-chosen request sequences (stores, "
        "completions and failures, loads, touches, finishes): capacity and free list, counters, jobs matching "
        "slots, store, load and failed-store semantics.")

ALREADY_STORED = BugReport(
    id="vllm-35846-already-stored-evicted",
    model=MODEL,
    variant="pre_already_stored_fix",
    invariant="no_input_key_evicted",
    params={},
    source="vllm #35846 (tests/v1/kv_offload/cpu/test_manager.py::"
           "test_already_stored_block_not_evicted_during_prepare_store)",
    summary="prepare_store made room for its new keys without protecting the offered keys already stored: the "
            "LRU (or ARC) victim could be one of them, silently dropped while the caller counts it as offloaded",
    affected="vLLM before #35846 (merged 2026-03), LRU and ARC CPU offloading managers",
    upstream_files=(
        UpstreamSite("vllm/v1/kv_offload/cpu/manager.py", ("CPUOffloadingManager.prepare_store",),
                     "builds the protected set handed to CachePolicy.evict"),
        UpstreamSite("vllm/v1/kv_offload/cpu/policies/lru.py", ("LRUCachePolicy.evict",), "skips protected keys"),
        UpstreamSite("vllm/v1/kv_offload/cpu/policies/arc.py", ("ARCCachePolicy.evict",), "skips protected keys"),
    ),
    harm="a wrong status",
    consequence="The key is reported as already stored (not in keys_to_store), so the connector never stores it "
                "again, yet it is gone from the CPU cache: a later lookup misses and the prefix is recomputed.",
    fix="Pass every input key as protected to the policy's evict (#35846).",
    fix_variant="fixed",
    verdicts=(Verdict("0.27.1", "fixed", "prepare_store protects every input key (#35846)"),
              Verdict("0.33.0", "fixed", "prepare_store protects every input key (#35846)")),
)
