"""The PD staging kernels' cases (no Hypothesis here): one writer's copy, and the slot-overrun scenario."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging.layout import HeadReshard, HeadSliceParams, StagingLayout
from kvsim.models.pd_staging.plan import StagingPlanConfig, plan_room_sends
from kvsim.models.pd_staging.variants import VARIANTS

DTYPES = ("float16", "uint8", "float32", "float64")
SCENARIO_A_PREFILL_HIT = 608  # section 2.9: the first batch then ends at 864


@dataclass(frozen=True)
class CopyCase:
    """One writer's copy between a paged pool and a staging buffer."""

    reshard: tuple[int, int, int]  # H, P_tp, D_tp
    decode_rank: int
    writer: int
    num_layers: int
    head_dim: int
    dtype: str
    page_size: int
    pool_pages: int
    pages: tuple[int, ...]
    pad: int  # garbage bytes after the slot
    offset: int | None  # None: the writer's offset in the slot
    threads: int
    seed: int

    @property
    def params(self) -> HeadSliceParams:
        cfg = HeadReshard(*self.reshard)
        return layout.writers_of_decode_rank(cfg, self.decode_rank)[self.writer][1]

    @property
    def layout(self) -> StagingLayout:
        head_bytes = self.head_dim * np.dtype(self.dtype).itemsize
        return layout.compute_staging_layout(HeadReshard(*self.reshard), self.decode_rank,
                                             len(self.pages) * self.page_size, self.num_layers, head_bytes)

    def pool(self, heads: int, salt: int) -> np.ndarray:
        shape = (self.num_layers, 2, self.pool_pages, self.page_size, heads, self.head_dim)
        rng = np.random.default_rng([self.seed, salt])
        nbytes = int(np.prod(shape)) * np.dtype(self.dtype).itemsize
        return rng.integers(0, 256, nbytes, dtype=np.uint8).view(self.dtype).reshape(shape)

    def staging(self) -> np.ndarray:
        lay = self.layout
        size = max(lay.total_bytes, (self.offset or 0) + lay.writer_size(self.writer)) + self.pad
        return np.random.default_rng([self.seed, 7]).integers(0, 256, size, dtype=np.uint8)


@dataclass(frozen=True, eq=False)
class OverrunCase:
    """One copy of scenario A's first send against slot 0 (uint8 KV, one layer, head_dim 1), unchecked."""

    what: str
    kernel: str  # "gather" or "scatter"
    pool: np.ndarray
    pages: np.ndarray
    params: HeadSliceParams
    sent: StagingLayout  # the layout of what the send carries
    slot: np.ndarray  # slot 0's buffer for decode rank 0 (16 pages)
    overrun: bool  # the send is larger than the slot (the model's plan says so; ASan must agree)

    def __canon__(self) -> str:
        return self.what


def overrun_cases() -> list[OverrunCase]:
    """Scenario A on prefill TP 1 -> decode TP 4: each variant's first send gathered into slot 0, and the
    pre-05c7ebf one (54 pages named chunk 0) also scattered back out of it."""
    cfg, res = StagingPlanConfig(1000, 0, 16, 256), HeadReshard(8, 1, 4)
    (_, params), = layout.writers_of_decode_rank(res, 0)
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 256, (1, 2, cfg.suffix_pages, cfg.page_size, res.src_per, 1), dtype=np.uint8)
    slot = layout.compute_staging_layout(res, 0, cfg.full_chunk_pages * cfg.page_size, 1, 1)
    buffer = np.zeros(slot.total_bytes, dtype=np.uint8)
    cases = []
    for variant in (VARIANTS.fixed, VARIANTS["pre_05c7ebf"]):
        send = plan_room_sends(cfg, SCENARIO_A_PREFILL_HIT, variant=variant).sends[0]
        sent = layout.compute_staging_layout(res, 0, send.num_pages * cfg.page_size, 1, 1)
        pages = np.arange(send.page_start, send.page_end)
        what = f"{variant.name} send 0 ({send.num_pages} pages, chunk {send.chunk_idx})"
        overrun = sent.total_bytes > slot.total_bytes
        cases.append(OverrunCase(f"{what} gathered into slot 0", "gather", pool, pages, params, sent, buffer, overrun))
        if overrun:
            decode_pool = rng.integers(0, 256, (1, 2, cfg.suffix_pages, cfg.page_size, res.dst_per, 1), dtype=np.uint8)
            cases.append(OverrunCase(f"{what} scattered from slot 0", "scatter", decode_pool, pages, params, sent,
                                     buffer, overrun))
    return cases
