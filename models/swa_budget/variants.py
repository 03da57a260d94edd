"""The variants of swa-budget: the record `SwaVariant` (one flag per upstream change) and `VARIANTS`, `fixed` first."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class SwaVariant(Variant):
    page_rounded_requirement: bool  # af7c62e: charge whole pages, not raw tokens, in _prealloc_required_tokens


VARIANTS = VariantTable(SwaVariant("fixed", page_rounded_requirement=True),
                        SwaVariant("pre_af7c62e", page_rounded_requirement=False))
FIXED = VARIANTS.fixed
