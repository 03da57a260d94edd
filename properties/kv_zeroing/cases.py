"""The input of the kv-zeroing properties: one `zero_block_ids` call, and the pinned upstream cases (no Hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.models.kv_zeroing.geometry import KVCacheGeometry
from kvsim.models.kv_zeroing.layouts import (deepseek_v4_geometry, last_block_page_geometry,
                                             non_uniform_pages_geometry, overlaid_groups_geometry)


@dataclass(frozen=True)
class ZeroingCase:
    """One `zero_block_ids` call: the cache geometry and the logical block IDs handed to it."""

    geometry: KVCacheGeometry
    block_ids: tuple[int, ...]


# Pinned upstream cases (research note 2.5)
LAST_BLOCK_PAGE = ZeroingCase(last_block_page_geometry(), (3,))
DEEPSEEK_V4 = ZeroingCase(deepseek_v4_geometry(), (5, 99))
NON_UNIFORM_PAGES = ZeroingCase(non_uniform_pages_geometry(), (1, 2))
OVERLAID_GROUPS = ZeroingCase(overlaid_groups_geometry(), (0, 3))
PINNED = (LAST_BLOCK_PAGE, DEEPSEEK_V4, NON_UNIFORM_PAGES, OVERLAID_GROUPS)
