"""radix-cache with EAGLE speculative decoding (`eagle`): #31616's variant found by `explore`, the fixed model clean,
the accounting invariants able to fail, and the page math by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.models.radix_cache import DESCRIPTOR, common, eagle

from toys import fails_alone

# page size 4, one prompt of 5 tokens and three requests sharing it, three draft tokens: a step reserves 6 positions
SPEC = {"page_size": 4, "num_pages": 4, "num_draft_tokens": 3, "max_tokens": 3, "prompt_len": 5}


def system(variant="fixed", values=SPEC):
    return DESCRIPTOR.build_system(variant, dict(values))


def test_explore_finds_the_unaligned_allocation_on_pre_31616_and_nothing_on_fixed():
    fixed = explore(system())
    assert fixed.bound_hit is None and fixed.violations == [] and fixed.hang_states == 0
    assert fixed.states == 123
    reached = {r.name for r in fixed.reachability if r.depth is not None}
    assert {"a_draft_is_rejected", "a_prefix_hit", "a_cached_prefix_is_evicted"} <= reached
    pre = explore(system("pre_31616"))
    (violation,) = pre.violations
    assert violation.property == "kv_allocated_whole_pages"
    # prompt 5 committed, reserve 6: nxt 11 recorded while the allocator handed out pages up to slot 12
    assert "kv_allocated_len 11 (committed 6)" in violation.message and "footprint 12" in violation.message
    assert [list(a) for a in violation.trace] == [["admit", 0], ["verify", 0, 1]]


def _keep_drafts(allocator, req, start_p, end_p):
    """A release that forgets the rejected drafts' slots (`_release_overallocated_kv_indices` skipped)."""


@pytest.mark.parametrize("name", ["pool_accounting", "all_free_when_done"])
def test_drafts_not_released_strand_pages(name, monkeypatch):
    # a pool with room for the stranded pages, so that every request still ends
    fails_alone(lambda: system(values={**SPEC, "num_pages": 6}), name,
                (common, "_release_overallocated_kv_indices", _keep_drafts), monkeypatch)


def test_the_page_math_by_hand():
    reqs = [SimpleNamespace(kv_allocated_len=5, kv_committed_len=5), SimpleNamespace(kv_allocated_len=12,
                                                                                    kv_committed_len=6)]
    # reserve 4 at page 4: 5 + 4 = 9 -> 12 (fixed) or 9 (pre_31616); the second already holds 12 >= 10
    assert eagle.page_aligned_decode_alloc_lens(reqs, 4, 4, True) == ([5, 12], [12, 12], 7)
    assert eagle.page_aligned_decode_alloc_lens(reqs, 4, 4, False) == ([5, 12], [9, 12], 4)
    req = common.Req(0, (1,) * 5, [8], list(range(4, 10)))  # committed 5, allocated 6
    assert eagle.decode_demand(req, 4, 4) == 4  # nxt 5 + 4 = 9: ceil(9) - ceil(6) = 12 - 8, the page the step adds
    assert eagle.row_fits([12], 4, 2, 12) and not eagle.row_fits([12], 4, 2, 11)
    assert eagle.row_fits([12], 4, None, 11) and eagle.row_fits([12], 1, 2, 11)


def test_the_config_leaves_room_for_the_reserve():
    # page 2: the longest input and a page need 5 pages; its last step's committed KV and reserve 12 tokens, 6
    tight = {**SPEC, "page_size": 2, "num_pages": 5}
    DESCRIPTOR.build_system("fixed", {**tight, "num_draft_tokens": 0})
    with pytest.raises(ConfigError) as err:
        DESCRIPTOR.build_system("fixed", tight)
    assert "6 pages or more" in str(err.value)
