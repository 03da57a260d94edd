"""The block pool of a kv-cache-manager state, for the picture `kvsim report` draws at a counterexample's failing step.

The optional picture hook of a model (docs/architecture.md): `blocks(system, state)` returns plain data: every
block of the pool (`BlockPool.blocks`) by id with its ref_cnt, whether the cached map (`cached_block_hash_to_block`)
holds it and which requests' block tables do, and the free queue (`free_block_queue`) front (evicted first) to back.
"""

from __future__ import annotations

from typing import Any


def blocks(system: Any, state: Any) -> dict[str, Any] | None:
    """{"blocks": [{id, kind, ref, cached, requests}], "free_queue": [ids]}; kind: null, held, cached (free, still
    in the cached map) or free. None for a state without a manager."""
    manager = getattr(state, "manager", None)
    if manager is None:
        return None
    pool = manager.pool
    cached = {b for _, ids in pool.cached for b in ids}
    holders: dict[int, list[int]] = {}
    count = len(state.requests)
    for i, entry in enumerate(manager.tables):
        if entry is not None:
            for b in entry[0]:
                holders.setdefault(b, []).append(i % count if count else i)
    cells = []
    for b, ref in enumerate(pool.refs):
        kind = "null" if b == 0 else "held" if ref > 0 else "cached" if b in cached else "free"
        cells.append({"id": b, "kind": kind, "ref": ref, "cached": b in cached,
                      "requests": sorted(set(holders.get(b, ()))) if b else []})
    return {"blocks": cells, "free_queue": list(pool.free)}
