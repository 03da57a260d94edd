"""SGLang staging head slicing and slot layout (`common/staging_buffer.py`) against `pd-staging`.

Exhaustive over every total KV head count <= 128 and every prefill/decode attention TP size
<= 16, every decode rank and every writer of it (the model's `HeadReshard` pairing).
Conventions: upstream's argument order is (src_tp, dst_tp, src_rank, dst_rank, heads), the
model's (heads, prefill_tp, decode_tp, prefill_rank, decode_rank); upstream returns
`num_heads` twice (src and dst); upstream's layout calls the head slice with the writer
index as `src_tp_rank`. Refused inputs (listed, not compared): TP sizes that are neither a
divisor nor a multiple of the head count or of each other; the model's `HeadReshard`
rejects them (no TP setup upstream builds them).
"""

from __future__ import annotations

import time
from typing import Any

from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging.layout import HeadReshard, compute_head_slice_params, compute_staging_layout

from ..loader import check_signature, load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult

RELPATH = "sglang/srt/disaggregation/common/staging_buffer.py"
HEAD_PARAMS = ("src_attn_tp_size", "dst_attn_tp_size", "src_tp_rank", "dst_tp_rank", "total_kv_heads")
LAYOUT_PARAMS = ("src_attn_tp_size", "dst_attn_tp_size", "dst_tp_rank", "total_kv_heads", "num_tokens",
                 "bytes_per_head_token", "num_layers")
MAX_HEADS, MAX_TP = 128, 16
TOKENS, HEAD_BYTES, LAYERS = 5, 6, 3  # any values: the layout is linear in them


def configurations(max_heads: int = MAX_HEADS, max_tp: int = MAX_TP):
    """(HeadReshard or None if the model refuses it, heads, prefill_tp, decode_tp) over the whole domain."""
    for heads in range(1, max_heads + 1):
        for p in range(1, max_tp + 1):
            for d in range(1, max_tp + 1):
                try:
                    yield HeadReshard(heads, p, d), heads, p, d
                except ConfigError:
                    yield None, heads, p, d


def load(source: EngineSource, name: str) -> Any:
    ns = load_definitions(source.file(RELPATH), [name], where=RELPATH, version=source.label)
    return getattr(ns, name)


def run_head_slice(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    upstream = load(source, "compute_head_slice_params")
    check_signature(upstream, HEAD_PARAMS, f"{RELPATH}:compute_head_slice_params")
    result = TargetResult("compute_head_slice_params", source.version)
    refused = 0
    for cfg, heads, p, d in configurations():
        if cfg is None:
            refused += 1
            continue
        for dr in range(d):
            for pr in cfg.writer_ranks(dr):
                model = compute_head_slice_params(heads, p, d, pr, dr)
                got = upstream(p, d, pr, dr, heads)
                result.compared += 1
                want = (model.src_head_start, model.num_heads, model.dst_head_start, model.num_heads)
                if tuple(got) != want:
                    result.diverge({"heads": heads, "prefill_tp": p, "decode_tp": d, "prefill_rank": pr,
                                    "decode_rank": dr}, list(want), list(got))
    result.note = f"exhaustive: heads <= {MAX_HEADS}, TP <= {MAX_TP}; {refused} configurations refused by the model"
    return result.finish(started)


def run_layout(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    upstream = load(source, "compute_staging_layout")
    check_signature(upstream, LAYOUT_PARAMS, f"{RELPATH}:compute_staging_layout")
    result = TargetResult("compute_staging_layout", source.version)
    for cfg, heads, p, d in configurations():
        if cfg is None:
            continue
        for dr in range(d):
            layout = compute_staging_layout(cfg, dr, TOKENS, LAYERS, HEAD_BYTES)
            model = (len(layout.writer_heads), [layout.writer_size(w) for w in range(len(layout.writer_heads))],
                     layout.total_bytes)
            n, sizes, total = upstream(p, d, dr, heads, TOKENS, HEAD_BYTES, LAYERS)
            result.compared += 1
            if (n, list(sizes), total) != model:
                result.diverge({"heads": heads, "prefill_tp": p, "decode_tp": d, "decode_rank": dr},
                               list(model), [n, list(sizes), total])
    result.note = f"exhaustive: heads <= {MAX_HEADS}, TP <= {MAX_TP}, tokens {TOKENS}, layers {LAYERS}, head bytes {HEAD_BYTES}"
    return result.finish(started)


TARGETS = (
    Target("sglang", "compute_head_slice_params", RELPATH, ("compute_head_slice_params",), "pd-staging",
           "head slice per (prefill rank, decode rank) pairing, exhaustive", run_head_slice),
    Target("sglang", "compute_staging_layout", RELPATH, ("compute_staging_layout", "compute_head_slice_params"),
           "pd-staging", "writers and bytes of one staging slot, exhaustive", run_layout),
)
