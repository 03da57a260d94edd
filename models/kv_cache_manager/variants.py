"""The variants of kv-cache-manager and kv-cache-manager-pd: one flag per upstream change, read where it was made.

`fixed` is vLLM 0.33.0's manager and scheduler as released (the #48195 and #50297 fixes have been in since 0.27.0,
#55055's since 0.31.0; Mamba prefix caching in mode `align`, its only mode).

* `mamba_all`: the Mamba single-type manager in prefix-caching mode `all`. 0.26.0-0.31.0 have
  `MambaCacheMode = Literal["all", "align", "none"]`; `all` is the default of 0.26.0 and 0.27.0 for the models that
  support it (`"all" if model_config.supports_mamba_prefix_caching else "align"`, `models/config.py`), `align` the
  default from 0.28.0 (vLLM #50991, "enable prefix cache by default and change the default mode to align");
  0.33.0 has `Literal["align", "none"]` and `MambaManager.__init__` asserts `align` whenever caching is on.
  `align` itself is older (vLLM #30877, before 0.26.0): what 0.33.0 changed is that it is the only mode, so
  `fixed` reads `align`, and this variant is the releases before it in mode `all`, as the conform child builds
  them (`kvsim/conform/vllm/real_coordinator.py`). Flag `mamba_cache_mode_align`, read in
  `single_type_kv_cache_manager.MambaManager` where upstream reads `mamba_cache_mode == "align"`:
  `get_num_blocks_to_allocate`, `allocate_new_blocks`, `remove_skipped_blocks` (`_remove_blocks_in_range`).
* `pre_48195` is vLLM 0.26.0's scheduler before vLLM #48195 / #48425 (commit 229e01e9e, issue #46453): for a
  hybrid model with Mamba layers and a KV connector, the local computed tokens handed to the connector were the
  maximum of the per-group hits (`num_new_local_computed_tokens = max(per_group_hits)`, 0.26.0
  `sched/scheduler.py`), more than the full-attention group could back when its tail had been evicted while a
  deeper Mamba state survived. Flag `connector_hit_from_full_attention`, read in
  `kv_cache_manager.connector_local_hit`, the scheduler's choice of what to hand the connector (0.27.0+:
  `KVCacheManager.get_computed_blocks_for_connector`). In 0.26.0's default Mamba mode, `all` (as `mamba_all`).
* `pre_50297`: the scheduler before vLLM #50297 (0.26.0): a request preempted while its last step's output is
  in flight takes that output when it returns, so a producing connector's request can finish after the
  preemption freed its blocks. Flag `requires_kv_delivery`, read by the P/D life cycle (`scheduler.py`) where the
  fix changed `Scheduler._preempt_request`'s call (`drop_stale_output=self.requires_kv_delivery`).
* `pre_55055`: before vLLM #55055 (0.30.0): a producer (NIXL's P side) truncated its prompt only for Mamba, so
  with a multi-module MTP drafter it computed, and handed, the last positions whose MTP-layer KV embeds
  unverified draft tokens. Flag `prefill_backoff_covers_lookahead`, read by `scheduler.py` where the fix changed
  `_prefill_backoff`. 0.30.0 also predates vLLM #57269 (0.31.0): its scheduler took a KV connector's hit for a
  request that skips reading the prefix cache (one asking for prompt logprobs), so a decode side loads such a
  producer's prompt too. Flag `connector_hit_skipped_when_skip_reading`, read by `scheduler.draft_kv_handed`'s
  caller, where the fix made `schedule` drop the connector's external tokens for such a request.
* `truncates_skip_reading`: 0.31.0's NIXL P side, whose `_truncate_request_for_prefill` truncates a request that
  skips reading the prefix cache as any other (0.32.0 added the test `not request.get_skip_reading_prefix_cache()`:
  its decode side loads nothing and recomputes the whole prompt, so the producer computes it all). Flag
  `truncation_spares_skip_reading`, read in `ProducerSchedulerConfig.prompt` (the truncation).
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
    # #57269 (0.31.0): the scheduler discards a KV connector's hit for a request that skips reading the prefix cache
    connector_hit_skipped_when_skip_reading: bool = True
    # 0.32.0: NIXL's P side does not truncate a request that skips reading the prefix cache (prompt logprobs)
    truncation_spares_skip_reading: bool = True
    # 0.33.0: Mamba prefix caching is mode `align` (one running-state block per allocation); before it, mode `all`
    mamba_cache_mode_align: bool = True

    @property
    def mamba_cache_mode(self) -> str:
        """Upstream's `MambaSpec.mamba_cache_mode` the flag stands for."""
        return "align" if self.mamba_cache_mode_align else "all"


# kv-cache-manager's variants (the manager and the coordinator) and kv-cache-manager-pd's (the scheduler's P/D
# life cycle): one record type, each system listing the variants whose flags it reads
VARIANTS = VariantTable(
    CacheManagerVariant("fixed"),
    CacheManagerVariant("mamba_all", mamba_cache_mode_align=False),
    CacheManagerVariant("pre_48195", connector_hit_from_full_attention=False, mamba_cache_mode_align=False),
)
PD_VARIANTS = VariantTable(
    CacheManagerVariant("fixed"),
    CacheManagerVariant("pre_50297", requires_kv_delivery=False),
    CacheManagerVariant("pre_55055", prefill_backoff_covers_lookahead=False,
                        connector_hit_skipped_when_skip_reading=False, truncation_spares_skip_reading=False),
    CacheManagerVariant("truncates_skip_reading", truncation_spares_skip_reading=False),
)
FIXED = VARIANTS.fixed
