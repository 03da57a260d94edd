"""vLLM 0.33.0's `CPUOffloadingManager` (`vllm/v1/kv_offload/cpu/manager.py`) over chunk slots.

The chunk pool: `_num_chunks` slots, fresh ids 0, 1, 2, ... handed out up to the high-water mark
`_num_allocated_chunks`, then ids popped from the LIFO `_free_list`. Per slot a `ChunkStatus`
(`ref_cnt == -1` write pending, `>= 0` ready with that many loads in flight), held by the policy.
Per request a `ReqContext` (`context`): the key positions the scheduler records
(`req_context(req).set_offload_key_position(key, end_token)`) and the LRU's request rank.
`_num_evictable_cache_chunks` counts `ref_cnt == 0`, `_num_write_pending_chunks` counts `-1`.

`prepare_store` (with `store_threshold >= 2`, a bounded access tracker admits only keys offered that
often): drop the keys already present, evict only what does not fit, never an input key (#35846,
`variant.protect_input_keys`), and return None when it cannot, changing no slot; insert the new
keys write-pending. `complete_store` readies them (a store event) or, on failure, releases them (a
metadata-only removal event that `take_events` drops for keys a retry re-allocated). Loads pin
ready chunks. Per request the manager records the keys it saw (stored or reused), tells the policy of
each first sight (`on_request_access`: the position-aware LRU ranks them tail-first) and hands them to
the policy, in position order when the context records a position for each, when the request finishes
(`on_request_finished`); `reset_cache` drops everything and
starts a new cache generation. `get_stats` reports the usage gauges and the batch's allocation sizes.

The manager is a small mutable object, as upstream; `freeze()` gives the immutable `ManagerState` the
transition system uses and `thaw()` rebuilds the object from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Sequence

from .context import ReqContext
from .policies import POLICIES, CachePolicy, Frozen, order_request_keys, thaw_policy
from .status import (ChunkStatus, CPUOffloadingMetrics, LookupResult, OffloadingEvent, PrepareStoreOutput)
from .variants import FIXED, OffloadVariant


@dataclass
class RequestCacheAccess:
    """`_RequestCacheAccess`: the keys one request observed (one KV group here), in first-seen order."""

    cache_generation: int
    seen_keys: list[int] = field(default_factory=list)
    inserted_keys: set[int] = field(default_factory=set)
    reused_keys: set[int] = field(default_factory=set)
    store_miss_keys: set[int] = field(default_factory=set)
    finished: bool = False

    def freeze(self) -> tuple:
        return (self.cache_generation, tuple(self.seen_keys), tuple(sorted(self.inserted_keys)),
                tuple(sorted(self.reused_keys)), tuple(sorted(self.store_miss_keys)), self.finished)

    @classmethod
    def thaw(cls, frozen: tuple) -> "RequestCacheAccess":
        gen, seen, inserted, reused, misses, finished = frozen
        return cls(gen, list(seen), set(inserted), set(reused), set(misses), finished)


class ManagerState(NamedTuple):
    """The manager as a value (hashable): what `freeze` keeps and `thaw` needs."""

    num_allocated_chunks: int
    free_list: tuple[int, ...]
    policy: Frozen
    num_evictable_cache_chunks: int
    num_write_pending_chunks: int
    events: tuple[OffloadingEvent, ...]
    counts: tuple[tuple[int, int], ...] | None  # the store-threshold tracker, oldest first
    stores_skipped_in_current_batch: int
    allocation_sizes_in_current_batch: tuple[int, ...]
    cache_generation: int
    # (request id, frozen RequestCacheAccess), by id; once a context records positions: (request id, frozen
    # access or None, frozen ReqContext) for each request with a context (and the policy's ranks in `policy`)
    requests: tuple[tuple, ...]


class CPUOffloadingManager:
    def __init__(self, num_chunks: int, cache_policy: str = "lru", enable_events: bool = True,
                 store_threshold: int = 1, max_tracker_size: int = 64_000,
                 variant: OffloadVariant = FIXED) -> None:
        if cache_policy not in POLICIES:
            raise ValueError(f"cache_policy: expected one of {', '.join(POLICIES)}, got {cache_policy!r}")
        self.variant = variant
        self._num_chunks = num_chunks
        self._num_allocated_chunks = 0
        self._free_list: list[int] = []
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._policy: CachePolicy = POLICIES[cache_policy](num_chunks)
        self._num_evictable_cache_chunks = 0
        self._num_write_pending_chunks = 0
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.stores_skipped_in_current_batch = 0
        self.allocation_sizes_in_current_batch: list[int] = []
        self._cache_generation = 0
        self.counts: dict[int, int] | None = {} if store_threshold >= 2 else None
        self._requests: dict[int, RequestCacheAccess] = {}
        self._contexts: dict[int, ReqContext] = {}

    # -- the value form -------------------------------------------------------------------------
    def freeze(self) -> ManagerState:
        """Without recorded positions the contexts hold nothing the order depends on (a request rank ranks only
        keys with a position): the value is the one the model had before positions."""
        positional = any(c.positional for c in self._contexts.values())
        if positional:
            requests: tuple = tuple(
                (r, a.freeze() if (a := self._requests.get(r)) is not None else None,
                 self._contexts[r].freeze() if r in self._contexts else ReqContext(r).freeze())
                for r in sorted(set(self._requests) | set(self._contexts)))
        else:
            requests = tuple((r, a.freeze()) for r, a in sorted(self._requests.items()))
        return ManagerState(
            self._num_allocated_chunks, tuple(self._free_list), self._policy.freeze(ranked=positional),
            self._num_evictable_cache_chunks, self._num_write_pending_chunks,
            tuple(self.events) if self.events is not None else (),
            tuple(self.counts.items()) if self.counts is not None else None,
            self.stores_skipped_in_current_batch, tuple(self.allocation_sizes_in_current_batch),
            self._cache_generation, requests)

    @classmethod
    def thaw(cls, state: ManagerState, num_chunks: int, store_threshold: int = 1, max_tracker_size: int = 64_000,
             variant: OffloadVariant = FIXED) -> "CPUOffloadingManager":
        m = cls(num_chunks, state.policy[0], True, store_threshold, max_tracker_size, variant)
        m._num_allocated_chunks = state.num_allocated_chunks
        m._free_list = list(state.free_list)
        m._policy = thaw_policy(state.policy, num_chunks)
        m._num_evictable_cache_chunks = state.num_evictable_cache_chunks
        m._num_write_pending_chunks = state.num_write_pending_chunks
        m.events = list(state.events)
        m.counts = dict(state.counts) if state.counts is not None else None
        m.stores_skipped_in_current_batch = state.stores_skipped_in_current_batch
        m.allocation_sizes_in_current_batch = list(state.allocation_sizes_in_current_batch)
        m._cache_generation = state.cache_generation
        m._requests = {entry[0]: RequestCacheAccess.thaw(entry[1]) for entry in state.requests
                       if entry[1] is not None}
        m._contexts = {entry[0]: ReqContext.thaw(entry[0], entry[2]) for entry in state.requests if len(entry) == 3}
        return m

    # -- chunk pool -------------------------------------------------------------------------------
    def _get_num_free_chunks(self) -> int:
        return len(self._free_list) + self._num_chunks - self._num_allocated_chunks

    def _allocate_chunks(self, keys: Sequence[int]) -> list[ChunkStatus]:
        num_fresh = min(len(keys), self._num_chunks - self._num_allocated_chunks)
        num_reused = len(keys) - num_fresh
        if len(self._free_list) < num_reused:
            raise AssertionError("the chunk pool cannot allocate what prepare_store counted as free")
        chunks = []
        for _ in range(num_fresh):
            chunks.append(ChunkStatus(self._num_allocated_chunks))
            self._num_allocated_chunks += 1
        for _ in range(num_reused):
            chunks.append(ChunkStatus(self._free_list.pop()))
        return chunks

    def _free_chunk(self, chunk: ChunkStatus) -> None:
        self._free_list.append(chunk.chunk_id)

    def _record_accesses(self, keys: Sequence[int]) -> None:
        """The store-threshold tracker: count an offer without evicting its own tracked keys."""
        counts = self.counts
        assert counts is not None
        protected = set()
        for key in keys:
            if key in counts:
                counts[key] = counts.pop(key) + 1
                protected.add(key)
        num_unprotected = len(counts) - len(protected)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if num_unprotected == 0:
                    continue
                del counts[next(iter(counts))]
                num_unprotected -= 1
            counts[key] = 1

    def req_context(self, req: int) -> ReqContext:
        """The request's context (the scheduler's `ReqContext`: made at the request's first call)."""
        ctx = self._contexts.get(req)
        if ctx is None:
            ctx = self._contexts[req] = ReqContext(req)
        return ctx

    def _get_request_cache_access(self, req: int) -> RequestCacheAccess:
        state = self._requests.get(req)
        if state is None or state.cache_generation != self._cache_generation:
            state = self._requests[req] = RequestCacheAccess(self._cache_generation)
        return state

    def _record_request_cache_access(self, keys: Iterable[int], req: int, inserted_keys: Iterable[int] = (),
                                     reused_keys: Iterable[int] = ()) -> None:
        state = self._get_request_cache_access(req)
        seen = set(state.seen_keys)
        new_keys = []
        for key in keys:
            if key in seen:
                continue
            if state.finished:
                raise AssertionError("New cache keys observed after request finalization")
            state.seen_keys.append(key)
            seen.add(key)
            new_keys.append(key)
        if new_keys:
            self._policy.on_request_access(new_keys, self.req_context(req))
        state.inserted_keys.update(inserted_keys)
        state.reused_keys.update(k for k in reused_keys if k not in state.inserted_keys)

    # -- the OffloadingManager interface ---------------------------------------------------------
    def on_new_request(self, req: int) -> str:
        """The request's access record starts here (else at its first access: the same record from then on); a
        CPU manager offloads chunk by chunk (upstream's `RequestOffloadingContext()`, policy `chunk_level`)."""
        self._get_request_cache_access(req)
        return "chunk_level"

    def get_load_source(self, key: int) -> str:
        """Where a load of `key` reads from: the CPU tier is host memory (upstream's `CacheHitSource.HOST`)."""
        return "host"

    def lookup(self, key: int) -> LookupResult:
        chunk = self._policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Sequence[int], req: int) -> tuple[int, ...]:
        chunks = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or not chunk.is_ready:
                raise AssertionError(f"prepare_load: chunk {key!r} is not a ready chunk of the cache")
            if chunk.ref_cnt == 0:
                self._policy.mark_non_evictable(key)
                self._num_evictable_cache_chunks -= 1
            chunk.ref_cnt += 1
            chunks.append(chunk)
        self._record_request_cache_access(keys, req, reused_keys=keys)
        return tuple(c.chunk_id for c in chunks)

    def touch(self, keys: Sequence[int]) -> None:
        self._policy.touch(keys)

    def complete_load(self, keys: Sequence[int]) -> None:
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or chunk.ref_cnt <= 0:
                raise AssertionError(f"complete_load: chunk {key!r} has no load in flight")
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._num_evictable_cache_chunks += 1
                self._policy.mark_evictable(key)

    def prepare_store(self, keys: Sequence[int], req: int) -> PrepareStoreOutput | None:
        keys = list(keys)
        if self.counts is not None:
            self._record_accesses(keys)
        keys_to_store: list[int] = []
        ready_existing_keys: list[int] = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None:
                keys_to_store.append(key)
            elif chunk.is_ready:
                ready_existing_keys.append(key)
        if self.counts is not None:
            candidates = len(keys_to_store)
            keys_to_store = [k for k in keys_to_store if self.counts.get(k, 0) >= self.store_threshold]
            self.stores_skipped_in_current_batch += candidates - len(keys_to_store)

        state = self._get_request_cache_access(req)
        new_store_misses = [k for k in keys_to_store if k not in state.store_miss_keys]
        if new_store_misses:
            self._policy.on_store_miss(new_store_misses)  # ARC learns from B1/B2 before insert
            state.store_miss_keys.update(new_store_misses)
        recorded = set(keys_to_store) | set(ready_existing_keys)
        self._record_request_cache_access([k for k in keys if k in recorded], req, reused_keys=ready_existing_keys)

        if not keys_to_store:
            return PrepareStoreOutput((), (), ())
        self.allocation_sizes_in_current_batch.append(len(keys_to_store))  # before the None returns, as upstream
        num_chunks_to_evict = len(keys_to_store) - self._get_num_free_chunks()
        to_evict: list[int] = []
        if num_chunks_to_evict > 0:
            if num_chunks_to_evict > self._num_evictable_cache_chunks:
                return None
            protected = set(keys) if self.variant.protect_input_keys else set()  # #35846
            evicted = self._policy.evict(num_chunks_to_evict, protected)
            if evicted is None:
                return None
            self._num_evictable_cache_chunks -= len(evicted)
            for key, chunk in evicted:
                self._free_chunk(chunk)
                to_evict.append(key)
        if to_evict and self.events is not None:
            self.events.append(OffloadingEvent(tuple(to_evict), removed=True))
        chunks = self._allocate_chunks(keys_to_store)
        req_context = self.req_context(req)
        for key, chunk in zip(keys_to_store, chunks):
            self._policy.insert(key, chunk, req_context)
        self._num_write_pending_chunks += len(keys_to_store)
        state.inserted_keys.update(keys_to_store)
        return PrepareStoreOutput(tuple(keys_to_store), tuple(c.chunk_id for c in chunks), tuple(to_evict))

    def complete_store(self, keys: Sequence[int], success: bool = True) -> None:
        stored_keys: list[int] = []
        removed_keys: list[int] = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or chunk.is_ready:
                continue  # not this store's (already ready, or gone)
            self._num_write_pending_chunks -= 1
            if success:
                chunk.ref_cnt = 0
                self._num_evictable_cache_chunks += 1
                self._policy.mark_evictable(key)
                stored_keys.append(key)
            else:
                self._policy.remove(key)
                self._free_chunk(chunk)
                removed_keys.append(key)
        if removed_keys and self.events is not None:
            self.events.append(OffloadingEvent(tuple(removed_keys), removed=True, metadata_only=True))
        if stored_keys and self.events is not None:
            self.events.append(OffloadingEvent(tuple(stored_keys), removed=False))

    def on_request_finished(self, req: int) -> None:
        state = self._requests.get(req)
        if state is None or state.cache_generation != self._cache_generation or state.finished:
            return
        state.finished = True
        req_context = self.req_context(req)
        keys = order_request_keys((state.seen_keys,), req_context)  # one KV group: by position if each has one
        self._policy.on_request_finished((tuple(keys),), state.inserted_keys - state.reused_keys,
                                         set(state.reused_keys), req_context)

    def reset_cache(self) -> None:
        self._policy.clear()
        self._cache_generation += 1
        self._num_evictable_cache_chunks = 0
        self._num_write_pending_chunks = 0
        self._free_list.clear()
        self._num_allocated_chunks = 0

    def take_events(self) -> tuple[OffloadingEvent, ...]:
        if self.events is None:
            return ()
        events, self.events = self.events, []
        out = []
        for event in events:
            if event.metadata_only:  # a retry may own the key again by now
                keys = tuple(k for k in event.keys if self._policy.get(k) is None)
                if not keys:
                    continue
                event = event._replace(keys=keys)
            out.append(event)
        return tuple(out)

    def get_stats(self) -> dict[str, Any]:
        """The metrics one `get_stats` call reports: gauges, the batch's histogram observations, counters."""
        num_used = self._num_allocated_chunks - len(self._free_list) - self._num_evictable_cache_chunks
        usage = num_used / self._num_chunks if self._num_chunks > 0 else 0.0
        write_usage = self._num_write_pending_chunks / self._num_chunks if self._num_chunks > 0 else 0.0
        stats: dict[str, Any] = {
            "gauges": {CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC: usage,
                       CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC: write_usage,
                       CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC: max(usage - write_usage, 0.0)},
            "histograms": {CPUOffloadingMetrics.CPU_ALLOCATION_SIZE: tuple(self.allocation_sizes_in_current_batch)},
            "counters": {},
        }
        self.allocation_sizes_in_current_batch.clear()
        if self.store_threshold >= 2:
            stats["counters"][CPUOffloadingMetrics.STORES_SKIPPED] = self.stores_skipped_in_current_batch
            self.stores_skipped_in_current_batch = 0
        return stats

    def forget_request(self, req: int) -> None:
        """Drop a request's access record (its context is gone: the scheduler makes no more calls for it)."""
        self._requests.pop(req, None)
        self._contexts.pop(req, None)

    # -- read-only views (properties, invariants, adapters) ---------------------------------------
    def resident(self) -> dict[int, ChunkStatus]:
        return self._policy.resident()
