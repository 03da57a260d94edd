"""The block pool's invariants as checks returning None when they hold, else a message.

State checks read the value forms (`PoolState`, the manager's request tables); the step checks read what one
call returned (`hit_is_proper_prefix`) or the events one step published (`announce`, against the consumer's
view of the cache that the events so far describe).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

from .block_pool import PoolState
from .kv_cache_utils import BlockHash, by_chain
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored

Tables = Sequence["tuple[tuple[int, ...], int] | None"]


def holders(tables: Tables) -> Counter:
    """block id -> how many request tables hold it (the null block, a placeholder, not counted)."""
    return Counter(b for t in tables if t is not None for b in t[0] if b)


def ref_count_is_holders(pool: PoolState, tables: Tables) -> str | None:
    """Every block's ref_cnt is the number of request tables holding it (the null block's count stays 0; a
    sliding-window or Mamba table holds it in place of the blocks it freed)."""
    if pool.refs[0]:
        return f"null block: expected ref_cnt 0, got {pool.refs[0]}"
    held = holders(tables)
    for b, ref in enumerate(pool.refs):
        if b and ref != held[b]:
            return f"block {b}: expected ref_cnt {held[b]} (requests holding it), got {ref}"
    return None


def free_queue_iff_unreferenced(pool: PoolState) -> str | None:
    """A block is in the free queue exactly when its ref_cnt is 0; the null block never; no block twice."""
    free = pool.free
    if len(set(free)) != len(free):
        return f"free queue: expected no block twice, got {list(free)}"
    if 0 in free:
        return f"free queue: expected never the null block, got {list(free)}"
    expected = {b for b, ref in enumerate(pool.refs) if b and ref == 0}
    if set(free) != expected:
        return f"free queue: expected exactly the blocks with ref_cnt 0 {sorted(expected)}, got {sorted(free)}"
    return None


def pool_accounting(pool: PoolState) -> str | None:
    """free + held + the null block = the pool size."""
    held = sum(1 for b, ref in enumerate(pool.refs) if b and ref > 0)
    if len(pool.free) + held + 1 != len(pool.refs):
        return f"free ({len(pool.free)}) + held ({held}) + null (1): expected the pool size {len(pool.refs)}"
    return None


def cached_map_hashes(pool: PoolState) -> str | None:
    """Every cached-map entry points at blocks carrying its hash, and every block with a hash is in the map
    under it (the null block never)."""
    listed = Counter()
    for key, ids in pool.cached:
        if not ids:
            return f"cached map: expected no empty entry, got {key!r}"
        for b in ids:
            if pool.hashes[b] != key:
                return f"cached map: {key!r} points at block {b}, whose hash is {pool.hashes[b]!r}"
            listed[b] += 1
    for b, h in enumerate(pool.hashes):
        if h is not None and listed[b] != 1:
            return f"block {b} has hash {h!r}: expected in the cached map once under it, got {listed[b]} times"
    if pool.hashes[0] is not None:
        return f"null block: expected no hash, got {pool.hashes[0]!r}"
    return None


def free_queue_order(pool: PoolState) -> str | None:
    """The eviction order: every uncached free block comes before every cached one (a freed request's uncached
    blocks go to the front, its cached ones to the back, so the cache is evicted last, LRU first). An invariant
    of the operations this slice models; upstream's connector-facing `evict_blocks` (a hash dropped from a free
    block in place) and `unpin_blocks` (uncached blocks appended) break it, and it is to be revisited with them."""
    cached = [pool.hashes[b] is not None for b in pool.free]
    if not all(cached[cached.index(True):] if True in cached else ()):  # a cached block before an uncached one
        return f"free queue {list(pool.free)}: expected the uncached blocks before the cached ones, got " \
               f"cached flags {cached}"
    return None


def freed_in_eviction_order(queue_before: Sequence[int], table: Sequence[int], after: PoolState) -> str | None:
    """`free` of a request whose table was `table`: the blocks it released (ref_cnt now 0), tail first, the
    uncached ones before the queue as it was and the cached ones after it (upstream's `free_blocks` over the
    reversed table: prepend_n the uncached, append_n the cached). The cached tail of the queue is then least
    recently freed first (LRU), a request's tail block before its parents."""
    released = [b for b in reversed(table) if b and after.refs[b] == 0]
    expected = [b for b in released if after.hashes[b] is None] + list(queue_before) + \
        [b for b in released if after.hashes[b] is not None]
    if list(after.free) != expected:
        return f"free of table {list(table)} on queue {list(queue_before)}: expected queue {expected}, " \
               f"got {list(after.free)}"
    return None


