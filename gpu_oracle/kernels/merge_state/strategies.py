"""Hypothesis strategies of the merge_state kernel properties: the model's merge cases (rows empty on any side)
with a thread count (imported only when a property runs)."""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.properties.mla_backends.strategies import merge_cases

KERNEL_MERGE_CASES = st.tuples(merge_cases(), st.sampled_from((1, 3, 32)))
