"""Hypothesis strategies of the MLA kernel properties (imported only when one runs).

Batches come from the model's own strategy (`kvsim.properties.mla_chunks.strategies.mla_cases`),
sized for the float64 path; the kernel cases add what only a kernel sees: the cache dtype, a padded
entry stride, the thread count, the head shape.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from kvsim.models.mla_chunks.variants import VARIANTS
from kvsim.models.mla_chunks.prefill import MlaShape
from kvsim.properties.mla_chunks.cases import MlaChunkCase
from kvsim.properties.mla_chunks.strategies import mla_cases

from .cases import GatherCase, MergeCase, bad_metadata_cases


def batches(max_query: int) -> st.SearchStrategy[MlaChunkCase]:
    """Up to 4 prefills of up to 40 context rows, small workspaces (many chunks and continuations), DCP or not."""
    return mla_cases(max_requests=4, max_context=40, max_query=max_query, blocks=(1, 2, 3, 4, 8),
                     max_workspace=64)


@st.composite
def gather_cases(draw: st.DrawFn) -> GatherCase:
    return GatherCase(draw(batches(3)), draw(st.sampled_from(tuple(VARIANTS.values()))), draw(st.integers(1, 12)),
                      draw(st.sampled_from(("float64", "float32", "float16"))), draw(st.sampled_from((0, 0, 3))),
                      draw(st.sampled_from((64, 1, 5, 256))))


@st.composite
def merge_cases(draw: st.DrawFn) -> MergeCase:
    t, h, d = draw(st.integers(0, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude, spread = draw(st.sampled_from((1.0, 100.0))), draw(st.sampled_from((1.0, 30.0)))
    # Per (head, token): 0 both finite, 1 prefix empty, 2 suffix empty, 3 both empty; each -inf or FA2's +inf.
    kinds = rng.choice(4, size=(h, t), p=draw(st.sampled_from(((1, 0, 0, 0), (.4, .2, .2, .2), (0, 0, 0, 1)))))
    lses = []
    for empty_kinds in ((1, 3), (2, 3)):
        lse = (rng.standard_normal((h, t)) * spread).astype(np.float32)
        empty = np.isin(kinds, empty_kinds)
        lse[empty] = np.where(rng.random(empty.sum()) < 0.75, -np.inf, np.inf)
        lses.append(lse)
    outs = [(rng.uniform(-1, 1, (t, h, d)) * magnitude).astype(np.float32) for _ in range(2)]
    return MergeCase(outs[0], lses[0], outs[1], lses[1], draw(st.integers(0, 3)), draw(st.integers(0, 3)),
                     draw(st.sampled_from((32, 1, 3, 128))), draw(st.booleans()))


@st.composite
def prefill_cases(draw: st.DrawFn) -> MlaChunkCase:
    """A batch of `batches` with a small random head shape."""
    shape = MlaShape(num_heads=draw(st.integers(1, 3)), kv_lora_rank=draw(st.integers(1, 12)),
                     qk_rope_head_dim=draw(st.integers(1, 4)), qk_nope_head_dim=draw(st.integers(1, 6)),
                     v_head_dim=draw(st.integers(1, 6)))
    return replace(draw(batches(4)), shape=shape)


GATHER_CASES = gather_cases()
MERGE_CASES = merge_cases()
PREFILL_CASES = prefill_cases()
BAD_METADATA = st.sampled_from(bad_metadata_cases())