def freed_groups_in_eviction_order(queue_before: Sequence[int], tables: Sequence[Sequence[int]],
                                   after: PoolState) -> str | None:
    """`free` of a request over several groups, group by group, each as `freed_in_eviction_order` says: the
    uncached blocks a later group releases go before an earlier group's, its cached ones after them."""
    front: list[int] = []
    back: list[int] = []
    for table in tables:
        released = [b for b in reversed(table) if b and after.refs[b] == 0]
        front[:0] = [b for b in released if after.hashes[b] is None]
        back += [b for b in released if after.hashes[b] is not None]
    expected = front + list(queue_before) + back
    if list(after.free) != expected:
        return f"free of tables {[list(t) for t in tables]} on queue {list(queue_before)}: expected queue " \
               f"{expected}, got {list(after.free)}"
    return None


def needed_blocks(kind: str, n: int, block_size: int, sliding_window: int, attention_chunk_size: int = 0) -> range:
    """The positions of a group's blocks that a hit of `n` blocks reads: full attention every block, a sliding
    window the `cdiv(sliding_window - 1, block_size)` blocks before the hit's end, chunked local attention the
    blocks of the chunk the hit's end falls in (its chunk size a multiple of the block size), Mamba the block it
    ends on."""
    if kind == "full":
        return range(0, n)
    if kind == "swa":
        return range(max(0, n - -(-(sliding_window - 1) // block_size)), n)
    if kind == "local":
        return range(n * block_size // attention_chunk_size * attention_chunk_size // block_size, n)
    if kind == "mamba":
        return range(n - 1, n) if n else range(0)
    return range(0)


def hit_backed(kinds: Sequence[str], hit: Sequence[Sequence[BlockHash | None]], keys: Sequence[Sequence[tuple]],
               num_hit_tokens: int, block_size: int, sliding_window: int, what: str, attention_chunk_size: int = 0) \
        -> str | None:
    """A hit of `num_hit_tokens` is one every group in `kinds` backs with its own cached blocks: full attention
    every block before it, a sliding window the `cdiv(sliding_window - 1, block_size)` blocks before it, chunked
    local attention those of its last chunk, Mamba the block it ends on (its state); each cached under the
    request's hash of that block for that group (`keys`).
    `hit[g]` is the hashes of group g's hit blocks (None: the null block)."""
    if num_hit_tokens % block_size:
        return f"{what} of {num_hit_tokens} tokens: expected a multiple of the block size {block_size}"
    n = num_hit_tokens // block_size
    for g, kind in enumerate(kinds):
        for i in needed_blocks(kind, n, block_size, sliding_window, attention_chunk_size):
            got = hit[g][i] if i < len(hit[g]) else "no block"
            if got != keys[g][i]:
                return f"{what} of {num_hit_tokens} tokens: group {g} ({kind}) needs block {i} cached under the " \
                       f"request's hash {keys[g][i]!r}, got {got!r} ({len(hit[g])} blocks handed)"
    return None


def hit_state_identity(kinds: Sequence[str], hit: Sequence[Sequence[int]], written: Mapping[int, tuple],
                       tokens: Sequence[int], num_hit_tokens: int, block_size: int, sliding_window: int,
                       what: str, attention_chunk_size: int = 0) -> str | None:
    """The block a hit reuses holds the state for exactly that prefix: every block a group reads for a hit of
    `num_hit_tokens` (`needed_blocks`), at position i, was last written by a group of its kind for the request's
    first `(i + 1) * block_size` tokens, no more and no fewer (`written`: block id -> the kind and the tokens whose
    KV or Mamba state the model runner wrote into it, `model_runner.step_writes`). `hit_backed` says the block
    carries the right hash; this says its contents are what the hash promises, which the hash alone cannot (a
    block rewritten in place, or reused after eviction, under a hash that stayed)."""
    n = num_hit_tokens // block_size
    for g, kind in enumerate(kinds):
        for i in needed_blocks(kind, n, block_size, sliding_window, attention_chunk_size):
            block = hit[g][i] if i < len(hit[g]) else None
            expected = tuple(tokens[:(i + 1) * block_size])
            got = written.get(block) if block else None
            if got != (kind, expected):
                shown = "nothing written" if got is None else f"{got[0]} state of {len(got[1])} tokens {list(got[1])}"
                return f"{what} of {num_hit_tokens} tokens: group {g} ({kind}) block {i} (id {block}) must hold the " \
                       f"state of the prefix {list(expected)}, holds {shown}"
    return None


CONNECTOR_HIT = "the local hit handed to the connector"


def connector_hit_backed(kinds: Sequence[str], hit: Sequence[Sequence[BlockHash | None]],
                         keys: Sequence[Sequence[tuple]], num_local_tokens: int, block_size: int,
                         sliding_window: int, attention_chunk_size: int = 0) -> str | None:
    """`hit_backed` on the local computed tokens handed to a KV connector (its `get_num_new_matched_tokens`): the
    full-attention group must back them; a lagging group is upstream's `hit_diverged`, left to the connector (which
    sends a Mamba state) or reconciled by the scheduler when it loads nothing."""
    return hit_backed(tuple(k if k == "full" else "" for k in kinds), hit, keys, num_local_tokens, block_size,
                      sliding_window, CONNECTOR_HIT, attention_chunk_size)


def no_block_outside_window(kinds: Sequence[str], tables: Sequence[Sequence[int]], num_computed_tokens: int,
                            block_size: int, sliding_window: int, attention_chunk_size: int = 0) -> str | None:
    """After an allocation, a sliding-window, chunked-local (or Mamba) group holds no block wholly before the tokens
    attention still reads (the window; the current chunk): those blocks are the null block (0)."""
    for g, (kind, ids) in enumerate(zip(kinds, tables)):
        if kind == "swa":
            skipped = max(0, num_computed_tokens - sliding_window + 1)
        elif kind == "local":
            skipped = num_computed_tokens // attention_chunk_size * attention_chunk_size
        elif kind == "mamba":
            skipped = max(0, num_computed_tokens - 1)
        else:
            continue
        outside = [b for b in ids[:skipped // block_size] if b]
        if outside:
            return f"group {g} ({kind}), {num_computed_tokens} tokens computed: expected the null block for the " \
                   f"{skipped // block_size} blocks before the window, got blocks {list(ids[:skipped // block_size])}"
    return None


def lookahead_never_cached(table: Sequence[int], num_cached: int, num_computed_tokens: int, block_size: int,
                           hashes: Sequence[BlockHash | None]) -> str | None:
    """A running request's blocks past the full blocks of its computed tokens (its last partial block, and the
    slots allocated for lookahead tokens) hold no hash, and its cached count stops at those full blocks: a
    speculative slot's KV is never cached."""
    num_full = num_computed_tokens // block_size
    if num_cached > num_full:
        return f"{num_computed_tokens} tokens computed: expected at most {num_full} blocks cached, got {num_cached}"
    for i, b in enumerate(table[num_full:], num_full):
        if b and hashes[b] is not None:
            return f"{num_computed_tokens} tokens computed: block {b} (slot {i}, past the computed full blocks) " \
                   f"is cached under {hashes[b]!r}"
    return None


def all_free_when_done(pool: PoolState, tables: Tables) -> str | None:
    """Once every request has ended no block is held: all but the null block are free."""
    if any(t is not None for t in tables):
        return "every request ended: expected no request table, got " \
               f"{[r for r, t in enumerate(tables) if t is not None]}"
    if len(pool.free) != len(pool.refs) - 1:
        return f"every request ended: expected all {len(pool.refs) - 1} blocks free, got {sorted(pool.free)}"
    return None


def events_mirror_cache(pool: PoolState, announced: Iterable[tuple[BlockHash, int]]) -> str | None:
    """The events so far describe the cache: per hash, the blocks stored and not removed since the last clear
    are the blocks the cached map holds under it."""
    view = dict(announced)
    actual = {key: len(ids) for key, ids in pool.cached}
    if view != actual:
        return f"the events' view of the cache {view!r}: expected the cached map's counts {actual!r}"
    return None


def hit_is_proper_prefix(hashes: Sequence[BlockHash], hit: Sequence[BlockHash | None], num_hit_tokens: int,
                         num_tokens: int, block_size: int) -> str | None:
    """A cache hit is a prefix of the request's hash chain, block aligned, and never the whole prompt."""
    if list(hit) != list(hashes[:len(hit)]):
        return f"hit blocks' hashes {list(hit)!r}: expected a prefix of the request's chain {list(hashes)!r}"
    if num_hit_tokens != len(hit) * block_size:
        return f"hit of {len(hit)} blocks: expected {len(hit) * block_size} tokens, got {num_hit_tokens}"
    if num_hit_tokens >= num_tokens:
        return f"hit of {num_hit_tokens} tokens: expected fewer than the request's {num_tokens} (its last " \
               f"token is computed)"
    return None


def announce(announced: Iterable[tuple[BlockHash, int]], events: Iterable[tuple]) \
        -> tuple[tuple[tuple[BlockHash, int], ...], str | None]:
    """The consumer's view after `events`, and a message for the first `BlockRemoved` of a hash that no
    `BlockStored` since the last clear named (or None). No events leave the view as it was (most steps: no block
    filled, none evicted), in the order this function gives it."""
    if not events:
        return tuple(announced), None
    view = Counter(dict(announced))
    problem = None
    for event in events:
        if type(event) is BlockStored:
            view.update(event.block_hashes)
        elif type(event) is BlockRemoved:
            for key in event.block_hashes:
                if view[key] <= 0 and problem is None:
                    problem = f"BlockRemoved({key!r}): expected a hash a BlockStored named before, got none live"
                view[key] -= 1
        elif type(event) is AllBlocksCleared:
            view.clear()
    return by_chain((k, n) for k, n in view.items() if n), problem
