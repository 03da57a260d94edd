"""The variants of kv-cache-manager: one flag per upstream change, read where it was made.

`fixed` is vLLM 0.33.0's manager as released (the #48195 fix has been in since 0.27.0).
`pre_48195` is vLLM 0.26.0's scheduler before vLLM #48195 / #48425 (commit 229e01e9e, issue #46453): for a hybrid
model with Mamba layers and a KV connector, the local computed tokens handed to the connector were the maximum of
the per-group hits (`num_new_local_computed_tokens = max(per_group_hits)`, 0.26.0 `sched/scheduler.py`), more
than the full-attention group could back when its tail had been evicted while a deeper Mamba state survived.

- `connector_hit_from_full_attention` (#48195): read in `kv_cache_manager.connector_local_hit`, the scheduler's
  choice of what to hand the connector (0.27.0+: `KVCacheManager.get_computed_blocks_for_connector`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class CacheManagerVariant(Variant):
    # #48195: the connector's local hit is the full-attention group's (or the reconciled one), never a deeper group's
    connector_hit_from_full_attention: bool = True


VARIANTS = VariantTable(
    CacheManagerVariant("fixed", connector_hit_from_full_attention=True),
    CacheManagerVariant("pre_48195", connector_hit_from_full_attention=False),
)
FIXED = VARIANTS.fixed
