"""The variants of radix-cache: `fixed`, SGLang 0.5.23's `RadixCache` and `PagedTokenToKVPoolAllocator` as released
(with speculative decoding: 0.5.16 on), and `pre_31616` (0.5.15 and before: `eagle_prepare_for_decode` records an
unaligned decode allocation length, #31616, read in `eagle.page_aligned_decode_alloc_lens`). Those of radix-cache-swa
(the unified cache's SWA component): `fixed` (0.5.14) and `pre_28161` (0.5.13:
UnifiedRadixCache has no `dec_swa_lock_only`, so the scheduler's early release of the SWA window lock is skipped). A variant is a flag read at the line an upstream change made.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class RadixCacheVariant(Variant):
    page_aligned_nxt: bool  # #31616 (0.5.16): eagle_prepare_for_decode rounds nxt up to the page boundary


VARIANTS = VariantTable(RadixCacheVariant("fixed", True), RadixCacheVariant("pre_31616", False))
FIXED = VARIANTS.fixed


@dataclass(frozen=True)
class UnifiedSwaVariant(Variant):
    """The variants of radix-cache-swa (`unified_swa`, `swa_system`)."""

    has_dec_swa_lock_only: bool  # #28161 (0.5.14): UnifiedRadixCache.dec_swa_lock_only exists


SWA_VARIANTS = VariantTable(UnifiedSwaVariant("fixed", True), UnifiedSwaVariant("pre_28161", False))
SWA_FIXED = SWA_VARIANTS.fixed
