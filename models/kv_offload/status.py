"""The manager's records: per-slot status, lookup results, events, store outputs and metric names.

Names follow vLLM 0.33.0 (`vllm/v1/kv_offload/base.py`, `cpu/policies/base.py`, `cpu/common.py`,
`tiering/base.py`). Keys are small integers here (upstream: `OffloadKey` bytes of a block hash and a
KV group index; the conformance adapter maps one to the other).
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class ChunkStatus:
    """One chunk slot's status: `ref_cnt == -1` write pending, `>= 0` ready with that many loads in flight."""

    __slots__ = ("ref_cnt", "chunk_id")

    def __init__(self, chunk_id: int, ref_cnt: int = -1) -> None:
        self.ref_cnt = ref_cnt
        self.chunk_id = chunk_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"ChunkStatus(chunk_id={self.chunk_id}, ref_cnt={self.ref_cnt})"


class LookupResult(str, Enum):
    """`OffloadingManager.lookup` (0.33.0; 0.29.0 and before returned False / None / True)."""

    MISS = "MISS"
    HIT = "HIT"
    HIT_PENDING = "HIT_PENDING"

    def __canon__(self) -> str:
        return self.value


class OffloadingEvent(NamedTuple):
    """What `take_events` yields (medium always CPU): keys stored, or removed (evicted, or a failed store's
    `metadata_only` release)."""

    keys: tuple[int, ...]
    removed: bool
    metadata_only: bool = False


class PrepareStoreOutput(NamedTuple):
    """`prepare_store`'s result: the keys to store and their slots (co-indexed), and the keys evicted."""

    keys_to_store: tuple[int, ...]
    chunk_ids: tuple[int, ...]
    evicted_keys: tuple[int, ...]


class CPUOffloadingMetrics:
    """`vllm/v1/kv_offload/cpu/common.py` (unchanged by #52615)."""

    STORES_SKIPPED = "vllm:kv_offload_stores_skipped"
    CPU_CACHE_USAGE_PERC = "vllm:kv_offload_cpu_cache_usage_perc"
    CPU_ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
    CPU_CACHE_WRITE_USAGE_PERC = "vllm:kv_offload_cpu_cache_write_usage_perc"
    CPU_CACHE_READ_USAGE_PERC = "vllm:kv_offload_cpu_cache_read_usage_perc"


class TieringOffloadingMetrics:
    """`vllm/v1/kv_offload/tiering/base.py` after #52615 (attribute names) and #52812 (the strings)."""

    CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
    CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits"


# The metric strings before #52812 (never registered by a release this model states).
OLD_METRIC_STRINGS = ("vllm:kv_offload_tiering_block_queries", "vllm:kv_offload_tiering_block_hits")
