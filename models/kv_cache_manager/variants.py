"""The variants of kv-cache-manager. This slice models vLLM 0.33.0's block pool and full-attention manager as
released, so `fixed` is the only variant; the seed bugs of issue 33 (#48195, #50297, #55055) live in the hybrid
coordinator and the scheduler, and come with their flags when those are modelled."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class CacheManagerVariant(Variant):
    pass


VARIANTS = VariantTable(CacheManagerVariant("fixed"))
FIXED = VARIANTS.fixed
