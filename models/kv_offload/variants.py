"""The variants of kv-offload: one flag per upstream change, read where it was made.

`fixed` is vLLM 0.33.0's `CPUOffloadingManager` (the newest release, new names).
`pre_already_stored_fix` is the manager before vLLM #35846 ("Prevent eviction of
already-stored blocks in LRU/ARC prepare_store()", merged 2026-03): `prepare_store`
made room for its new keys without protecting the offered keys that were already
stored, so a resident input key could be the eviction victim.

- `protect_input_keys` (#35846): read in `manager.CPUOffloadingManager.prepare_store`, where the
  protected set handed to `CachePolicy.evict` is built.

The #52615 rename (block -> chunk) is not a variant: it changed no behaviour, so it is two naming
adapters over one model (`names`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class OffloadVariant(Variant):
    protect_input_keys: bool  # #35846: every offered key is protected from the eviction prepare_store runs


VARIANTS = VariantTable(
    OffloadVariant("fixed", protect_input_keys=True),
    OffloadVariant("pre_already_stored_fix", protect_input_keys=False),
)
FIXED = VARIANTS.fixed
