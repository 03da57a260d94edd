"""SGLang's real `RadixCache` over its real `PagedTokenToKVPoolAllocator`, imported from a release
(`kvsim.conform.installed`, engine "sglang"), driven in the child (`kvsim.conform.installed_child`).

The pair is upstream's own simulated cache: `RadixCache.create_simulated(mock_allocator=PagedTokenToKVPoolAllocator(
size, page_size, torch.int64, "cpu", kvcache=None, need_sort=...), page_size=...)`; the allocator only keeps
`kvcache` for its CPU-copy helpers, never called here. Keys are `RadixKey(array("q", tokens))` (no extra key),
values int64 CPU tensors, sent and answered as lists. Node handles are ints: upstream's `TreeNode.id` counted from
the root's (0), handed out by `match` and `insert` and valid until the next `build`.

The vocabulary, each answer JSON:

* `build(size, page_size, need_sort=False)`: a new allocator of `size` slots and an empty tree over it (the
  previous pair and its handles are forgotten). Answers `dump`.
* `match(tokens)`: `match_prefix`: `{"prefix_len", "indices": the matched path's values, "node": handle}` (the key
  is cut to whole pages; a match ending inside a node splits it).
* `insert(tokens, indices)`: `insert` of the page-aligned key with `indices[:len(key)]`: `{"prefix_len": tokens
  already in the tree (the caller frees its own indices there), "node": handle}`.
* `lock(node)` / `unlock(node)`: `inc_lock_ref` / `dec_lock_ref` on the path to the root: `{"delta"}` (the change
  of `evictable_size`).
* `evict(num_tokens)`: `evict`: `{"evicted"}` (leaves in LRU order, each freed whole through `free_segment`).
* `alloc(n)`: the allocator's `alloc`: indices (`n // page_size` pages, contiguous per page) or null.
* `free(indices)`: the allocator's `free` (each page the indices touch, once).
* `alloc_extend(prefix_lens, seq_lens, last_locs)` / `alloc_decode(seq_lens, last_locs)`: the batch allocations
  (one entry per request; `last_locs`: the slot of each request's last token, -1 for none): indices or null. On a
  CPU the platform has no Triton, so the allocator runs its torch path (`alloc_extend_naive`, `alloc_decode_naive`).
* `sizes()`: `{"available": allocator slots, "evictable", "protected"}` (the tree's counters).
* `dump()`: `{"tree": root node, "free_pages": [pages in the order alloc hands them out], "staged_pages": [freed
  pages need_sort holds back until an alloc runs short]}`; a node is `{"id", "key": tokens, "value": indices,
  "lock_ref", "children": [nodes by key]}` (the root's key and value are empty, its lock_ref 1).

Every op but `dump` takes `observe=True` to answer `{"answer": ..., "state": dump()}`. LRU eviction orders leaves
by `TreeNode.last_access_time` (`time.monotonic()`): the driver gives `radix_cache` a clock that ticks once per
reading, so the order is the order of the calls in every run, never two leaves at the same instant.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Mapping

from kvsim.engine.errors import ConfigError

from ..installed_child import dispatch

OPS = ("build", "match", "insert", "lock", "unlock", "evict", "alloc", "free", "alloc_extend", "alloc_decode",
       "sizes", "dump")


class TickClock:
    """`radix_cache`'s `time`: `monotonic()` counts readings; every other name is the real module's."""

    def __init__(self) -> None:
        self.ticks = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self.ticks))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class RadixDriver:
    """One real radix tree and paged allocator at a time, answering the requests above."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.allocator: Any = None
        self.nodes: dict[int, Any] = {}

    def handle(self, op: str, args: Mapping[str, Any]) -> Any:
        return dispatch(self, op, args, OPS, self.cache is not None, "cache", "dump")

    # --- helpers ---

    @staticmethod
    def _key(tokens: list[int]) -> Any:
        from array import array

        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens))

    @staticmethod
    def _tensor(values: list[int]) -> Any:
        import torch

        return torch.tensor(list(values), dtype=torch.int64)

    def _handle(self, node: Any) -> int:
        handle = node.id - self.cache.root_node.id
        self.nodes[handle] = node
        return handle

    def _node(self, handle: int) -> Any:
        node = self.nodes.get(handle)
        if node is None:
            raise ConfigError("node", "a handle match or insert answered since the last build", handle)
        return node

    # --- ops ---

    def op_build(self, size: int, page_size: int, need_sort: bool = False) -> Any:
        import torch
        from sglang.srt.mem_cache import radix_cache
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

        radix_cache.time = TickClock()  # the module loaded now (a mutant's too): its TreeNodes and LRU read it
        self.allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.int64, "cpu", kvcache=None,
                                                     need_sort=need_sort)
        self.cache = radix_cache.RadixCache.create_simulated(mock_allocator=self.allocator, page_size=page_size)
        self.nodes = {0: self.cache.root_node}
        return self.op_dump()

    def op_match(self, tokens: list[int]) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        match = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens)))
        node = match.last_device_node
        return {"prefix_len": int(match.device_prefix_len),
                "indices": self.cache.path_device_indices(node).tolist(), "node": self._handle(node)}

    def op_insert(self, tokens: list[int], indices: list[int]) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        if len(indices) != len(tokens):
            raise ConfigError("indices", f"one index per token ({len(tokens)})", len(indices))
        result = self.cache.insert(InsertParams(key=self._key(tokens), value=self._tensor(indices)))
        return {"prefix_len": int(result.prefix_len), "node": self._handle(result.last_device_node)}

    def op_lock(self, node: int) -> Any:
        return {"delta": int(self.cache.inc_lock_ref(self._node(node)).delta)}

    def op_unlock(self, node: int) -> Any:
        return {"delta": int(self.cache.dec_lock_ref(self._node(node)).delta)}

    def op_evict(self, num_tokens: int) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return {"evicted": int(self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted)}

    def op_alloc(self, n: int) -> Any:
        out = self.allocator.alloc(n)
        return None if out is None else out.tolist()

    def op_free(self, indices: list[int]) -> Any:
        self.allocator.free(self._tensor(indices))
        return None

    def op_alloc_extend(self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]) -> Any:
        prefix, seq = self._tensor(prefix_lens), self._tensor(seq_lens)
        out = self.allocator.alloc_extend(prefix, prefix, seq, seq, self._tensor(last_locs),
                                          int(sum(seq_lens) - sum(prefix_lens)))
        return None if out is None else out.tolist()

    def op_alloc_decode(self, seq_lens: list[int], last_locs: list[int]) -> Any:
        seq = self._tensor(seq_lens)
        out = self.allocator.alloc_decode(seq, seq, self._tensor(last_locs))
        return None if out is None else out.tolist()

    def op_sizes(self) -> Any:
        return {"available": int(self.allocator.available_size()), "evictable": int(self.cache.evictable_size()),
                "protected": int(self.cache.protected_size())}

    def op_dump(self) -> Any:
        root = self.cache.root_node

        def node(n: Any) -> dict[str, Any]:
            value = n.value.tolist() if hasattr(n.value, "tolist") else list(n.value or [])
            children = sorted((node(c) for c in n.children.values()), key=lambda c: c["key"])
            return {"id": n.id - root.id, "key": list(n.key), "value": value, "lock_ref": n.lock_ref,
                    "children": children}

        staged = [p for t in getattr(self.allocator, "staged_pages", []) for p in t.tolist()]
        return {"tree": node(root), "free_pages": self.allocator.free_pages.tolist(), "staged_pages": staged}
