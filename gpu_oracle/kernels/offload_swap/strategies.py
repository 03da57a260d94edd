"""Hypothesis strategies of the offload swap kernel properties (imported only when one runs).

The geometries are the model's own (`kvsim.properties.kv_offload.mapping_strategies.swap_cases`), drawn with
pages up to 40 bytes, and odd thread counts so the kernel's byte loop strides unevenly.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.properties.kv_offload.mapping_strategies import swap_cases

from .cases import skip_cases

SWAPS = st.tuples(swap_cases(max_page=40), st.booleans(), st.sampled_from((128, 1, 3, 32)))
PARTIAL_FIRST_SWAPS = st.tuples(swap_cases(max_page=40, partial_first=True), st.sampled_from((128, 1, 7)))
SKIP_CASES = st.sampled_from(skip_cases())
