"""The variants of radix-cache: `fixed`, SGLang 0.5.23's `RadixCache` and `PagedTokenToKVPoolAllocator` as released
(with speculative decoding: 0.5.16 on), and `pre_31616` (0.5.15 and before: `eagle_prepare_for_decode` records an
unaligned decode allocation length, #31616, read in `eagle.page_aligned_decode_alloc_lens`). Those of radix-cache-swa
(the unified cache's SWA component), by release: `pre_28161` (0.5.13: UnifiedRadixCache has no `dec_swa_lock_only`,
so the scheduler's early release of the SWA window lock is skipped; and a tombstone's recovery frees a locked Full
value), `pre_locked_full_recovery` (0.5.14: the early release, the old recovery), `fixed` (0.5.15 to 0.5.19) and
`tree_core` (0.5.20's TreeCore, to 0.5.23: segment locks over tombstones, #38482's split recency, the Mamba lock
released once). A variant is a flag read at the line an upstream change made.
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
    # 0.5.15: an insert recovering an SWA tombstone whose Full value is locked keeps the Full slots (another
    # request's row holds them), maps them to the SWA slots of the incoming ones and frees the incoming Full slots
    # (`SWAComponent._restore_device_value_with_locked_full`); before, it freed the locked Full value
    recovers_under_full_lock: bool = True
    # 0.5.20's TreeCore (`mem_cache/unified_cache/`): the SWA lock is a segment lock counting every node up to the
    # window boundary, tombstones included (acquire, release and the early release walk each node of it)
    swa_lock_covers_tombstones: bool = False
    # #38482 (0.5.20): a split keeps the suffix's place in the SWA LRU and puts the prefix just older than it;
    # before, both entered it most recent
    split_keeps_suffix_recency: bool = False
    # 0.5.20's TreeCore: the final release after the early one skips SWA and the locks below it that the early
    # release dropped (`skip_swa_and_below`), and a Mamba release asserts lock_ref > 0; before, `dec_lock_ref(...,
    # skip_swa=True)` released the node's Mamba lock a second time (a release at lock_ref 0 doing nothing), taking
    # another request's
    mamba_lock_receipt: bool = False


SWA_VARIANTS = VariantTable(UnifiedSwaVariant("fixed", True), UnifiedSwaVariant("pre_28161", False, False),
                            UnifiedSwaVariant("pre_locked_full_recovery", True, False),
                            UnifiedSwaVariant("tree_core", True, True, True, True, True))
SWA_FIXED = SWA_VARIANTS.fixed
