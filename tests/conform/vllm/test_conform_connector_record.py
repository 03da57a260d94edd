"""The connector record's reading in `connector_hit_48195` (kvsim.conform.vllm.connector_hit), on records made by
hand (no release): each group's hit as its manager finds it, and whether the connector got full attention's hit
where that is the deepest (vLLM 0.27.0+ `get_computed_blocks_for_connector`)."""

from __future__ import annotations

from kvsim.conform.vllm.connector_hit import full_attention_handed, record_hits


def _record(local: int, *cached: str) -> dict:
    """A record of a 5-token request (two full blocks of 2 and one token): per group, "x" a cached block, "." none."""
    return {"local_tokens": local, "groups": [{"keys": ["k0", "k1"], "cached": [None if c == "." else c for c in g]}
                                              for g in cached]}


def test_each_groups_hit_is_read_as_its_manager_finds_it() -> None:
    # full attention: the cached blocks from the first; Mamba: the deepest cached block; a window: not read
    assert record_hits(_record(0, ".x", ".x", ".x"), ("full", "mamba", "swa"), 5) == [0, 4, None]
    assert record_hits(_record(0, "xx", "x."), ("full", "mamba"), 5) == [4, 2]
    assert record_hits(_record(0, "xx", "xx"), ("full", "mamba"), 4) == [2, 2]  # the lookup stops at num_tokens - 1


def test_the_connector_gets_full_attentions_hit_where_it_is_the_deepest() -> None:
    groups = ("full", "mamba")
    assert full_attention_handed(_record(4, "xx", "x."), groups, 5) is True  # Mamba lags: hit_diverged
    assert full_attention_handed(_record(2, "xx", "x."), groups, 5) is False  # reconciled where it must not be
    assert full_attention_handed(_record(0, "x.", "xx"), groups, 5) is None  # Mamba deeper: the reconciled hit
    assert full_attention_handed(_record(4, "xx", "xx"), ("full", "swa"), 5) is None  # the window's hit not read
