"""Byte-level reference of the staging data movement: prefill gather of a head slice, decode scatter into paged KV.

Follows sglang 05c7ebf (PR #30545): the prefill-side gather that packs one
writer's head slice of every layer into the staging buffer, and the decode
`DecodeStagingHandler` scatter that copies a slot into the paged KV pool at
the rows `req_to_token[token_start:token_end]`, as read in the research note
../shared/research/sglang.md, sections 2.2, 2.3 ("Layout of one slot",
"Decode scatter"), 2.5 (item 3) and 2.9 (scenario B). The byte layout is
`models.pd_staging_layout.StagingLayout`, the head slices
`models.pd_staging_layout.HeadSliceParams` and the destination rows
`models.pd_staging_plan.scatter_token_range`; nothing here re-derives them.

A paged KV pool is one array ``[num_layers, 2, num_pages, page_size, heads,
head_dim]`` (axis 1: K then V) of any dtype; `stack_paged_kv` builds it from
per-layer ``(K, V)`` pairs of ``[num_pages, page_size, heads, head_dim]``.
Inside a writer's region the bytes are token-major (page, row in page), then
head, then element, so a region is exactly a C-order copy of
``kv[layer, kv, pages, :, heads]``. Everything is copied as bytes, so NaN
payloads and any dtype survive bit for bit.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kvsim.engine.errors import ConfigError, check_int, require
from .layout import HeadSliceParams, StagingLayout
from .plan import scatter_token_range
from .variants import FIXED, StagingVariant


def stack_paged_kv(layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``[(K, V) per layer]``, each ``[num_pages, page_size, heads, head_dim]``, as one stacked pool."""
    require(len(layers) >= 1, "layers", "at least one (K, V) pair", len(layers))
    shapes = {(np.shape(a), np.asarray(a).dtype.str) for pair in layers for a in pair}
    require(len(shapes) == 1 and len(next(iter(shapes))[0]) == 4, "layers",
            "K and V of every layer with one [num_pages, page_size, heads, head_dim] shape and dtype", sorted(shapes))
    return np.ascontiguousarray(np.stack([np.stack([k, v]) for k, v in layers]))


def check_paged_kv(kv: np.ndarray, field: str = "kv") -> np.ndarray:
    if not isinstance(kv, np.ndarray) or kv.ndim != 6 or not kv.flags.c_contiguous:
        raise ConfigError(field, "a C-contiguous [num_layers, 2, num_pages, page_size, heads, head_dim] array",
                          getattr(kv, "shape", type(kv).__name__))
    require(kv.shape[1] == 2, field, "axis 1 of size 2 (K, V)", kv.shape)
    return kv


def _check_pages(page_indices: Sequence[int] | np.ndarray, num_pages: int, field: str) -> np.ndarray:
    pages = np.asarray(page_indices, dtype=np.int64).reshape(-1)
    if pages.size and (pages.min() < 0 or pages.max() >= num_pages):
        raise ConfigError(field, f"page ids in [0, {num_pages})", pages.tolist())
    return pages


def _check_launch(kv: np.ndarray, pages: np.ndarray, params: HeadSliceParams, layout: StagingLayout,
                  head_start: int, field: str) -> None:
    """The pool, the pages and the slice must describe exactly the writer's region of `layout`."""
    num_layers, _, _, page_size, heads, head_dim = kv.shape
    require(layout.tokens == len(pages) * page_size, "layout.tokens",
            f"{len(pages)} pages x page_size {page_size} = {len(pages) * page_size}", layout.tokens)
    require(layout.num_layers == num_layers, "layout.num_layers", f"the pool's {num_layers} layers", layout.num_layers)
    require(layout.head_bytes == head_dim * kv.itemsize, "layout.head_bytes",
            f"head_dim {head_dim} x itemsize {kv.itemsize}", layout.head_bytes)
    w = check_int(params.writer_index, "params.writer_index", minimum=0, maximum=len(layout.writer_heads) - 1)
    require(layout.writer_heads[w] == params.num_heads, "params.num_heads",
            f"writer {w}'s {layout.writer_heads[w]} heads in the layout", params.num_heads)
    require(0 <= head_start and head_start + params.num_heads <= heads, field,
            f"a head range inside the pool's {heads} heads", (head_start, head_start + params.num_heads))


def _staging_bytes(staging: np.ndarray | None, size: int) -> np.ndarray:
    if staging is None:
        return np.zeros(size, dtype=np.uint8)
    require(isinstance(staging, np.ndarray) and staging.dtype == np.uint8 and staging.ndim == 1,
            "staging", "a 1-D uint8 array", getattr(staging, "dtype", type(staging).__name__))
    return staging


def _writer_regions(layout: StagingLayout, writer: int, base: int):  # type: ignore[no-untyped-def]
    """(kv, layer, start, end) of the writer's regions, shifted so the writer's first byte is at `base`."""
    shift = base - layout.writer_offsets[writer]
    for kv in (0, 1):
        for layer in range(layout.num_layers):
            start, end = layout.region(writer, kv, layer)
            yield kv, layer, start + shift, end + shift


