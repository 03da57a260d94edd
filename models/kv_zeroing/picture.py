"""What a kv-zeroing counterexample looks like in memory (`kvsim report` draws it as an inline SVG picture).

The optional picture hook of a model (docs/architecture.md): `memory(case, variant)` takes the shrunk case in its
JSON form (`geometry`, `block_ids`) and returns one bar per backing allocation, as plain data: which view owns each
byte (or none: padding), the bytes of the blocks asked for, the bytes the planned kernel writes (`write_spans`, the
reference memset's), and the first byte it writes outside the blocks asked for. Ownership comes from
`owned_bytes`'s element enumeration, never from the planner's page formula.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvsim.engine.errors import ConfigError

from .geometry import Arena, KVCacheGeometry, owned_bytes, owner_of, view_start
from .variants import ZeroingVariant
from .zeroer import plan_segments, span_mask, write_spans


def _runs(values: np.ndarray) -> list[tuple[int, int, int]]:
    """(start, end, value) of each run of equal values."""
    if not len(values):
        return []
    cuts = np.flatnonzero(np.diff(values)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(values)]))
    return [(int(s), int(e), int(values[s])) for s, e in zip(starts, ends)]


def _spans(mask: np.ndarray) -> list[tuple[int, int]]:
    return [(s, e) for s, e, v in _runs(mask.astype(np.int8)) if v]


def memory(case: Mapping[str, Any], variant: ZeroingVariant) -> list[dict[str, Any]]:
    """One bar per allocation: `label`, `size`, `shown` (bytes drawn: the allocation and what the kernel writes
    past its end), `owners` [(start, end, layer or None for padding)], `asked` and `touched` [(start, end)], and
    `first_outside` (offset, who owns it) or None. Empty where the planner rejects the geometry."""
    geometry = KVCacheGeometry.from_jsonable(case["geometry"])
    block_ids = tuple(case["block_ids"])
    arena = Arena.for_geometry(geometry)
    try:
        table = plan_segments(geometry, variant, arena=arena)
    except ConfigError:
        return []
    touched = span_mask(arena.size, write_spans(table, block_ids))
    asked = owned_bytes(geometry, arena, block_ids)
    owner = np.full(arena.size, -1, dtype=np.int64)
    for i, view in enumerate(geometry.views):
        start = view_start(arena, view)
        offsets = view.block_byte_offsets()
        for k in range(view.shape[view.block_dim]):
            owner[start + k * view.block_stride_bytes + offsets] = i
    bars = []
    for index, (base, size) in enumerate(zip(arena.bases, arena.sizes)):
        limit = arena.bases[index + 1] if index + 1 < len(arena.bases) else arena.size
        past = np.flatnonzero(touched[base + size:limit])
        shown = size + (int(past[-1]) + 1 if len(past) else 0)
        window = slice(base, base + shown)
        foreign = np.flatnonzero(touched[window] & ~asked[window])
        first = None
        if len(foreign):
            first = (int(foreign[0]), str(owner_of(geometry, arena, base + int(foreign[0]))))
        bars.append({"label": f"allocation {index}", "size": size, "shown": shown,
                     "owners": [(s, e, None if v < 0 else geometry.views[v].layer)
                                for s, e, v in _runs(owner[base:base + size])],
                     "asked": _spans(asked[window]), "touched": _spans(touched[window]), "first_outside": first})
    return bars
