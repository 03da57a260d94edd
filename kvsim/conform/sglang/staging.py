"""SGLang staging head slicing and slot layout (`common/staging_buffer.py`) against `pd-staging`: two sweeps.

* `HEAD_SLICE` (`compute_head_slice_params`): exhaustive over every total KV head count <= 128, every prefill
  and decode attention TP size <= 16, every decode rank and every writer of it (the model's `HeadReshard`
  pairing), each pair of ranks also as ranks of the next attention group (upstream reduces both ranks modulo
  their group); the four returned values compared by name.
* `LAYOUT` (`compute_staging_layout`): the same configurations and decode ranks (and the next group's), with
  (tokens, head bytes, layers) = (5, 6, 3), then the configurations with heads and TP sizes <= 4 over every
  tokens in {0, 1, 7}, head bytes in {1, 2, 128} and layers in {1, 2, 61}; the writer count, each writer's
  bytes and the total compared.

Conventions: upstream's argument order is (src_tp, dst_tp, src_rank, dst_rank, heads), the model's (heads,
prefill_tp, decode_tp, prefill_rank, decode_rank); upstream returns `num_heads_to_send` twice (src and dst);
a rank of another attention group is, for the model, its rank within the group (`rank % tp`); upstream's layout
calls the head slice with the writer index as `src_tp_rank`. Refused inputs (counted in the note, not compared):
TP sizes that are neither a divisor nor a multiple of the head count or of each other, which the model's
`HeadReshard` rejects (no TP setup upstream builds them) and upstream answers without a check.

Survivors (documented in the declaration; equivalent mutants on every configuration a TP setup builds): max's
arguments swapped; floor made ceiling division of heads and TP sizes (one divides the other, or the max(1, ...)
is 1 either way); `P_tp > D_tp` made `>=` (both branches agree at equal TP sizes); in `compute_staging_layout`
`max(1, dst_attn_tp_size)` with 0 (every TP size is >= 1), and the TP sizes, or the writer index and the decode
rank, swapped in its call of `compute_head_slice_params` (the heads a writer sends are max(1, heads // the larger
TP size), whatever the ranks).
"""

from __future__ import annotations

from itertools import product
from typing import Any, Iterator

from kvsim.engine.conformance.adapters import Context, Sweep
from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging.layout import HeadReshard, compute_head_slice_params, compute_staging_layout

from ..loader import check_signature

RELPATH = "sglang/srt/disaggregation/common/staging_buffer.py"
HEAD_PARAMS = ("src_attn_tp_size", "dst_attn_tp_size", "src_tp_rank", "dst_tp_rank", "total_kv_heads")
LAYOUT_PARAMS = ("src_attn_tp_size", "dst_attn_tp_size", "dst_tp_rank", "total_kv_heads", "num_tokens",
                 "bytes_per_head_token", "num_layers")
MAX_HEADS, MAX_TP = 128, 16
GROUPS = (0, 1)  # a rank of the first attention group, and of the next
TOKENS, HEAD_BYTES, LAYERS = 5, 6, 3  # the whole domain's slot: the layout is linear in them
SMALL = 4  # heads and TP sizes whose layouts are also swept over the slot sizes below
SLOT_SIZES = tuple(product((0, 1, 7), (1, 2, 128), (1, 2, 61)))  # (tokens, head bytes, layers)


def configurations(ctx: Context | None, max_heads: int = MAX_HEADS, max_tp: int = MAX_TP) -> Iterator[HeadReshard]:
    """Every configuration the model accepts, smallest first; those it refuses are counted (`refused`, with a
    context)."""
    for heads in range(1, max_heads + 1):
        for p in range(1, max_tp + 1):
            for d in range(1, max_tp + 1):
                try:
                    yield HeadReshard(heads, p, d)
                except ConfigError:
                    if ctx is not None:
                        ctx.count("refused")


# -- compute_head_slice_params ---------------------------------------------------------------------------------

def head_cases(ctx: Context) -> Iterator[dict[str, int]]:
    for cfg in configurations(ctx):
        p, d = cfg.prefill_tp, cfg.decode_tp
        for dr in range(d):
            for pr in cfg.writer_ranks(dr):
                for gp, gd in product(GROUPS, GROUPS):
                    yield {"heads": cfg.total_kv_heads, "prefill_tp": p, "decode_tp": d, "prefill_rank": pr + gp * p,
                           "decode_rank": dr + gd * d}


