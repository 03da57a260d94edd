"""kv-cache-manager's symmetry: block ids are names. Nothing the manager does reads a block id's value: the free
queue hands out blocks by position, the cached map keeps its blocks in the order they were cached, and a
request's table in the order it got them. So renaming the non-null blocks (the null block stays 0) maps
reachable states to reachable states, step for step, with every verdict kept (the actions name requests, never
blocks). The canonical form names the blocks in the order they first appear: the requests' tables in request
order, then the free queue front to back (every block is in one of them while the invariants hold), then the
cached map's blocks, then any other block by its ref_cnt and hash: nothing in the order reads an id, so a
state and every renaming of it get one representative.
"""

from __future__ import annotations

from typing import Mapping

from .block_pool import PoolState
from .kv_cache_manager import ManagerState

FLAG_MESSAGE = "(a representative's flag: the message is the real state's)"


def relabel(s, perm: Mapping[int, int]):
    """`s` (a `CacheState`) with every block id b renamed perm[b] (perm fixes 0, the null block)."""
    pool, tables = s.manager.pool, s.manager.tables
    refs, hashes = list(pool.refs), list(pool.hashes)
    for old, new in perm.items():
        refs[new], hashes[new] = pool.refs[old], pool.hashes[old]
    new_pool = PoolState(tuple(refs), tuple(hashes), tuple(perm[b] for b in pool.free),
                         tuple((key, tuple(perm[b] for b in ids)) for key, ids in pool.cached))
    new_tables = tuple(None if t is None else (tuple(perm[b] for b in t[0]), t[1]) for t in tables)
    return s._replace(manager=ManagerState(new_pool, new_tables))


def first_appearance(s) -> dict[int, int]:
    """The renaming that numbers the blocks 1, 2, ... in the order the tables, then the free queue, show them."""
    order: dict[int, None] = {}
    for t in s.manager.tables:
        if t is not None:
            order.update(dict.fromkeys(b for b in t[0] if b))
    pool = s.manager.pool
    order.update(dict.fromkeys(pool.free))
    order.update(dict.fromkeys(b for _, ids in pool.cached for b in ids))
    # a block in none of them (a leak): by what it carries; blocks alike in that are interchangeable
    order.update(dict.fromkeys(sorted(range(1, len(pool.refs)), key=lambda b: (pool.refs[b], repr(pool.hashes[b])))))
    order.pop(0, None)
    return {0: 0, **{old: new for new, old in enumerate(order, start=1)}}


def canonical(s):
    """The representative of `s`'s orbit. A flag's message may name blocks, so the representative keeps only
    the flag's name (the explorer computes a reported violation's message again on the real state)."""
    perm = first_appearance(s)
    if s.flags:
        s = s._replace(flags=tuple((name, FLAG_MESSAGE) for name, _ in s.flags))
    return s if all(old == new for old, new in perm.items()) else relabel(s, perm)
