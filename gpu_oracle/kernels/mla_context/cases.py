"""The MLA kernels' cases (no Hypothesis here): gather launches, merge states, prefills, bad metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from kvsim.models.mla_chunks.metadata import build_context_metadata
from kvsim.models.mla_chunks.planner import FIXED, MlaVariant
from kvsim.models.mla_chunks.prefill import (MlaShape, PagedLatentCache, build_context_caches, build_paged_latent_cache,
                                             make_mla_prefill_inputs)
from kvsim.properties.mla_chunks.cases import MlaChunkCase


@dataclass(frozen=True)
class GatherCase:
    """A batch planned by `variant`'s metadata builder, and how its paged cache is stored."""

    batch: MlaChunkCase
    variant: MlaVariant
    latent_width: int
    dtype: str
    entry_pad: int  # extra elements after each cache entry (a padded entry stride)
    threads: int


def _cast_cache(cache: PagedLatentCache, dtype: str, entry_pad: int) -> np.ndarray:
    """The cache in `dtype`, as a view into a buffer whose entries are `entry_pad` elements wider."""
    nb, bs, width = cache.kv_cache.shape
    buffer = np.full((nb, bs, width + entry_pad), 7, dtype=dtype)
    buffer[:, :, :width] = cache.kv_cache.astype(dtype)
    return buffer[:, :, :width]


def gather_launches(case: GatherCase) -> Iterator[tuple[str, np.ndarray, np.ndarray, Any, Any, Any]]:
    """(what, kv_cache, block_table, cu_seq_lens, token_to_seq, seq_starts) for every chunk and DCP rank."""
    batch = case.batch
    metadata = batch.metadata(case.variant)
    if metadata is None:
        return
    shape = MlaShape(kv_lora_rank=case.latent_width, qk_rope_head_dim=1)
    inputs = make_mla_prefill_inputs(batch.context_lens, batch.query_lens, shape, seed=batch.seed)
    caches = build_context_caches(inputs, batch.block_size, batch.dcp, seed=batch.seed)
    for chunk in metadata.chunks:
        rs = chunk.request_slice
        for rank, cache in enumerate(caches):
            table = cache.block_table[rs]
            kv = _cast_cache(cache, case.dtype, case.entry_pad)
            if batch.dcp is None:
                yield f"chunk {chunk.index}", kv, table, chunk.cu_seq_lens, chunk.token_to_seq, chunk.starts
            else:
                yield (f"chunk {chunk.index} rank {rank}", kv, table, chunk.padded_local_cu_seq_lens,
                       chunk.padded_local_token_to_seq, chunk.local_starts)


@dataclass(frozen=True, eq=False)
class BadMetadataCase:
    """A gather fed to the ASan build: the builder's metadata (`overrun` False) or a wrong one."""

    what: str
    kv_cache: np.ndarray
    block_table: np.ndarray
    cu_seq_lens: tuple[int, ...]
    token_to_seq: tuple[int, ...]
    seq_starts: tuple[int, ...]
    overrun: bool

    @property
    def arguments(self) -> tuple[Any, ...]:
        return self.kv_cache, self.block_table, self.cu_seq_lens, self.token_to_seq, self.seq_starts

    def __canon__(self) -> str:
        return self.what


def bad_metadata_cases() -> list[BadMetadataCase]:
    """Requests with context 5 and 8 rows, block 4, one chunk: the builder's metadata, then two wrong ones.

    The second request's table row ends exactly at its last block, so one row too far is out of the table.
    """
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal((n, 6)).astype(np.float32) for n in (5, 8)]
    cache = build_paged_latent_cache(rows, (5, 8), 4, 6, rng)
    kv = cache.kv_cache.astype(np.float32)
    metadata = build_context_metadata((5, 8), (1, 1), 64, 2, 4, variant=FIXED)
    assert metadata is not None and len(metadata.chunks) == 1
    chunk = metadata.chunks[0]
    good = (tuple(chunk.cu_seq_lens), tuple(chunk.token_to_seq), tuple(chunk.starts))
    shifted = (chunk.cu_seq_lens[0], chunk.cu_seq_lens[1] - 1, chunk.cu_seq_lens[2])
    foreign = cache.block_table.copy()
    foreign[1, 1] = kv.shape[0]  # a block id from a larger cache
    return [BadMetadataCase("builder metadata", kv, cache.block_table, *good, overrun=False),
            BadMetadataCase("cu_seq_lens[1] one row early", kv, cache.block_table, shifted, good[1], good[2],
                            overrun=True),
            BadMetadataCase("block table naming block num_blocks", kv, foreign, *good, overrun=True)]


@dataclass(frozen=True, eq=False)
class MergeCase:
    prefix_output: np.ndarray  # float32 [T, H, D]
    prefix_lse: np.ndarray  # float32 [H, T]
    suffix_output: np.ndarray
    suffix_lse: np.ndarray
    head_pad: int
    token_pad: int
    threads: int
    with_lse: bool

    def __canon__(self) -> dict[str, Any]:  # the shape and the LSEs; the outputs are uniform noise
        return {"T_H_D": self.prefix_output.shape, "prefix_lse": self.prefix_lse, "suffix_lse": self.suffix_lse,
                "head_pad": self.head_pad, "token_pad": self.token_pad, "threads": self.threads,
                "with_lse": self.with_lse}
