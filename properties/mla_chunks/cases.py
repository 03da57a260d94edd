"""Cases and the pinned upstream regressions of the `mla-chunks` model (no Hypothesis: see `strategies`).

A case is the engine configuration plus the batch: context and query lengths, the block
size, the requested `chunked_prefill_workspace_size` (each variant applies its own lower
bound), `max_num_seqs`, DCP world size and interleave, `align_chunk_to_block`, and for the
numeric properties a tensor seed and an MLA shape. Cases are frozen dataclasses, so
counterexamples come out as plain JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from kvsim.engine.errors import ConfigError, check_int
from kvsim.engine.system import Sometimes
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.metadata import ContextMetadata, build_context_metadata, query_start_loc_of
from kvsim.models.mla_chunks.planner import FIXED, MlaVariant, chunked_context_workspace_size, mla_chunk_alignment
from kvsim.models.mla_chunks.prefill import MlaShape


@dataclass(frozen=True)
class MlaChunkCase:
    """One batch of prefills under one engine configuration."""

    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    block_size: int = 16
    workspace_size: int = 1024  # requested; variants lower-bound it (upstream tests hand-set it)
    max_num_seqs: int = 1
    dcp_world_size: int = 1
    dcp_interleave: int = 1
    align_chunk_to_block: bool = True
    seed: int = 0
    shape: MlaShape = MlaShape()

    def __post_init__(self) -> None:
        if not self.context_lens or len(self.context_lens) != len(self.query_lens):
            raise ConfigError("context_lens/query_lens", "equal, non-zero lengths",
                              (len(self.context_lens), len(self.query_lens)))
        for i, c in enumerate(self.context_lens):
            check_int(c, f"context_lens[{i}]", minimum=0)
        query_start_loc_of(self.query_lens)
        check_int(self.block_size, "block_size", minimum=1)
        check_int(self.workspace_size, "workspace_size", minimum=1)
        check_int(self.max_num_seqs, "max_num_seqs", minimum=1)
        if self.dcp_world_size == 1 and self.dcp_interleave != 1:
            raise ConfigError("dcp_interleave", "1 without DCP (dcp_world_size 1)", self.dcp_interleave)
        self.dcp  # validates world and interleave

    @property
    def dcp(self) -> DcpConfig | None:
        return None if self.dcp_world_size == 1 else DcpConfig(self.dcp_world_size, self.dcp_interleave)

    @property
    def query_start_loc(self) -> tuple[int, ...]:
        return query_start_loc_of(self.query_lens)

    @property
    def split_alignment(self) -> int:
        """The alignment the per-request plan uses for this configuration."""
        return mla_chunk_alignment(self.block_size if self.align_chunk_to_block else 1, self.dcp)

    def workspace(self, variant: MlaVariant = FIXED) -> int:
        return chunked_context_workspace_size(self.workspace_size, self.max_num_seqs, self.block_size, self.dcp,
                                              variant)

    def metadata(self, variant: MlaVariant = FIXED) -> ContextMetadata | None:
        return build_context_metadata(self.context_lens, self.query_lens, self.workspace_size, self.max_num_seqs,
                                      self.block_size, dcp=self.dcp, align_chunk_to_block=self.align_chunk_to_block,
                                      variant=variant)


@dataclass(frozen=True)
class MlaChunkCasePair:
    """The same batch and tensors under two configurations (metamorphic property)."""

    first: MlaChunkCase
    second: MlaChunkCase


def case(ctx: Sequence[int], q: Sequence[int] | None = None, **kw: Any) -> MlaChunkCase:
    """A case with query lengths 4 unless given (the upstream tests' default)."""
    return MlaChunkCase(tuple(ctx), tuple(q if q is not None else [4] * len(ctx)), **kw)


# -- pinned upstream cases (research note vllm.md 1.5; block 16, q 4 each unless stated) -----------

TILING_CASES = (  # test_chunks_gather_every_context_row_exactly_once, W 1024
    case([960] + [16] * 7), case([2048, 320]), case([1024, 1024, 1024]), case([37, 1000, 5]), case([1]))
CONTINUATION_CASE = case([2048, 32, 32], [3, 5, 7])
TAIL_SPLIT_CASE = case([768, 512, 512], [3, 5, 7])
SKIPPED_CASE = case([64, 0, 64, 0])
NO_CONTEXT_CASE = case([0, 0])
DCP_BUDGET_CASE = case([3000, 200, 200], block_size=128, dcp_world_size=2, dcp_interleave=64)
DCP_UNALIGNED_PREFIX_CASE = case([65, 96], [1, 1], block_size=64, workspace_size=128, dcp_world_size=4)
BACKEND_CASE = case([1536, 512, 0, 64, 80, 0], [32, 8, 8, 16, 16, 8])
KIMI_K3_CASE = case([200, 48, 32, 0], [8, 4, 6, 5], workspace_size=128)
PERF_CASE = case([60_000] + [16] * 31, workspace_size=65_536)
RFC_CASE = case([60_000] + [1_000] * 7, workspace_size=65_536)
# Note 1.7: the ordering assumption and the DCP split that is not a multiple of world*interleave.
CONTEXT_ORDER_CASE = case([0, 64])
DCP_MISALIGNED_CASE = case([1000, 1000, 1000], [1, 1, 1], block_size=64, dcp_world_size=2, dcp_interleave=64)

PLAN_EXAMPLES = (*TILING_CASES, CONTINUATION_CASE, TAIL_SPLIT_CASE, SKIPPED_CASE, NO_CONTEXT_CASE, DCP_BUDGET_CASE,
                 DCP_UNALIGNED_PREFIX_CASE, BACKEND_CASE, KIMI_K3_CASE, PERF_CASE, RFC_CASE)
DCP_EXAMPLES = (DCP_BUDGET_CASE, DCP_UNALIGNED_PREFIX_CASE, DCP_MISALIGNED_CASE)
# Numeric examples: the upstream batches at small dims, Kimi-K3 at its real latent shape.
KIMI_K3_SHAPE = MlaShape(num_heads=2, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
NUMERIC_EXAMPLES = (SKIPPED_CASE, CONTINUATION_CASE, TAIL_SPLIT_CASE, CONTEXT_ORDER_CASE,
                    replace(BACKEND_CASE, seed=42), replace(KIMI_K3_CASE, shape=KIMI_K3_SHAPE),
                    replace(DCP_BUDGET_CASE, context_lens=(1000, 200, 200), query_lens=(2, 3, 1)),
                    DCP_UNALIGNED_PREFIX_CASE)


# -- what some drawn batch must be (`sometimes`: a strategy that never draws these corners checks nothing there) -----

def _chunks(case: MlaChunkCase) -> tuple[Any, ...]:
    metadata = case.metadata(FIXED)
    return () if metadata is None else metadata.chunks


def _without_context(case: MlaChunkCase) -> bool:
    return 0 in case.context_lens


def _split_over_chunks(case: MlaChunkCase) -> bool:
    return any(chunk.is_continuation for chunk in _chunks(case))


def _requests_sharing_a_chunk(case: MlaChunkCase) -> bool:
    return any(chunk.request_slice.stop - chunk.request_slice.start > 1 for chunk in _chunks(case))


def _under_dcp(case: MlaChunkCase) -> bool:
    return case.dcp_world_size > 1


WITHOUT_CONTEXT = Sometimes("a_prefill_without_context", _without_context,
                            "a request with no context rows in the batch (#49294's empty spans)")
SPLIT_OVER_CHUNKS = Sometimes("a_context_split_over_chunks", _split_over_chunks,
                              "the fixed plan continues a request's context in a later chunk")
SHARED_CHUNK = Sometimes("requests_sharing_a_chunk", _requests_sharing_a_chunk,
                         "the fixed plan puts two or more requests' contexts in one chunk")
UNDER_DCP = Sometimes("a_batch_under_dcp", _under_dcp, "decode context parallelism (world size 2 or more)")
# the strategies that draw any batch (`PLAN_CASES`, `NUMERIC_CASES`), DCP batches only, context-ful prefills first
BATCH_SOMETIMES = (WITHOUT_CONTEXT, SPLIT_OVER_CHUNKS, SHARED_CHUNK, UNDER_DCP)
DCP_SOMETIMES = (SPLIT_OVER_CHUNKS, SHARED_CHUNK)
CONTEXT_FIRST_SOMETIMES = (WITHOUT_CONTEXT, SPLIT_OVER_CHUNKS, SHARED_CHUNK)
