"""pd-staging: the PD disaggregation staging transfer of SGLang 05c7ebf (PR #30545).

* `variants`: `StagingVariant`, one flag per 05c7ebf change; `VARIANTS`, `FIXED`.
* `plan`, `layout`, `ring`, `copy`: the step-1 functions (send plan, head slicing and slot layout,
  the staging ring, the byte-level gather and scatter).
* `actions`, `state`, `data`, `checks`, `system` (with its `prefill` and `decode` sides): the transfer
  as a transition system (`PdStaging`),
  its config (`StagingSystemConfig`, the `kvsim explore --param`s) and invariants;
  `decode_rules`: the decode handler's three pure decisions (dedupe, fan-in, completion), which
  `kvsim conform sglang` compares with upstream's own functions.
* `sim`: the timed simulation, a timing policy over that system (`SimConfig`).
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import mechanisms, sim
from .conform import CONFORM
from .data import StagingSystemConfig
from .system import PdStaging
from .variants import FIXED, VARIANTS, StagingVariant

DESCRIPTOR = ModelDescriptor(
    name="pd-staging",
    summary="PD disaggregation: decode-side staging ring with radix cache and prefill TP != decode TP "
            "(send plan, head slicing, slot layout, ring allocator, KVPoll status rules)",
    source="sglang 05c7ebf (PR #30545)",
    variants=VARIANTS,
    config=StagingSystemConfig,
    system=PdStaging,
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    fault_kinds=sim.FAULT_KINDS,
    peers=sim.PEERS,
    mechanisms=mechanisms.MECHANISMS,
    conform=CONFORM,
)

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "StagingVariant"]
