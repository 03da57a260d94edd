"""The configuration of the pd-protocol transition system: one place for every `--param`, bound and default."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.errors import check_int
from kvsim.engine.params import param

from ..pd_common.status import SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE
from .wire import BACKENDS, check_backend

UNBOUNDED = -1  # `faults`: no fault budget (the timed simulation, where the fault plan decides)


@dataclass(frozen=True)
class ProtocolConfig:
    """`kvsim explore pd-protocol --param`; the bounds are what exhaustive search covers in seconds.

    The timed simulation builds the same config with many rooms and an unbounded fault budget
    (`faults=UNBOUNDED`); those values are the config's to express but not offered on the command line.
    """

    backend: str = param("mooncake", "PD transfer backend", choices=BACKENDS)
    rooms: int = param(1, "requests sharing the prefill/decode pair", minimum=1, maximum=3)
    chunks: int = param(2, "KV chunks per room on the worker queue", minimum=1, maximum=32)
    faults: int = param(1, "fault actions allowed (drop, stale work, garbage, crash)", minimum=0, maximum=6)
    staging: bool = param(False, "1: the decode sends a staging WATERMARK after registering")
    max_failures: int = param(SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE,
                              "missed heartbeats before _handle_node_failure", minimum=1, maximum=64)

    def __post_init__(self) -> None:
        check_backend(self.backend)
        check_int(self.rooms, "rooms", minimum=1)
        check_int(self.chunks, "chunks", minimum=1)
        check_int(self.faults, "faults", minimum=UNBOUNDED)
        check_int(self.max_failures, "max_failures", minimum=1)
