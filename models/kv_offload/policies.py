"""The cache policies of vLLM 0.33.0's CPU offloading manager: LRU and ARC (`cpu/policies/{lru,arc}.py`).

A policy owns the resident chunks (key -> `ChunkStatus`) and decides which idle chunks to evict.
Both are written as small mutable objects (as upstream), with `freeze()` to an immutable, hashable
tuple and `thaw()` back, so the transition system's states stay values.

LRU. Upstream ranks every resident key (`_ranks`, a lazy min-heap over the evictable ones); eviction
takes the idle keys that are not protected in rank order. A rank is `(counter, 0)` for a fresh counter
value (a store of a key without a recorded position, a touch, a finished request's keys), or, for a key
whose request context records its position, `(request_rank, -position)`: one rank per request (taken from
the counter at the request's first access in a cache generation, `_get_request_rank`) shared by all its
keys, ordered tail-first (a later position ranks lower: evicted earlier). `on_request_access` (a request's
first access of keys) raises a resident key's rank to its request's `(request_rank, -position)` when the
key's rank is below it (a key ranked later is left where it is). `chunks` holds the resident keys in rank order (oldest first). Without
positions every rank is a fresh counter value, so the order is exactly the order of assignment: a rank
update moves a key to the end, pinned or not (0.33.0; 0.29.0 moved only evictable keys). Positions are
distinct within one request (one KV group, as here), so no two keys share a rank.

ARC. T1 (seen once) and T2 (reused), ghost lists B1 and B2, and the adaptive `target_t1_size`; a
store miss or a touch of a ghost key adapts the target; eviction scans T1 and T2 monotonically,
preferring T1 while its virtual size is at least the target, falling back to the other list, then
trims the ghost lists to the capacity. A finished request's keys are applied tail to head in position
order when its context records a position for every one of them (`order_request_keys`), else in the
order the request first saw them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .context import ReqContext, RequestRank
from .status import ChunkStatus

Frozen = tuple


def order_request_keys(key_groups: Sequence[Sequence[int]], req_context: ReqContext) -> list[int]:
    """One head-to-tail order across the request's KV groups: by recorded position when every key has one,
    else group order."""
    keys = [key for group in key_groups for key in group]
    positions = {key: position for key in keys
                 if (position := req_context.get_offload_key_position(key)) is not None}
    if len(positions) == len(keys):
        keys.sort(key=positions.__getitem__)
    return keys


class CachePolicy:
    name = ""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    def on_store_miss(self, keys: Iterable[int]) -> None:
        return

    def on_request_access(self, keys: Iterable[int], req_context: ReqContext) -> None:
        """A request's first access of keys (not resident yet, maybe): only a position-aware policy acts."""
        return

    def mark_evictable(self, key: int) -> None:
        return

    def mark_non_evictable(self, key: int) -> None:
        return


class LRUCachePolicy(CachePolicy):
    name = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[int, ChunkStatus] = {}  # in rank order (oldest first)
        self._ranks: dict[int, tuple[int, int]] = {}
        self._next_rank = 0
        self._cache_generation = 0

    def _get_request_rank(self, req_context: ReqContext) -> int:
        state = req_context.request_rank
        if state is None or state.cache_generation != self._cache_generation:
            self._next_rank += 1
            state = req_context.request_rank = RequestRank(self._cache_generation, self._next_rank)
        return state.rank

    def _assign_new_rank(self, key: int) -> None:
        self._next_rank += 1
        self._ranks[key] = (self._next_rank, 0)
        self.chunks[key] = self.chunks.pop(key)  # the highest rank: the end

    def _reorder(self) -> None:
        self.chunks = {k: self.chunks[k] for k in sorted(self.chunks, key=self._ranks.__getitem__)}

    def get(self, key: int) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: int, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.chunks[key] = chunk
        position = req_context.get_offload_key_position(key)
        if position is None:
            self._next_rank += 1
            self._ranks[key] = (self._next_rank, 0)  # a fresh rank: the newest
        else:
            self._ranks[key] = (self._get_request_rank(req_context), -position)
            self._reorder()

    def remove(self, key: int) -> None:
        del self.chunks[key]
        del self._ranks[key]

    def _update_recency(self, keys: Iterable[int]) -> None:
        for key in keys:
            if key in self.chunks:
                self._assign_new_rank(key)

    def touch(self, keys: Iterable[int]) -> None:
        self._update_recency(reversed(list(keys)))

    def on_request_access(self, keys: Iterable[int], req_context: ReqContext) -> None:
        request_rank = self._get_request_rank(req_context)
        updated = False
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is None or key not in self.chunks:
                continue
            rank = (request_rank, -position)
            if self._ranks[key] >= rank:
                continue
            self._ranks[key] = rank
            updated = True
        if updated:
            self._reorder()

    def on_request_finished(self, key_groups: Sequence[Sequence[int]], insertion_only_keys: set[int],
                            reused_keys: set[int], req_context: ReqContext) -> None:
        self._update_recency(reversed(order_request_keys(key_groups, req_context)))

    def clear(self) -> None:
        self.chunks.clear()
        self._ranks.clear()
        self._next_rank = 0
        self._cache_generation += 1

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, ChunkStatus]] | None:
        if n == 0:
            return []
        selected = []
        for key, chunk in self.chunks.items():
            if chunk.ref_cnt == 0 and key not in protected:
                selected.append((key, chunk))
                if len(selected) == n:
                    break
        if len(selected) < n:
            return None
        for key, _ in selected:
            del self.chunks[key]
            del self._ranks[key]
        return selected

    def freeze(self, ranked: bool = False) -> Frozen:
        """The keys in rank order; `ranked`: with the ranks themselves, the counter and the cache generation
        (needed once a request context records positions: without them the order is all the ranks say)."""
        chunks = tuple((k, c.ref_cnt, c.chunk_id) for k, c in self.chunks.items())
        if not ranked:
            return ("lru", chunks)
        return ("lru", chunks, tuple(self._ranks[k] for k in self.chunks), self._next_rank, self._cache_generation)

    @classmethod
    def thaw(cls, frozen: Frozen, cache_capacity: int) -> "LRUCachePolicy":
        policy = cls(cache_capacity)
        policy.chunks = {k: ChunkStatus(cid, ref) for k, ref, cid in frozen[1]}
        if len(frozen) == 2:
            policy._ranks = {k: (i + 1, 0) for i, k in enumerate(policy.chunks)}
            policy._next_rank = len(policy.chunks)
        else:
            policy._ranks = dict(zip(policy.chunks, frozen[2]))
            policy._next_rank, policy._cache_generation = frozen[3], frozen[4]
        return policy

    def resident(self) -> dict[int, ChunkStatus]:
        return self.chunks


