"""SGLang's real `RadixCache` over its real `PagedTokenToKVPoolAllocator`, imported from a release
(`kvsim.conform.installed`, engine "sglang"), driven in the child (`kvsim.conform.installed_child`).

The pair is upstream's simulated cache (`RadixCache.create_simulated`'s parameters) over a real
`PagedTokenToKVPoolAllocator(size, page_size, torch.int64, "cpu", kvcache=None, need_sort=...)` and, for the request
ops, a `ReqToTokenPool(rows, context, "cpu", False)`; the allocator only keeps `kvcache` for its CPU-copy helpers,
never called here. Keys are `RadixKey(array("q", tokens))` (no extra key),
values int64 CPU tensors, sent and answered as lists. Node handles are ints: upstream's `TreeNode.id` counted from
the root's (0), handed out by `match` and `insert` and valid until the next `build`.

The vocabulary, each answer JSON:

* `build(size, page_size, need_sort=False, rows=4, context=64)`: a new allocator of `size` slots, a request pool of
  `rows` rows of `context` slots and an empty tree over them (the previous ones, their requests and handles are
  forgotten). Answers `dump`.
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
  CPU 0.5.23's platform has no Triton, so its allocator runs the torch path (`alloc_extend_naive`,
  `alloc_decode_naive`); 0.5.13 and 0.5.14 have only the Triton kernels, run in Triton's interpreter
  (`installed.CHILD_ENVIRONMENT`).

A request's life through 0.5.23's scheduler calls (a `schedule_batch.Req`; the process's server arguments are
published with their defaults on first use, as a scheduler process does):

* `prefill(request, tokens, outputs=())`: a `Req` of prompt `tokens` and output ids `outputs` (a retracted
  request's, which it keeps), `Req.init_next_round_input` (the match of both), `lock` of the matched node, a
  row from the request pool, `allocation.alloc_paged_token_slots_extend` (evicts what the extend may need, then `alloc_extend`),
  the prefix and the new slots written into the row as `write_cache_indices` does without Triton: `{"prefix_len",
  "indices": the row, "node": the locked node}`.
* `sample(request, token)`: `token` appended to the request's output, as the scheduler's batch-result processing
  (`process_batch_result_prefill` / `_decode`) appends the token a step sampled; it has no slot yet.
* `decode(request, token=None)`: the slot of the request's last output token (`token` appended first when given)
  from `allocation.alloc_paged_token_slots_decode`, written into the row: the slot.
* `checkpoint(request)`: `common.checkpoint_kv_cache` (0.5.23's `cache_unfinished_req`): the prefilled tokens into
  the tree, the lock moved to the new node: `{"protected_len", "node"}`.
* `release(request, checkpoint=True)`: the request finished (`FINISH_LENGTH`), then `common.release_kv_cache`
  (0.5.23's `cache_finished_req`; without `checkpoint` nothing is inserted): answers `sizes`.
* `free_group_begin()` / `free_group_end()`: the allocator's free group, as the batch-result processing opens it
  around a batch's checkpoints and releases (every free held back, released at the end as one block).

* `sizes()`: `{"available": allocator slots, "evictable", "protected"}` (the tree's counters).
* `dump()`: `{"tree": root node, "free_pages": [pages in the order alloc hands them out], "staged_pages": [freed
  pages need_sort holds back until an alloc runs short, sorted as that alloc merges them], "requests": {request:
  {"row": its slots, "protected_len": the tree-owned prefix}}, "req_slots": the request pool's free rows
  (`len(free_slots)`, what `SchedulerInvariantChecker._check_req_pool` counts)}`; a node is `{"id", "key": tokens, "value":
  indices, "lock_ref", "children": [nodes by key]}` (the root's key and value are empty, its lock_ref 1).

The tree and allocator ops run on 0.5.13 to 0.5.16 too (there `match_prefix` answers the indices and no length,
`insert` no node: the driver reads both off the tree). Every op but `dump` takes `observe=True` to answer
`{"answer": ..., "state": dump()}`. LRU eviction orders leaves by `TreeNode.last_access_time`
(`time.monotonic()`): the driver gives `radix_cache` a clock that ticks once per reading, so the order is the order
of the calls in every run, never two leaves at the same instant.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Mapping

from kvsim.engine.errors import ConfigError

from ..installed_child import dispatch

OPS = ("build", "match", "insert", "lock", "unlock", "evict", "alloc", "free", "alloc_extend", "alloc_decode",
       "free_group_begin", "free_group_end", "prefill", "sample", "decode", "checkpoint", "release", "sizes", "dump")


class TickClock:
    """`radix_cache`'s `time`: `monotonic()` counts readings; every other name is the real module's."""

    def __init__(self) -> None:
        self.ticks = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self.ticks))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class SlotOps:
    """What the SGLang tree drivers share: keys and index tensors made from lists, and their allocator's `alloc` and
    `free` (`self.allocator`)."""

    allocator: Any

    @staticmethod
    def _key(tokens: list[int]) -> Any:
        from array import array

        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens))

    @staticmethod
    def _tensor(values: list[int]) -> Any:
        import torch

        return torch.tensor(list(values), dtype=torch.int64)

    def op_alloc(self, n: int) -> Any:
        out = self.allocator.alloc(n)
        return None if out is None else out.tolist()

    def op_free(self, indices: list[int]) -> Any:
        self.allocator.free(self._tensor(indices))
        return None


class RadixDriver(SlotOps):
    """One real radix tree and paged allocator at a time, answering the requests above."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.allocator: Any = None
        self.nodes: dict[int, Any] = {}
        self.pool: Any = None
        self.requests: dict[str, Any] = {}
        self.published = False

    def handle(self, op: str, args: Mapping[str, Any]) -> Any:
        return dispatch(self, op, args, OPS, self.cache is not None, "cache", "dump")

    # --- helpers ---

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

    def op_build(self, size: int, page_size: int, need_sort: bool = False, rows: int = 4, context: int = 64) -> Any:
        import torch
        from sglang.srt.mem_cache import radix_cache
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        radix_cache.time = TickClock()  # the module loaded now (a mutant's too): its TreeNodes and LRU read it
        self.allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.int64, "cpu", kvcache=None,
                                                     need_sort=need_sort)
        self.pool = ReqToTokenPool(rows, context, "cpu", False)
        # create_simulated's parameters, with the request-to-token pool the request ops need
        self.cache = radix_cache.RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                                            token_to_kv_pool_allocator=self.allocator,
                                                            page_size=page_size))
        self.nodes = {0: self.cache.root_node}
        self.requests = {}
        return self.op_dump()

    def op_match(self, tokens: list[int]) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        match = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens)))
        node = match.last_device_node
        if hasattr(match, "device_prefix_len"):
            indices = self.cache.path_device_indices(node).tolist()
        else:  # before 0.5.23 the match carries the indices (`device_indices`) and no length
            indices = match.device_indices.tolist()
        return {"prefix_len": len(indices), "indices": indices, "node": self._handle(node)}

    def op_insert(self, tokens: list[int], indices: list[int]) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        if len(indices) != len(tokens):
            raise ConfigError("indices", f"one index per token ({len(tokens)})", len(indices))
        key = self._key(tokens)
        result = self.cache.insert(InsertParams(key=key, value=self._tensor(indices)))
        node = getattr(result, "last_device_node", None)
        return {"prefix_len": int(result.prefix_len), "node": self._handle(node or self._walk(key))}

    def _walk(self, key: Any) -> Any:
        """The node a page-aligned `key` ends on, read off the tree without touching it (before 0.5.23 `insert`
        does not answer its node)."""
        ps = self.cache.page_size
        key, node = key.page_aligned(ps), self.cache.root_node
        while len(key):
            node = node.children[key.child_key(ps)]
            key = key[len(node.key):]
        return node

    def op_lock(self, node: int) -> Any:
        return {"delta": int(self.cache.inc_lock_ref(self._node(node)).delta)}

    def op_unlock(self, node: int) -> Any:
        return {"delta": int(self.cache.dec_lock_ref(self._node(node)).delta)}

    def op_evict(self, num_tokens: int) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return {"evicted": int(self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted)}

    def op_alloc_extend(self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]) -> Any:
        prefix, seq = self._tensor(prefix_lens), self._tensor(seq_lens)
        out = self.allocator.alloc_extend(prefix, prefix, seq, seq, self._tensor(last_locs),
                                          int(sum(seq_lens) - sum(prefix_lens)))
        return None if out is None else out.tolist()

    def op_alloc_decode(self, seq_lens: list[int], last_locs: list[int]) -> Any:
        seq = self._tensor(seq_lens)
        out = self.allocator.alloc_decode(seq, seq, self._tensor(last_locs))
        return None if out is None else out.tolist()

    def op_free_group_begin(self) -> Any:
        self.allocator.free_group_begin()
        return None

    def op_free_group_end(self) -> Any:
        self.allocator.free_group_end()
        return None

    # --- a request's life, as the scheduler's calls make it ---

    def _publish(self) -> None:
        """The request path reads the process's published server arguments (`runtime_context.get_serving()` and
        the like): defaults, published once, as a scheduler process does at start."""
        if not self.published:
            from sglang.srt import runtime_context
            from sglang.srt.server_args import ServerArgs

            runtime_context.publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")
            self.published = True

    def _req(self, request: str) -> Any:
        req = self.requests.get(request)
        if req is None:
            raise ConfigError("request", "a request prefilled and not released", request)
        return req

    def _row(self, req: Any, end: int) -> list[int]:
        return self.pool.req_to_token[req.kv.req_pool_idx, :end].tolist()

    def op_prefill(self, request: str, tokens: list[int], outputs: list[int] | tuple[int, ...] = ()) -> Any:
        import torch
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache import allocation
        from sglang.srt.sampling.sampling_params import SamplingParams

        self._publish()
        if request in self.requests:
            raise ConfigError("request", "a request not running", request)
        req = Req(request, "", array("q", tokens), SamplingParams(max_new_tokens=1 << 20))
        req.output_ids.extend(outputs)  # a retracted request keeps its outputs (`reset_for_retract`)
        req.init_next_round_input(self.cache)  # the match: prefix_len, last_node, cache_protected_len
        req.lock = self.cache.lock(req.last_node)
        allocation.alloc_req_slots(self.pool, [req], self.cache)
        prefix = self.cache.prefix_device_indices(req)
        n, hit = len(tokens) + len(outputs), int(req.prefix_len)
        lens = (torch.tensor([hit]), torch.tensor([n]))
        last = prefix[-1:] if hit else torch.tensor([-1])
        out = allocation.alloc_paged_token_slots_extend(self.cache, lens[0], lens[0], lens[1], lens[1], last, n - hit)
        # what write_cache_indices does without Triton: the prefix, then the new slots, into the request's row
        self.pool.write((req.kv.req_pool_idx, slice(0, hit)), prefix)
        self.pool.write((req.kv.req_pool_idx, slice(hit, n)), out)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = n
        req.extend_end = n
        self.requests[request] = req
        return {"prefix_len": hit, "indices": self._row(req, n), "node": self._handle(req.last_node)}

    def op_sample(self, request: str, token: int) -> Any:
        self._req(request).output_ids.append(token)
        return None

    def op_decode(self, request: str, token: int | None = None) -> Any:
        import torch

        from sglang.srt.mem_cache import allocation

        req = self._req(request)
        if token is not None:
            req.output_ids.append(token)
        n = req.kv.kv_committed_len
        last = self.pool.req_to_token[req.kv.req_pool_idx, n - 1:n].to(torch.int64)
        seq = torch.tensor([n + 1])
        out = allocation.alloc_paged_token_slots_decode(self.cache, seq, seq, last)
        self.pool.write((req.kv.req_pool_idx, slice(n, n + 1)), out)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = n + 1
        return int(out[0])

    def op_checkpoint(self, request: str) -> Any:
        from sglang.srt.mem_cache import common

        req = self._req(request)
        common.checkpoint_kv_cache(req, self.cache)
        return {"protected_len": int(req.kv.cache_protected_len), "node": self._handle(req.last_node)}

    def op_release(self, request: str, checkpoint: bool = True) -> Any:
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache import common

        req = self._req(request)
        req.finished_reason = FINISH_LENGTH(len(req.output_ids))
        common.release_kv_cache(req, self.cache, checkpoint=checkpoint)
        del self.requests[request]
        return self.op_sizes()

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

        staged = getattr(self.allocator, "staged_pages", None)  # 0.5.23; before it a tensor, `release_pages`
        staged = [p for t in staged for p in t.tolist()] if staged is not None else \
            self.allocator.release_pages.tolist()
        return {"tree": node(root), "free_pages": self.allocator.free_pages.tolist(), "staged_pages": sorted(staged),
                "requests": {r: {"row": self._row(q, q.kv.kv_allocated_len), "protected_len": q.kv.cache_protected_len}
                             for r, q in sorted(self.requests.items())},
                "req_slots": len(self.pool.free_slots)}
