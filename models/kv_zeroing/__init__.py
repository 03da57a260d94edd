"""kv-zeroing: vLLM's `KVBlockZeroer` segment table and reference memset (vLLM d6af803, PR #50276).

* `geometry`: backing allocations, per-layer views and KV-cache groups, the arena they sit in, and
  `owned_bytes`, the oracle of which byte belongs to which block;
* `layouts`: builders of the packed, dense and overlaid layouts, and the pinned upstream geometries;
* `variants`: the variant record `ZeroingVariant` (one flag per d6af803 change) and `VARIANTS`;
* `zeroer`: the planner `plan_segments`, the launcher's `launch_config` and the reference memset `zero_blocks`.

A data-only model: no transition system, no timed simulation.
"""

from kvsim.engine.descriptor import ModelDescriptor

from .conform import CONFORM
from .variants import FIXED, VARIANTS, ZeroingVariant

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "ZeroingVariant"]

DESCRIPTOR = ModelDescriptor(
    name="kv-zeroing",
    summary="KVBlockZeroer segment table and zeroing of newly allocated KV blocks, packed layouts included",
    source="vllm d6af803 (PR #50276)",
    variants=VARIANTS,
    conform=CONFORM,
)
