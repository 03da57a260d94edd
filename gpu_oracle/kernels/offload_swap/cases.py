"""The offload swap kernel's cases (no Hypothesis here): the planted skip_count scenario for AddressSanitizer.

One tensor with 8-byte pages, blocks_per_chunk 4, three CPU chunk slots; one KV cache group of one data
reference. A group from logical block 2 (skip_count 2) of six blocks fills its second chunk exactly, so a
skip_count one too high makes the last triple name sub-block 8, one id past the group's two-entry chunk list;
a group of five blocks leaves room in its last chunk, so the same planted skip stays inside the list and only
shifts the copies by one sub-block (ASan sees nothing there; the differential does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvsim.models.kv_offload.mapping import DataRef, SwapGeometry, SwapSegment, TransferSpec, plan_swap, side_bytes

GEOMETRY = SwapGeometry(gpu_page_bytes=(8,), num_gpu_blocks=8, num_cpu_chunks=3, blocks_per_chunk=4,
                        group_data_refs=((DataRef(0, 8),),))


@dataclass(frozen=True, eq=False)
class SkipCase:
    """One swap of the scenario: the model's segments, or the same with skip_count planted one too high."""

    what: str
    gpu_to_cpu: bool
    spec: TransferSpec
    planted: bool  # the CPU side's skip_count is block_index % blocks_per_chunk + 1
    overrun: bool  # the planted skip reads past the chunk list (the model's prediction; ASan must agree)

    @property
    def segments(self) -> tuple[SwapSegment, ...]:
        segments = plan_swap(GEOMETRY, self.spec, self.gpu_to_cpu).segments
        if not self.planted:
            return segments
        side = "dst_skip" if self.gpu_to_cpu else "src_skip"
        return tuple(replace(s, **{side: getattr(s, side) + 1}) for s in segments)

    def buffers(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        rng = np.random.default_rng(52615)
        gpu = [rng.integers(0, 256, n, dtype=np.uint8) for n in side_bytes(GEOMETRY, True)]
        cpu = [rng.integers(0, 256, n, dtype=np.uint8) for n in side_bytes(GEOMETRY, False)]
        return (gpu, cpu) if self.gpu_to_cpu else (cpu, gpu)

    def __canon__(self) -> str:
        return self.what


def skip_cases() -> list[SkipCase]:
    full = TransferSpec(block_ids=(7, 1, 4, 0, 5, 2), group_sizes=(6,), block_indices=(2,), chunk_ids=(2, 0))
    partial = TransferSpec(block_ids=(7, 1, 4, 0, 5), group_sizes=(5,), block_indices=(2,), chunk_ids=(2, 0))
    return [
        SkipCase("store of blocks 2..7 into chunks (2, 0), skip_count 2", True, full, False, False),
        SkipCase("store of blocks 2..7 into chunks (2, 0), planted skip_count 3", True, full, True, True),
        SkipCase("load of blocks 2..7 from chunks (2, 0), planted skip_count 3", False, full, True, True),
        SkipCase("store of blocks 2..6 into chunks (2, 0), planted skip_count 3", True, partial, True, False),
    ]
