"""pipelined-transfer: TensorRT-LLM's pipelined KV transfer for disaggregated serving (#15727).

* `chunks`: chunk coordinates (revisions A and B), SWA groups, receiver masking and
  `project_blocks_to_global_chunk`, as pure functions.
* `status`: `LlmRequestState` (numeric values), task and session states, the TxSession status
  derivation and the completion check (with the explicit "final slice submitted" flag).
* `variants`: `PipelinedVariant`, one flag per upstream change; `VARIANTS`, `FIXED`.
* `config`, `state`, `checks`, `system`: the transfer as a transition system (`PipelinedTransfer`), its
  `--param`s (`PipelinedConfig`) and invariants S1-S9, E1, E2; liveness E4 (settle) or E3 (release).
* `gates`: the configuration gates (S10).
* `timing`: the max-plus closed form of section 1.10; `sim`: the timed simulation, a timing policy over the
  system (`SimConfig`), pipelined against the one-transfer baseline on the same seed.
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import sim
from .config import PipelinedConfig
from .system import PipelinedTransfer
from .variants import FIXED, VARIANTS, PipelinedVariant

DESCRIPTOR = ModelDescriptor(
    name="pipelined-transfer",
    summary="TensorRT-LLM pipelined KV transfer: chunk coordinates (A/B), Tx/Rx sessions, slice ids, completion "
            "rule, cancel/timeout/retirement ownership",
    source="TensorRT-LLM #15727 (Python cache transceiver)",
    variants=VARIANTS,
    config=PipelinedConfig,
    system=PipelinedTransfer,
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    fault_kinds=sim.FAULT_KINDS,
    peers=sim.PEERS,
)

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "PipelinedVariant"]
