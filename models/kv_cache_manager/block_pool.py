"""The block pool (vLLM 0.33.0 `vllm/v1/core/block_pool.py`), in kvsim's words, for one KV cache group.

`BlockPool` owns every block, the free-block queue and the cached-block map (block hash -> the blocks cached
under it, first cached first: upstream does not de-duplicate, so two requests that fill the same block at the
same time cache it twice). Block 0 is the null block: taken from the queue at start, never freed, never cached.
A block reused from the free queue loses its cached hash (`BlockRemoved`); a full block a request computed is
cached (`BlockStored`); `reset_prefix_cache` drops every hash, only when no request holds a block
(`AllBlocksCleared`). Events are always on here (upstream: `enable_kv_cache_events`).

Several KV cache groups share one pool (`kv_cache_coordinator`): a group caches its blocks under the block hash
with its group id (upstream's `BlockHashWithGroupId`), here the key `(group_id, hash)` (`key`); a pool of one group
keys by the hash alone, the group id being the same everywhere, so one-group states are as before.

`PoolState` is the value form (`freeze`/`thaw`), what the transition system keeps in its states. A pool keeps the
value it was thawed from or last froze to until a method changes it (every change to the pool, its blocks, its queue
and its map is one of the methods below): a step that changes nothing in the pool (most decodes: a block fills
`block_size` tokens) freezes to the same value in no time, where the columns take O(pool) to build; and the hashes and
the cached map (sorted: the costliest part) are kept until a block is cached, evicted or the cache reset.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable, NamedTuple, Sequence

from .kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock, block_tokens, by_chain
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored


_REF_CNT, _BLOCK_HASH, _BLOCK_ID = attrgetter("ref_cnt"), attrgetter("block_hash"), attrgetter("block_id")  # (in C)


class PoolState(NamedTuple):
    refs: tuple[int, ...]  # ref_cnt of each block, by id (the null block's stays 0)
    hashes: tuple[BlockHash | None, ...]  # block_hash of each block, by id
    free: tuple[int, ...]  # the free queue's block ids, front (evicted first) to back
    cached: tuple[tuple[BlockHash, tuple[int, ...]], ...]  # the cached-block map, sorted by hash


class BlockHashToBlockMap:
    """Block hash -> the blocks cached under it, in the order they were cached."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[BlockHash, list[KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHash) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        return blocks[0] if blocks else None

    def insert(self, key: BlockHash, block: KVCacheBlock) -> None:
        self._cache.setdefault(key, []).append(block)

    def pop(self, key: BlockHash, block_id: int) -> KVCacheBlock | None:
        """Remove `block_id` from `key`'s blocks; the block, or None when it was not cached under `key`."""
        blocks = self._cache.get(key, [])
        for i, block in enumerate(blocks):
            if block.block_id == block_id:
                del blocks[i]
                if not blocks:
                    del self._cache[key]
                return block
        return None

    def items(self) -> list[tuple[BlockHash, list[KVCacheBlock]]]:
        return list(self._cache.items())

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    def __init__(self, num_gpu_blocks: int, hybrid: bool = False) -> None:
        assert num_gpu_blocks > 0
        self.num_gpu_blocks = num_gpu_blocks
        self.hybrid = hybrid
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.kv_event_queue: list[tuple] = []
        self.frozen: PoolState | None = None  # the value of the pool as it is, once taken (module doc)
        self.frozen_map: tuple[tuple, tuple] | None = None  # its hashes and cached map, once taken

    # -- the value form --------------------------------------------------------------------------------------
    def freeze(self) -> PoolState:
        if self.frozen is not None:
            return self.frozen
        if self.frozen_map is None:
            cached = by_chain((key, tuple(map(_BLOCK_ID, blocks))) for key, blocks in
                              self.cached_block_hash_to_block.items())
            self.frozen_map = (tuple(map(_BLOCK_HASH, self.blocks)), cached)
        hashes, cached = self.frozen_map
        self.frozen = PoolState(tuple(map(_REF_CNT, self.blocks)), hashes,
                                tuple(map(_BLOCK_ID, self.free_block_queue.get_all_free_blocks())), cached)
        return self.frozen

    @classmethod
    def thaw(cls, state: PoolState, hybrid: bool = False) -> "BlockPool":
        pool = cls.__new__(cls)
        pool.num_gpu_blocks = len(state.refs)
        pool.hybrid = hybrid
        pool.blocks = [KVCacheBlock(i, ref, h) for i, (ref, h) in enumerate(zip(state.refs, state.hashes))]
        pool.blocks[0].is_null = True
        pool.null_block = pool.blocks[0]
        pool.free_block_queue = FreeKVCacheBlockQueue(pool.blocks[i] for i in state.free)
        pool.cached_block_hash_to_block = BlockHashToBlockMap()
        for key, ids in state.cached:
            for i in ids:
                pool.cached_block_hash_to_block.insert(key, pool.blocks[i])
        pool.kv_event_queue = []
        pool.frozen, pool.frozen_map = state, (state.hashes, state.cached)
        return pool

    # -- the prefix cache ------------------------------------------------------------------------------------
    def key(self, block_hash: BlockHash, kv_cache_group_id: int) -> tuple:
        """The cached map's key of a group's block: `(group_id, hash)`, or the hash in a one-group pool."""
        return (kv_cache_group_id, block_hash) if self.hybrid else block_hash

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """A block cached under `block_hash` (the first cached, where several are), or None on a miss."""
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def cache_full_blocks(self, block_hashes: Sequence[BlockHash], blocks: Sequence[KVCacheBlock],
                          num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          kv_cache_group_id: int = 0) -> None:
        """Cache `blocks[num_cached_blocks:num_full_blocks]` of a request under its hashes (keyed with the group),
        null blocks skipped; one `BlockStored`."""
        if num_cached_blocks >= num_full_blocks:
            return
        self.frozen = self.frozen_map = None
        new_hashes = []
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            assert block.block_hash is None, f"block {block.block_id} is cached already"
            key = self.key(block_hashes[i], kv_cache_group_id)
            block.block_hash = key
            self.cached_block_hash_to_block.insert(key, block)
            new_hashes.append(key)
        parent = block_hashes[num_cached_blocks - 1] if num_cached_blocks else None
        token_ids = tuple(t for h in block_hashes[num_cached_blocks:num_full_blocks] for t in block_tokens(h))
        self._emit(BlockStored(tuple(new_hashes), parent, token_ids, block_size))

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """A block leaving the free queue for reuse drops its cached hash (`BlockRemoved`)."""
        if block.block_hash is None:
            return False
        self.frozen_map = None  # (the rest of the value: its one caller, `get_new_blocks`)
        key = block.block_hash
        removed = self.cached_block_hash_to_block.pop(key, block.block_id)
        block.reset_hash()
        if removed is None:
            return False
        self._emit(BlockRemoved((key,)))
        return True

    # -- allocation ------------------------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """`num_blocks` blocks from the front of the free queue, each with ref_cnt 1 (a cached one is evicted)."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        self.frozen = None
        taken = self.free_block_queue.popleft_n(num_blocks)
        for block in taken:
            self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.incr_ref()
        return taken

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A prefix-cache hit: one more holder each; a free block leaves the queue."""
        self.frozen = None
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.incr_ref()

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """One holder less each, in eviction order (the caller passes a request's blocks tail first): a block no
        one holds any more goes to the front of the queue when uncached, to the back when cached."""
        self.frozen = None
        evict_first, evict_last = [], []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.decr_ref()
            if block.ref_cnt == 0:
                (evict_first if block.block_hash is None else evict_last).append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; refused (False) while any request holds a block."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # the null block always counts as used
            return False
        self.frozen = self.frozen_map = None
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        self._emit(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    # -- events ----------------------------------------------------------------------------------------------
    def _emit(self, event: tuple) -> None:
        self.kv_event_queue.append(event)

    def take_events(self) -> tuple[tuple, ...]:
        events, self.kv_event_queue = tuple(self.kv_event_queue), []
        return events