def head_model(ctx: Context, c: dict[str, int]) -> dict[str, int]:
    p, d = c["prefill_tp"], c["decode_tp"]
    m = compute_head_slice_params(c["heads"], p, d, c["prefill_rank"] % p, c["decode_rank"] % d)
    return {"src_head_start": m.src_head_start, "num_heads_to_send": m.num_heads, "dst_head_start": m.dst_head_start,
            "dst_num_heads": m.num_heads}


def head_upstream(ctx: Context, c: dict[str, int]) -> dict[str, int]:
    src_start, n, dst_start, dst_n = ctx.up.compute_head_slice_params(c["prefill_tp"], c["decode_tp"],
                                                                      c["prefill_rank"], c["decode_rank"], c["heads"])
    return {"src_head_start": src_start, "num_heads_to_send": n, "dst_head_start": dst_start, "dst_num_heads": dst_n}


def refused_note(ctx: Context, what: str) -> str:
    return f"exhaustive: {what}; {ctx.counts.get('refused', 0)} configurations refused by the model"


HEAD_SLICE = Sweep(
    prepare=lambda ctx: check_signature(ctx.up.compute_head_slice_params, HEAD_PARAMS,
                                        f"{RELPATH}:compute_head_slice_params"),
    domain=head_cases, model=head_model, upstream=head_upstream,
    note=lambda ctx: refused_note(ctx, f"heads <= {MAX_HEADS}, TP <= {MAX_TP}, every writer pairing, ranks of two "
                                       f"attention groups"))


# -- compute_staging_layout ------------------------------------------------------------------------------------

def layout_cases(ctx: Context) -> Iterator[dict[str, int]]:
    for cfg in configurations(ctx):
        yield from _slots(cfg, ((TOKENS, HEAD_BYTES, LAYERS),))
    for cfg in configurations(None, SMALL, SMALL):
        yield from _slots(cfg, SLOT_SIZES)


def _slots(cfg: HeadReshard, sizes: tuple[tuple[int, int, int], ...]) -> Iterator[dict[str, int]]:
    for dr, group, (tokens, head_bytes, layers) in product(range(cfg.decode_tp), GROUPS, sizes):
        yield {"heads": cfg.total_kv_heads, "prefill_tp": cfg.prefill_tp, "decode_tp": cfg.decode_tp,
               "decode_rank": dr + group * cfg.decode_tp, "tokens": tokens, "head_bytes": head_bytes, "layers": layers}


def layout_model(ctx: Context, c: dict[str, int]) -> dict[str, Any]:
    cfg = HeadReshard(c["heads"], c["prefill_tp"], c["decode_tp"])
    layout = compute_staging_layout(cfg, c["decode_rank"] % c["decode_tp"], c["tokens"], c["layers"], c["head_bytes"])
    return {"num_writers": len(layout.writer_heads),
            "writer_bytes": [layout.writer_size(w) for w in range(len(layout.writer_heads))],
            "total_bytes": layout.total_bytes}


def layout_upstream(ctx: Context, c: dict[str, int]) -> dict[str, Any]:
    n, sizes, total = ctx.up.compute_staging_layout(c["prefill_tp"], c["decode_tp"], c["decode_rank"], c["heads"],
                                                    c["tokens"], c["head_bytes"], c["layers"])
    return {"num_writers": n, "writer_bytes": list(sizes), "total_bytes": total}


LAYOUT = Sweep(
    prepare=lambda ctx: check_signature(ctx.up.compute_staging_layout, LAYOUT_PARAMS,
                                        f"{RELPATH}:compute_staging_layout"),
    domain=layout_cases, model=layout_model, upstream=layout_upstream,
    note=lambda ctx: refused_note(ctx, f"heads <= {MAX_HEADS}, TP <= {MAX_TP}, every decode rank of two attention "
                                       f"groups, a slot of {TOKENS} tokens x {HEAD_BYTES} head bytes x {LAYERS} "
                                       f"layers; heads and TP <= {SMALL} over {len(SLOT_SIZES)} slot sizes"))
