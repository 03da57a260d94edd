"""The variants of mla-chunks: the record `MlaVariant` (one flag per upstream change) and `VARIANTS`, `fixed` first.

* `fixed`: the released code (vLLM 0.28.0 on): b38e111d's per-request planner and aligned workspace, with
  vllm#51733's workspace bound `round_up(max(W, alignment), alignment)`.
* `b38e111d`: the seed commit itself (vLLM #50613, never released on its own): the same planner, its own workspace
  bound `round_up(max(W, max_num_seqs * alignment), alignment)`, which #51733 dropped (0.28.0).
* `pre_b38e111d`: the uniform planner before the seed commit, with its empty-span mask (#49294) and the
  `prefill_tokens_with_context` cutoff; `uniform_unmasked`: the uniform planner before #49294.
"""

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
    MlaVariant("b38e111d", per_request_plan=True, aligned_workspace=True, mask_empty_context=False,
               tokens_with_context_cutoff=False, workspace_seq_term=True),
    MlaVariant("pre_b38e111d", per_request_plan=False, aligned_workspace=False, mask_empty_context=True,
               tokens_with_context_cutoff=True, workspace_seq_term=True),
    MlaVariant("uniform_unmasked", per_request_plan=False, aligned_workspace=False, mask_empty_context=False,
               tokens_with_context_cutoff=False, workspace_seq_term=True),
)
FIXED = VARIANTS.fixed
