"""kv-offload: vLLM's CPU offloading manager over chunk slots (vllm/v1/kv_offload/cpu/manager.py, 0.33.0).

* `variants`: `OffloadVariant`, one flag per upstream change (#35846, the already-stored key); `VARIANTS`.
* `status`, `policies`, `manager`: the slot status, LRU and ARC, and `CPUOffloadingManager` itself;
  `context`: a request's `ReqContext` (the key positions the scheduler records, LRU's request rank).
* `names`: the #52615 rename (block -> chunk) as two naming adapters over the one model.
* `checks`, `actions`, `system`: the manager under several requests as a transition system
  (`OffloadSystem`, its config `OffloadSystemConfig`: the `kvsim explore --param`s) and its invariants.
* `sim`: timed offload traffic (Poisson arrivals over shared documents), a timing policy over that system.
* `mapping`: the worker-side GPU block <-> CPU chunk mapping.
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import sim
from .conform import CONFORM
from .system import OffloadSystem, OffloadSystemConfig
from .variants import FIXED, VARIANTS, OffloadVariant

DESCRIPTOR = ModelDescriptor(
    name="kv-offload",
    summary="CPU offloading manager over chunk slots: free list, ref counts, LRU/ARC eviction, atomic "
            "prepare_store, failed-store recovery; the #52615 block -> chunk rename",
    source="vllm 0.33.0 (vllm/v1/kv_offload/cpu/manager.py; #52615, #35846)",
    variants=VARIANTS,
    config=OffloadSystemConfig,
    system=OffloadSystem,
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    fault_kinds=sim.FAULT_KINDS,
    peers=sim.PEERS,
    conform=CONFORM,
)

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "OffloadVariant"]
