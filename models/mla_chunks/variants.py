"""The variants of mla-chunks: the record `MlaVariant` (one flag per upstream change) and `VARIANTS`, `fixed` first."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class MlaVariant(Variant):
    """Where the variants differ; every flag is read at exactly one point of difference."""

    per_request_plan: bool  # b38e111d: ContextChunk plans instead of uniform batch columns
    aligned_workspace: bool  # b38e111d: align_mla_chunked_context_workspace_size lower bound
    mask_empty_context: bool  # #49294: neutralise empty spans of the uniform plan
    tokens_with_context_cutoff: bool  # pre-b38e111d: merge context only below prefill_tokens_with_context
    # b38e111d..vllm#51733: the aligned bound also covers max_num_seqs * alignment (#51733 dropped it; read
    # only on the aligned_workspace path, the pre-b38e111d bound max(W, max_num_seqs * block) is its own line)
    workspace_seq_term: bool


VARIANTS = VariantTable(
    MlaVariant("fixed", per_request_plan=True, aligned_workspace=True, mask_empty_context=False,
               tokens_with_context_cutoff=False, workspace_seq_term=False),
    MlaVariant("pre_b38e111d", per_request_plan=False, aligned_workspace=False, mask_empty_context=True,
               tokens_with_context_cutoff=True, workspace_seq_term=True),
    MlaVariant("uniform_unmasked", per_request_plan=False, aligned_workspace=False, mask_empty_context=False,
               tokens_with_context_cutoff=False, workspace_seq_term=True),
)
FIXED = VARIANTS.fixed
