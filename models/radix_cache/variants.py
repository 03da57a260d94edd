"""The variants of radix-cache: `fixed` only, SGLang 0.5.23's `RadixCache` and `PagedTokenToKVPoolAllocator` as
released. The seed fixes this model family is for live in the unified / SWA caches and the EAGLE accounting, later
models; a variant of this one is a flag read at the line an upstream change made, when one is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class RadixCacheVariant(Variant):
    pass


VARIANTS = VariantTable(RadixCacheVariant("fixed"))
FIXED = VARIANTS.fixed
