"""mla-backends: FlashInfer's batch MLA plan/run contract (PR #4031, released in 0.7.4).

* `variants`: the flag record `MlaBackendsVariant` and `VARIANTS` (#4051, #4452, #4031's transactional
  plan and typed fallback);
* `metadata`: the CSR, dense and dual metadata forms, their validation and both conversions;
* `capabilities`: every backend's capability matrix and the plan-time support check;
* `selection`: the auto order per compute capability, explicit / family / auto selection, the trace;
* `inputs`: packed, adjacent split, independent split and dual run inputs, and what each backend gets;
* `contract`: the input contract a plan promises and the run() check against it;
* `merge`: base-2 attention states and `merge_state` in float32, the empty-state rule;
* `paged`: absorbed MLA over a paged cache through either metadata form, chunked and merged;
* `wrapper`: the plan/run lifecycle as a transition system (`kvsim explore mla-backends`).
"""

from kvsim.engine.descriptor import ModelDescriptor

from .conform import CONFORM
from .variants import FIXED, VARIANTS, MlaBackendsVariant
from .wrapper import WrapperConfig, WrapperSystem

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "MlaBackendsVariant"]

DESCRIPTOR = ModelDescriptor(
    name="mla-backends",
    summary="FlashInfer batch MLA: metadata forms, backend selection with typed fallback, transactional "
            "plan/run, base-2 merge",
    source="FlashInfer #4031 (0.7.4); #4051, #4452; vLLM #28181, #39148",
    variants=VARIANTS,
    config=WrapperConfig,
    system=WrapperSystem,
    conform=CONFORM,
)
