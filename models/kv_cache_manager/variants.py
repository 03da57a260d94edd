"""The variants of kv-cache-manager and kv-cache-manager-pd: one flag per upstream change, read where it was made.

`fixed` is vLLM 0.33.0's manager and scheduler as released (the #48195 and #50297 fixes have been in since 0.27.0,
#55055's since 0.31.0).

* `pre_48195` is vLLM 0.26.0's scheduler before vLLM #48195 / #48425 (commit 229e01e9e, issue #46453): for a
  hybrid model with Mamba layers and a KV connector, the local computed tokens handed to the connector were the
  maximum of the per-group hits (`num_new_local_computed_tokens = max(per_group_hits)`, 0.26.0
  `sched/scheduler.py`), more than the full-attention group could back when its tail had been evicted while a
  deeper Mamba state survived. Flag `connector_hit_from_full_attention`, read in
  `kv_cache_manager.connector_local_hit`, the scheduler's choice of what to hand the connector (0.27.0+:
  `KVCacheManager.get_computed_blocks_for_connector`).
* `pre_50297`: the scheduler before vLLM #50297 (0.26.0): a request preempted while its last step's output is
  in flight takes that output when it returns, so a producing connector's request can finish after the
  preemption freed its blocks. Flag `requires_kv_delivery`, read by the P/D life cycle (`scheduler.py`) where the
  fix changed `Scheduler._preempt_request`'s call (`drop_stale_output=self.requires_kv_delivery`).
* `pre_55055`: before vLLM #55055 (0.30.0): a producer (NIXL's P side) truncated its prompt only for Mamba, so
  with a multi-module MTP drafter it computed, and handed, the last positions whose MTP-layer KV embeds
  unverified draft tokens. Flag `prefill_backoff_covers_lookahead`, read by `scheduler.py` where the fix changed
  `_prefill_backoff`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class CacheManagerVariant(Variant):
    # #48195: the connector's local hit is the full-attention group's (or the reconciled one), never a deeper group's
    connector_hit_from_full_attention: bool = True
    # #50297 (0.27.0): a preempted request's in-flight output is dropped when the connector requires delivery
    requires_kv_delivery: bool = True
    # #55055 (0.31.0): the producer's prefill backoff covers the MTP drafter's lookahead (num_prefill_lookahead - 1)
    prefill_backoff_covers_lookahead: bool = True


# kv-cache-manager's variants (the manager and the coordinator) and kv-cache-manager-pd's (the scheduler's P/D
# life cycle): one record type, each system listing the variants whose flags it reads
VARIANTS = VariantTable(
    CacheManagerVariant("fixed"),
    CacheManagerVariant("pre_48195", connector_hit_from_full_attention=False),
)
PD_VARIANTS = VariantTable(
    CacheManagerVariant("fixed"),
    CacheManagerVariant("pre_50297", requires_kv_delivery=False),
    CacheManagerVariant("pre_55055", prefill_backoff_covers_lookahead=False),
)
FIXED = VARIANTS.fixed