def gather_head_slice_to_staging(kv: np.ndarray, page_indices: Sequence[int] | np.ndarray, params: HeadSliceParams,
                                 layout: StagingLayout, staging: np.ndarray | None = None,
                                 offset: int | None = None) -> np.ndarray:
    """Prefill side: pack heads `[src_head_start, +num_heads)` of pages `page_indices` of every layer, K then V.

    The writer's bytes go to `staging[offset:offset + writer_size]`; `offset`
    defaults to the writer's place in the slot (`layout.writer_offsets`), and
    0 packs the prefill-local buffer that one RDMA write then ships. Without
    `staging` a zeroed slot of `layout.total_bytes` is made. Returns `staging`.
    A region that does not fit the buffer is a ConfigError, never a silent cut.
    """
    kv = check_paged_kv(kv)
    pages = _check_pages(page_indices, kv.shape[2], "page_indices")
    _check_launch(kv, pages, params, layout, params.src_head_start, "params.src_head_start")
    w = params.writer_index
    staging = _staging_bytes(staging, layout.total_bytes)
    base = layout.writer_offsets[w] if offset is None else check_int(offset, "offset", minimum=0)
    require(base + layout.writer_size(w) <= len(staging), "staging",
            f"at least {base + layout.writer_size(w)} bytes (writer {w} at offset {base})", len(staging))
    heads = slice(params.src_head_start, params.src_head_start + params.num_heads)
    for k, layer, start, end in _writer_regions(layout, w, base):
        block = np.ascontiguousarray(kv[layer, k, pages, :, heads, :])
        staging[start:end] = block.reshape(-1).view(np.uint8)
    return staging


def scatter_staging_to_pages(kv: np.ndarray, staging: np.ndarray, page_indices: Sequence[int] | np.ndarray,
                             params: HeadSliceParams, layout: StagingLayout, offset: int | None = None) -> np.ndarray:
    """Decode side, one writer: copy its region into heads `[dst_head_start, +num_heads)` of pages, in place.

    The writer's first byte is read at `offset` (default: its place in the slot).
    """
    kv = check_paged_kv(kv)
    pages = _check_pages(page_indices, kv.shape[2], "page_indices")
    _check_launch(kv, pages, params, layout, params.dst_head_start, "params.dst_head_start")
    w = params.writer_index
    staging = _staging_bytes(staging, 0)
    base = layout.writer_offsets[w] if offset is None else check_int(offset, "offset", minimum=0)
    require(base + layout.writer_size(w) <= len(staging), "staging",
            f"at least {base + layout.writer_size(w)} bytes (writer {w} at offset {base})", len(staging))
    _, _, _, page_size, _, head_dim = kv.shape
    heads = slice(params.dst_head_start, params.dst_head_start + params.num_heads)
    for k, layer, start, end in _writer_regions(layout, w, base):
        block = staging[start:end].view(kv.dtype).reshape(len(pages), page_size, params.num_heads, head_dim)
        kv[layer, k, pages, :, heads, :] = block
    return kv


def decode_scatter_pages(req_to_token: Sequence[int] | np.ndarray, page_start: int, num_pages: int,
                         decode_prefix_len: int, page_size: int, variant: StagingVariant = FIXED) -> np.ndarray:
    """Destination pages of a scatter: `req_to_token[token_start:token_end][::page_size] // page_size`.

    The rows come from `scatter_token_range` (05c7ebf adds the decode prefix;
    before it the suffix landed on the cached prefix rows).
    """
    rows = np.asarray(req_to_token, dtype=np.int64).reshape(-1)
    start, end = scatter_token_range(page_start, num_pages, decode_prefix_len, page_size, variant)
    require(end <= len(rows), "req_to_token", f"at least {end} rows (scatter rows [{start}, {end}))", len(rows))
    return rows[start:end][::page_size] // page_size


def scatter_staging_to_paged(kv: np.ndarray, staging: np.ndarray, req_to_token: Sequence[int] | np.ndarray,
                             page_start: int, num_pages: int, decode_prefix_len: int,
                             writers: Sequence[HeadSliceParams], layout: StagingLayout,
                             offsets: Sequence[int] | None = None, variant: StagingVariant = FIXED) -> np.ndarray:
    """The decode scatter of one slot once all its writers arrived: every writer's slice to its heads, in place.

    `page_start`/`num_pages` are the arrival's suffix pages; `offsets[w]` (default:
    the layout's own writer offsets) is where writer w's bytes start in `staging`.
    """
    pages = decode_scatter_pages(req_to_token, page_start, num_pages, decode_prefix_len, kv.shape[3], variant)
    require(offsets is None or len(offsets) == len(writers), "offsets", f"{len(writers)} offsets, one per writer",
            offsets)
    for i, params in enumerate(writers):
        scatter_staging_to_pages(kv, staging, pages, params, layout, None if offsets is None else offsets[i])
    return kv