class ARCCachePolicy(CachePolicy):
    name = "arc"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.target_t1_size: float = 0.0
        self.t1: dict[int, ChunkStatus] = {}
        self.t2: dict[int, ChunkStatus] = {}
        self.b1: dict[int, None] = {}
        self.b2: dict[int, None] = {}

    def get(self, key: int) -> ChunkStatus | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: int, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: int) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    @staticmethod
    def _move_to_end(d: dict, key: int) -> None:
        d[key] = d.pop(key)

    def _adapt_to_ghost_hit(self, key: int) -> bool:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self._move_to_end(self.b1, key)
            return True
        if key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self._move_to_end(self.b2, key)
            return True
        return False

    def on_store_miss(self, keys: Iterable[int]) -> None:
        for key in reversed(list(keys)):
            self._adapt_to_ghost_hit(key)

    def touch(self, keys: Iterable[int]) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                if not chunk.is_ready:  # a pending store is not a second access: stays in T1, most recent
                    self.t1[key] = chunk
                else:
                    self.t2[key] = chunk
            elif key in self.t2:
                self._move_to_end(self.t2, key)
            else:
                self._adapt_to_ghost_hit(key)

    def on_request_finished(self, key_groups: Sequence[Sequence[int]], insertion_only_keys: set[int],
                            reused_keys: set[int], req_context: ReqContext) -> None:
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only_keys:  # a store is not a frequency hit: recency only
                if key in self.t1:
                    self._move_to_end(self.t1, key)
                elif key in self.t2:
                    self._move_to_end(self.t2, key)
                continue
            if key in reused_keys and key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in reused_keys and key in self.t2:
                self._move_to_end(self.t2, key)

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, ChunkStatus]] | None:
        if n == 0:
            return []
        t1, t2 = list(self.t1.items()), list(self.t2.items())
        pos = [0, 0]  # monotonic scan positions in T1 and T2

        def next_candidate(which: int) -> tuple[int, ChunkStatus] | None:
            entries = t1 if which == 0 else t2
            while pos[which] < len(entries):
                key, chunk = entries[pos[which]]
                pos[which] += 1
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        candidates: list[tuple[int, ChunkStatus, bool]] = []
        virtual_t1_size = len(self.t1)
        for _ in range(n):
            candidate = None
            if virtual_t1_size >= int(self.target_t1_size):
                entry = next_candidate(0)
                if entry is not None:
                    candidate = (*entry, True)
                    virtual_t1_size -= 1
            if candidate is None:
                entry = next_candidate(1)
                if entry is not None:
                    candidate = (*entry, False)
            if candidate is None:
                entry = next_candidate(0)
                if entry is None:
                    return None
                candidate = (*entry, True)
                virtual_t1_size -= 1
            candidates.append(candidate)
        result = []
        for key, chunk, from_t1 in candidates:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            result.append((key, chunk))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                del ghost[next(iter(ghost))]
        return result

    def freeze(self, ranked: bool = False) -> Frozen:
        return ("arc", tuple((k, c.ref_cnt, c.chunk_id) for k, c in self.t1.items()),
                tuple((k, c.ref_cnt, c.chunk_id) for k, c in self.t2.items()), tuple(self.b1), tuple(self.b2),
                self.target_t1_size)

    @classmethod
    def thaw(cls, frozen: Frozen, cache_capacity: int) -> "ARCCachePolicy":
        policy = cls(cache_capacity)
        _, t1, t2, b1, b2, target = frozen
        policy.t1 = {k: ChunkStatus(cid, ref) for k, ref, cid in t1}
        policy.t2 = {k: ChunkStatus(cid, ref) for k, ref, cid in t2}
        policy.b1 = dict.fromkeys(b1)
        policy.b2 = dict.fromkeys(b2)
        policy.target_t1_size = target
        return policy

    def resident(self) -> dict[int, ChunkStatus]:
        return {**self.t1, **self.t2}


POLICIES = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


def thaw_policy(frozen: Frozen, cache_capacity: int) -> CachePolicy:
    return POLICIES[frozen[0]].thaw(frozen, cache_capacity)
