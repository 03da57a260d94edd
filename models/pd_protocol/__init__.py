"""pd-protocol: the PD control protocol shared by Mooncake, NIXL and Mori (SGLang PR #35281).

* `variants`: `ProtocolVariant`, one flag per separate change of the PR; `VARIANTS`, `FIXED`.
* `wire`: control frames and one iteration of the bootstrap and decode threads (areas 1 and 3).
* `rooms`: per-room steps of the prefill (worker, clear, timeouts), heartbeat and start-up order (areas 1, 2, 5).
* `mori_layout`: which destination KV entries a PP stage writes: Mori's rule (area 4) and common/conn.py's.
* `actions`, `config`, `system`: the room lifecycle as a transition system with effects (`PdProtocol`).
* `sim`: the timed workload, a timing policy over that system.

The backend is a parameter (`--param backend=mori`, or `--backend mori`), not a variant.
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import sim
from .config import ProtocolConfig
from .conform import CONFORM
from .system import PdProtocol
from .variants import FIXED, VARIANTS, ProtocolVariant

DESCRIPTOR = ModelDescriptor(
    name="pd-protocol",
    summary="PD control protocol shared by Mooncake, NIXL and Mori; so far Mori's KV descriptor layout",
    source="sglang PR #35281",
    variants=VARIANTS,
    config=ProtocolConfig,
    system=lambda variant, config: PdProtocol(config, variant),
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    fault_kinds=("drop", "delay", "duplicate", "reorder", "garble", "crash"),
    peers=sim.PEERS,
    conform=CONFORM,
)

__all__ = ["DESCRIPTOR", "FIXED", "VARIANTS", "ProtocolVariant"]
