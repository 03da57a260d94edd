"""mla-chunks: MLA chunked context, vLLM b38e111d (PR #50613, RFC #50497) and `mask_empty_context` (#49294).

* `variants`: the variant record `MlaVariant` (one flag per upstream change), `VARIANTS`, `FIXED`.
* `planner`: the per-request `ContextChunk` planner, the old uniform plan and the workspace size.
* `dcp`: decode context parallelism: the rank layout and `reorg_kvcache`.
* `metadata`: the per-chunk metadata of both plans and the accumulation schedule.
* `attention`: the float64 kernels (gather, attention with LSE, merge).
* `prefill`: the chunked prefill end to end and the full-attention references.

Data properties only: no transition system, no timed simulation.
"""

from kvsim.engine.descriptor import ModelDescriptor

from .conform import CONFORM
from .variants import FIXED, VARIANTS, MlaVariant

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "MlaVariant"]

DESCRIPTOR = ModelDescriptor(
    name="mla-chunks",
    summary="MLA chunked context: per-request ContextChunk plan, DCP reorg, chunked attention vs full attention",
    source="vLLM b38e111d (#50613, RFC #50497); mask_empty_context #49294",
    variants=VARIANTS,
    conform=CONFORM,
)
