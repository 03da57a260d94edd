"""The input of the kv-zeroing properties: one `zero_block_ids` call, and the pinned upstream cases (no Hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.system import Sometimes
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


# -- what some drawn call must be (`sometimes`: a strategy that never draws these corners checks nothing there) -------

def _kernel_blocks_a_block(case: ZeroingCase) -> bool:
    return any(group.ratio > 1 for group in case.geometry.groups)


def _groups_sharing_an_allocation(case: ZeroingCase) -> bool:
    groups: dict[int, set[int]] = {}
    for view in case.geometry.views:
        if view.kind == "attention":
            groups.setdefault(view.allocation, set()).add(view.group)
    return any(len(held) > 1 for held in groups.values())


def _a_mamba_state(case: ZeroingCase) -> bool:
    return any(view.kind == "mamba" for view in case.geometry.views)


def _several_blocks(case: ZeroingCase) -> bool:
    return len(set(case.block_ids)) > 1


# the strategy of the properties over every layout family (`ZEROING_CASES`)
ZEROING_SOMETIMES = (
    Sometimes("a_block_of_several_kernel_blocks", _kernel_blocks_a_block,
              "a logical block spans two or more attention-kernel blocks (d6af803's stride)"),
    Sometimes("groups_sharing_an_allocation", _groups_sharing_an_allocation,
              "two KV-cache groups' layers in one allocation (overlaid pages)"),
    Sometimes("a_mamba_state", _a_mamba_state, "a state tensor the zeroer must leave alone"),
    Sometimes("several_blocks_a_call", _several_blocks, "one call zeroes two or more distinct blocks"),
)
