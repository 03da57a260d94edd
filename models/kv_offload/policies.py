"""The cache policies of vLLM 0.33.0's CPU offloading manager: LRU and ARC (`cpu/policies/{lru,arc}.py`).

A policy owns the resident chunks (key -> `ChunkStatus`) and decides which idle chunks to evict.
Both are written as small mutable objects (as upstream), with `freeze()` to an immutable, hashable
tuple and `thaw()` back, so the transition system's states stay values.

LRU. Upstream ranks every resident key with a counter (a lazy min-heap over the evictable ones); a
request's keys share one provisional rank ordered by token position when the scheduler recorded
positions. Without positions (the contexts this model and its lockstep use) every rank is a fresh
counter value, so the ranks are exactly the order of their assignment: `order` lists the resident
keys oldest first, and a rank update moves a key to the end, pinned or not (0.33.0; 0.29.0 moved only
evictable keys). Eviction takes the oldest idle keys that are not protected.

ARC. T1 (seen once) and T2 (reused), ghost lists B1 and B2, and the adaptive `target_t1_size`; a
store miss or a touch of a ghost key adapts the target; eviction scans T1 and T2 monotonically,
preferring T1 while its virtual size is at least the target, falling back to the other list, then
trims the ghost lists to the capacity.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .status import ChunkStatus

Frozen = tuple


def order_request_keys(key_groups: Sequence[Sequence[int]]) -> list[int]:
    """One head-to-tail order across the request's KV groups (no recorded positions: group order)."""
    return [key for group in key_groups for key in group]


class CachePolicy:
    name = ""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    def on_store_miss(self, keys: Iterable[int]) -> None:
        return

    def mark_evictable(self, key: int) -> None:
        return

    def mark_non_evictable(self, key: int) -> None:
        return


class LRUCachePolicy(CachePolicy):
    name = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[int, ChunkStatus] = {}  # insertion order is the recency order (oldest first)

    def get(self, key: int) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: int, chunk: ChunkStatus) -> None:
        self.chunks[key] = chunk  # a fresh rank: the newest

    def remove(self, key: int) -> None:
        del self.chunks[key]

    def _update_recency(self, keys: Iterable[int]) -> None:
        for key in keys:
            chunk = self.chunks.pop(key, None)
            if chunk is not None:
                self.chunks[key] = chunk

    def touch(self, keys: Iterable[int]) -> None:
        self._update_recency(reversed(list(keys)))

    def on_request_finished(self, key_groups: Sequence[Sequence[int]], insertion_only_keys: set[int],
                            reused_keys: set[int]) -> None:
        self._update_recency(reversed(order_request_keys(key_groups)))

    def clear(self) -> None:
        self.chunks.clear()

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
        return selected

    def freeze(self) -> Frozen:
        return ("lru", tuple((k, c.ref_cnt, c.chunk_id) for k, c in self.chunks.items()))

    @classmethod
    def thaw(cls, frozen: Frozen, cache_capacity: int) -> "LRUCachePolicy":
        policy = cls(cache_capacity)
        policy.chunks = {k: ChunkStatus(cid, ref) for k, ref, cid in frozen[1]}
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

    def insert(self, key: int, chunk: ChunkStatus) -> None:
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
                            reused_keys: set[int]) -> None:
        for key in reversed(order_request_keys(key_groups)):
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

    def freeze(self) -> Frozen:
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
