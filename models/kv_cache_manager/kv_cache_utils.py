"""The block, the free-block queue and the block hash (vLLM 0.33.0 `vllm/v1/core/kv_cache_utils.py`, in kvsim's words).

A block hash is a value the model compares for equality only: upstream hashes the parent's hash with the
block's token ids (SHA-256 or xxhash); here the hash *is* that pair, `(parent, token_ids)`, the first block's
parent being `ROOT` (the empty tuple). Two requests share a block hash exactly when they share every token up
to the end of that block, which is all the prefix cache reads of a hash. Hashes are tuples of tuples of ints,
so they order and print deterministically.

The free queue keeps upstream's eviction order: the block at the front is reused (and its cached hash evicted)
first. Upstream links the blocks in a doubly linked list for O(1) removal from the middle; a list does for the
model, the order being the behaviour.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from kvsim.engine.errors import ConfigError

ROOT: tuple = ()  # the parent of a request's first block hash (upstream: NONE_HASH)

BlockHash = tuple  # (parent BlockHash or ROOT, token ids of the block)

# the longest hash chain a request may make: comparing two hashes of one length descends their chains a call a
# block (tuples compare item by item), and the interpreter stops at its recursion limit (1000 calls: a simulated
# workload of 1,020 blocks a request raised RecursionError, 990 ran), so a workload is refused well below it
MAX_CHAIN_BLOCKS = 512


def chain_order(key: BlockHash | tuple[int, BlockHash]) -> tuple:
    """A key that sorts block hashes (and a hybrid pool's `(group id, hash)` keys) as they sort themselves, made
    without descending them again for every comparison: `(parent, tokens)` compares its parents first, down to
    ROOT (`()`, before any hash), so a shorter chain comes first, and chains of one length compare a block's tokens
    at a time from the root: `(length, tokens of block 1, ..., of the last)`. Compared as they are, two chains that
    part near the root are descended to where they part once for every level above it: quadratic in the length."""
    if type(key[0]) is int:  # a hybrid pool's key
        return key[0], chain_order(key[1])
    blocks = []
    while key:
        key, tokens = key
        blocks.append(tokens)
    blocks.append(len(blocks))
    blocks.reverse()
    return tuple(blocks)


# id(key) -> (key, chain_order(key)) of the keys `by_chain` met lately, at most ORDERS_KEPT of them (then emptied)
_ORDERS: dict[int, tuple[object, tuple]] = {}
ORDERS_KEPT = 1 << 14


def by_chain(pairs: Iterable[tuple[BlockHash | tuple[int, BlockHash], object]]) -> tuple:
    """(key, value) pairs sorted by their keys' `chain_order`: the cached map's and the announced view's order.
    A key's order is made once while it is among the keys met lately (`_ORDERS`, by identity): the cached map is
    sorted again whenever a block is cached or evicted, its keys the last sort's but one or two, and an order walks
    the key's whole chain."""
    known = _ORDERS

    def order(pair: tuple) -> tuple:
        key = pair[0]
        got = known.get(id(key))  # the entry holds its key: while it is there, no other object has that id
        if got is None:
            if len(known) >= ORDERS_KEPT:
                known.clear()
            got = known[id(key)] = (key, chain_order(key))
        return got[1]

    return tuple(sorted(pairs, key=order))


def check_chain(tokens: int, block_size: int, field: str) -> None:
    """ConfigError(`field`) unless a request of `tokens` tokens makes at most `MAX_CHAIN_BLOCKS` block hashes."""
    if -(-tokens // block_size) > MAX_CHAIN_BLOCKS:
        raise ConfigError(field, f"at most {MAX_CHAIN_BLOCKS * block_size} tokens a request ({MAX_CHAIN_BLOCKS} "
                          f"blocks of {block_size}: its block hashes nest a level a block)", tokens)


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The hash of a full block: its token ids chained with the parent block's hash."""
    return (parent, tuple(token_ids))


def request_block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[BlockHash, ...]:
    """The hash chain of a request: one hash per full block of its tokens (upstream's request block hasher)."""
    hashes: list[BlockHash] = []
    parent = ROOT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return tuple(hashes)


def block_tokens(block_hash: BlockHash) -> tuple[int, ...]:
    """The token ids a block hash covers (its own block's; the parent chain holds the rest)."""
    return block_hash[1]


class KVCacheBlock:
    """One KV cache block: its id, how many requests hold it, and its hash once it is full and cached."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "is_null")

    def __init__(self, block_id: int, ref_cnt: int = 0, block_hash: BlockHash | None = None) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self.block_hash = block_hash
        self.is_null = False

    def incr_ref(self) -> None:
        self.ref_cnt += 1

    def decr_ref(self) -> None:
        self.ref_cnt -= 1

    def reset_hash(self) -> None:
        self.block_hash = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, block_hash={self.block_hash!r})"


class FreeKVCacheBlockQueue:
    """The free blocks in eviction order: front first. Starts in block-id order; a freed request's blocks come
    back tail first (the caller reverses them), uncached ones to the front, cached ones to the back (LRU)."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._blocks: list[KVCacheBlock] = list(blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._blocks)

    def popleft(self) -> KVCacheBlock:
        if not self._blocks:
            raise ValueError("No free blocks available")
        return self._blocks.pop(0)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        assert len(self._blocks) >= n
        taken, self._blocks = self._blocks[:n], self._blocks[n:]
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        """Take a block out of the middle (a prefix-cache hit on a free cached block)."""
        self._blocks.remove(block)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._blocks[:0] = blocks

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._blocks.extend(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return list(self._blocks)
