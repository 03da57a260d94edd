"""Head resharding and the staging slot layout for prefill TP != decode TP.

Follows sglang 05c7ebf (PR #30545): `compute_head_slice_params` and
`compute_staging_layout`, the staging helpers under
`python/sglang/srt/disaggregation/` used by the Mooncake and NIXL
connections, as read in the research note ../shared/research/sglang.md,
section 2.3 ("Head resharding", "Layout of one slot"). Unchanged by 05c7ebf,
so there is no variant here.

Heads per rank are ``src_per = max(1, H // P_tp)`` on prefill and
``dst_per = max(1, H // D_tp)`` on decode. When a TP size exceeds ``H`` the
KV heads are replicated (GQA): ``tp // H`` consecutive ranks hold the same
head, which is what the ``// max(1, tp // H)`` terms undo.

- ``P_tp > D_tp``: ``W = P_tp // D_tp`` prefill ranks write one decode rank;
  each sends its whole slice, writer index ``local_tp_rank % W``.
- ``P_tp <= D_tp``: one writer per decode rank, sending the decode rank's
  sub-slice of its own heads.

A slot holds the writers back to back; inside a writer ``[K layer 0..L-1]
[V layer 0..L-1]``, each layer ``tokens x n x head_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.errors import ConfigError, check_int, require


@dataclass(frozen=True)
class HeadReshard:
    """Total KV heads and the two attention TP sizes; the divisibility upstream TP setups require."""

    total_kv_heads: int
    prefill_tp: int
    decode_tp: int

    def __post_init__(self) -> None:
        h = check_int(self.total_kv_heads, "total_kv_heads", minimum=1)
        for name in ("prefill_tp", "decode_tp"):
            tp = check_int(getattr(self, name), name, minimum=1)
            if h % tp != 0 and tp % h != 0:
                raise ConfigError(name, f"a divisor or a multiple of total_kv_heads={h}", tp)
        p, d = self.prefill_tp, self.decode_tp
        if p % d != 0 and d % p != 0:
            raise ConfigError("decode_tp", f"a divisor or a multiple of prefill_tp={p}", d)

    @property
    def src_per(self) -> int:
        return max(1, self.total_kv_heads // self.prefill_tp)

    @property
    def dst_per(self) -> int:
        return max(1, self.total_kv_heads // self.decode_tp)

    @property
    def num_writers(self) -> int:
        """W: prefill ranks writing into one decode rank's slot."""
        return max(1, self.prefill_tp // self.decode_tp)

    def prefill_heads(self, rank: int) -> tuple[int, ...]:
        """Global KV heads prefill rank `rank` holds (replicas share a head when P_tp > H)."""
        check_int(rank, "prefill_rank", minimum=0, maximum=self.prefill_tp - 1)
        start = (rank // max(1, self.prefill_tp // self.total_kv_heads)) * self.src_per
        return tuple(range(start, start + self.src_per))

    def decode_heads(self, rank: int) -> tuple[int, ...]:
        """Global KV heads decode rank `rank` holds, in local order."""
        check_int(rank, "decode_rank", minimum=0, maximum=self.decode_tp - 1)
        start = (rank // max(1, self.decode_tp // self.total_kv_heads)) * self.dst_per
        return tuple(range(start, start + self.dst_per))

    def writer_ranks(self, decode_rank: int) -> tuple[int, ...]:
        """Prefill ranks that write decode rank `decode_rank`'s slot, by writer index."""
        check_int(decode_rank, "decode_rank", minimum=0, maximum=self.decode_tp - 1)
        if self.prefill_tp > self.decode_tp:
            w = self.num_writers
            return tuple(range(decode_rank * w, (decode_rank + 1) * w))
        return (decode_rank // (self.decode_tp // self.prefill_tp),)


@dataclass(frozen=True)
class HeadSliceParams:
    """What one prefill rank sends to one decode rank: `[src_head_start, +num_heads)` of its local
    heads, landing at local head `dst_head_start` of the decode rank, as writer `writer_index`."""

    src_head_start: int
    num_heads: int
    dst_head_start: int
    writer_index: int
    num_writers: int


def compute_head_slice_params(total_kv_heads: int, prefill_tp: int, decode_tp: int, prefill_rank: int,
                              decode_rank: int) -> HeadSliceParams:
    """Head slice that `prefill_rank` stages for `decode_rank` (the pair must be a writer pairing)."""
    cfg = HeadReshard(total_kv_heads, prefill_tp, decode_tp)
    require(prefill_rank in cfg.writer_ranks(decode_rank), "prefill_rank",
            f"one of the writers {cfg.writer_ranks(decode_rank)} of decode rank {decode_rank}", prefill_rank)
    h, src_per, dst_per = total_kv_heads, cfg.src_per, cfg.dst_per
    if prefill_tp > decode_tp:
        w = cfg.num_writers
        # the prefill rank's first global head, folded into the decode rank's local range
        dst_start = ((prefill_rank // max(1, prefill_tp // h)) * src_per) % dst_per
        return HeadSliceParams(0, src_per, dst_start, prefill_rank % w, w)
    # one writer: pick the decode rank's heads out of the prefill rank's (GQA replication via // (D_tp // H))
    src_start = ((decode_rank // max(1, decode_tp // h)) * dst_per) % src_per
    return HeadSliceParams(src_start, dst_per, 0, 0, 1)


def writers_of_decode_rank(cfg: HeadReshard, decode_rank: int) -> tuple[tuple[int, HeadSliceParams], ...]:
    """(prefill rank, its slice params) for every writer of `decode_rank`'s slot."""
    return tuple((r, compute_head_slice_params(cfg.total_kv_heads, cfg.prefill_tp, cfg.decode_tp, r, decode_rank))
                 for r in cfg.writer_ranks(decode_rank))


@dataclass(frozen=True)
class StagingLayout:
    """Byte layout of one staging slot of `tokens` tokens."""

    tokens: int
    num_layers: int
    head_bytes: int  # bytes of one head of one token (head_dim x dtype size)
    writer_heads: tuple[int, ...]  # heads each writer sends, by writer index

    def __post_init__(self) -> None:
        check_int(self.tokens, "tokens", minimum=0)
        check_int(self.num_layers, "num_layers", minimum=1)
        check_int(self.head_bytes, "head_bytes", minimum=1)
        require(len(self.writer_heads) >= 1, "writer_heads", "at least one writer", self.writer_heads)
        for i, n in enumerate(self.writer_heads):
            check_int(n, f"writer_heads[{i}]", minimum=1)

    def layer_bytes(self, writer: int) -> int:
        return self.tokens * self.writer_heads[writer] * self.head_bytes

    def writer_size(self, writer: int) -> int:
        return self.layer_bytes(writer) * self.num_layers * 2

    @property
    def writer_offsets(self) -> tuple[int, ...]:
        """Writer w's bytes start at the sum of the sizes of writers < w."""
        offsets, total = [], 0
        for w in range(len(self.writer_heads)):
            offsets.append(total)
            total += self.writer_size(w)
        return tuple(offsets)

    @property
    def total_bytes(self) -> int:
        return sum(self.writer_size(w) for w in range(len(self.writer_heads)))

    def region(self, writer: int, kv: int, layer: int) -> tuple[int, int]:
        """Byte range `[start, end)` of writer's K (kv=0) or V (kv=1) for `layer`."""
        check_int(writer, "writer", minimum=0, maximum=len(self.writer_heads) - 1)
        check_int(kv, "kv", minimum=0, maximum=1)
        check_int(layer, "layer", minimum=0, maximum=self.num_layers - 1)
        start = self.writer_offsets[writer] + (kv * self.num_layers + layer) * self.layer_bytes(writer)
        return start, start + self.layer_bytes(writer)


def compute_staging_layout(cfg: HeadReshard, decode_rank: int, tokens: int, num_layers: int,
                           head_bytes: int) -> StagingLayout:
    """Layout of `decode_rank`'s slot for `chunk_pages * page_size` tokens."""
    heads = tuple(p.num_heads for _, p in writers_of_decode_rank(cfg, decode_rank))
    return StagingLayout(tokens, num_layers, head_bytes, heads)


def prefill_buffer_bytes(cfg: HeadReshard, full_pages: int, page_size: int, num_layers: int, head_bytes: int) -> int:
    """Prefill-local staging buffer since #31217: one grid slot of this rank's full KV, `F * sum(kv_item_lens)`."""
    return full_pages * page_size * cfg.src_per * head_bytes * num_layers * 2
