"""SGLang's real `UnifiedRadixCache` with its Full and SWA components over a real `SWATokenToKVPoolAllocator`
(page size 1, CPU tensors), imported from a release (`kvsim.conform.installed`, engine "sglang": 0.5.13 before
#28161, 0.5.14 to 0.5.16 and 0.5.23 after), driven in the child (`kvsim.conform.installed_child`).

One driver for every release; where 0.5.20 moved a name, `Api` looks it up per release. 0.5.13 to 0.5.16 keep the
tree's nodes on the cache (`cache.root_node`, a match answers a node, locks take nodes, `ComponentType` in
`unified_cache_components/tree_component.py`); 0.5.20 moved them into the package `mem_cache/unified_cache/` (the
Python `UnifiedTreeCore`, `cache.tree_core`, asked for by name: the release's default is a Rust core, another
implementation), where a match and a lock answer `NodeId`s, `inc_lock_ref` a receipt whose SWA boundary uuid is
`component_lock_uuids[SWA]`, `dec_lock_ref` takes that receipt back, and the early release is
`release_swa(TreeLock)` (what `release_swa_prefix_lock` calls; 0.5.14 to 0.5.16: `dec_swa_lock_only`).

The allocator's KV pool is `SwaPoolStub`, a `BaseSWAKVPool` holding only the full-to-SWA index mapping the
allocator registers and translating through it (the allocator reads nothing else of it at page size 1). With a
Mamba pool (`build(mamba_size=n)`) the tree's components are (FULL, SWA, MAMBA) and its `req_to_token_pool` is a
`HybridReqToTokenPool` holding only a real `MambaSlotAllocator` (`mamba_pool_stub`: the component reads nothing
else of it without the extra buffer, and no state is ever copied); the Mamba component reads two settings at
construction and in a match (`mamba_cache_chunk_size`, 0.5.23 also `mamba_max_states_per_path`), given by
`mamba_settings` as the defaults a server without the extra buffer has. A node is named by its token path from
the root (`[]` the root).

The vocabulary (the tree ops the `radix-cache-swa` model's scheduler makes, `models/radix_cache/swa_system.py`):

* `build(size, size_swa, sliding_window_size, mamba_size=0)`: a new allocator and an empty tree with components
  (FULL, SWA), and MAMBA over a Mamba pool of `mamba_size` slots if it is not 0. Answers `dump`.
* `match(tokens)`: `match_prefix`: `{"indices", "node": its path}` (the device match, ended where every
  component's validator accepts).
* `insert(tokens, indices, prev_prefix_len, mamba_value=None)`: `insert` (`mamba_value`: the Mamba state slot for
  its last node): `{"prefix_len", "mamba_exist"}`.
* `lock(node)`: `inc_lock_ref`: the `swa_uuid_for_lock` (null: no window boundary). `unlock(node, swa_uuid_for_lock,
  skip_swa=False)`:
  `dec_lock_ref` (`skip_swa` only where the release has the parameter, 0.5.14 on).
* `release_window(node, swa_uuid_for_lock)`: what `ScheduleBatch.maybe_evict_swa` does past the window:
  `dec_swa_lock_only` where `hasattr(tree_cache, "dec_swa_lock_only")`; answers whether it ran (False on 0.5.13).
* `evict(num_tokens, swa_num_tokens, mamba_num=0)`: `evict(EvictParams(...))`: `{"full", "swa", "mamba"}` tokens
  (Mamba: states) evicted.
* `alloc(n)`: indices or null. `free(indices)`: `free` (both pools). `mamba_alloc(n)`, `mamba_free(indices)`: the
  Mamba pool's `MambaSlotAllocator`.
* `dump()`: `{"nodes": [{"path", "full_value", "full_lock_ref", "swa_value" (null: tombstone), "swa_lock_ref",
  "swa_uuid"}] sorted by path, "full_free" and "swa_free" (each pool's free slots in the order alloc takes them),
  "full_available", "swa_available", "full_evictable", "full_protected",
  "swa_evictable", "swa_protected"}`; with a Mamba pool each node's "mamba_value" and "mamba_lock_ref", and
  "mamba_free", "mamba_available", "mamba_evictable", "mamba_protected".

Every op but `dump` takes `observe=True` to answer `{"answer": ..., "state": dump()}`.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvsim.engine.errors import ConfigError

from ..installed_child import dispatch
from .real_radix import SlotOps

OPS = ("build", "match", "insert", "lock", "unlock", "release_window", "evict", "alloc", "free", "mamba_alloc",
       "mamba_free", "dump")


def swa_pool_stub() -> Any:
    """A `BaseSWAKVPool` with the mapping only (made in the child, where the release imports)."""
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool

    class SwaPoolStub(BaseSWAKVPool):
        full_kv_pool = swa_kv_pool = None

        def __init__(self) -> None:
            self.full_to_swa_index_mapping = None

        def register_mapping(self, full_to_swa_index_mapping: Any) -> None:
            self.full_to_swa_index_mapping = full_to_swa_index_mapping

        def translate_loc_from_full_to_swa(self, kv_indices: Any) -> Any:
            return self.full_to_swa_index_mapping[kv_indices]

    SwaPoolStub.__abstractmethods__ = frozenset()  # the KV buffers' methods: never called here
    return SwaPoolStub()


def mamba_pool_stub(size: int) -> Any:
    """A `HybridReqToTokenPool` with a real `MambaSlotAllocator` only (made in the child)."""
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    pool = object.__new__(HybridReqToTokenPool)  # its tensors and request slots: never read here
    pool.mamba_allocator = MambaSlotAllocator(size=size, device="cpu")
    return pool


def mamba_settings(tree_core: bool) -> None:
    """What the Mamba component reads of the server's settings: the caching chunk size (64, FLA's chunk) and
    0.5.23's `mamba_max_states_per_path` (-1, unlimited) and `enable_mamba_extra_buffer_lazy` (off)."""
    from types import SimpleNamespace as ns

    if not tree_core:
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        set_global_server_args_for_scheduler(ns(mamba_cache_chunk_size=64))
        return
    from sglang.srt import runtime_context

    context = runtime_context._CONTEXT
    context._server_args = ns(_mamba_cache_chunk_size=64)
    context._config_bags = {"exec": ns(mamba=ns(mamba_max_states_per_path=-1, enable_mamba_extra_buffer_lazy=False))}


class Api:
    """The release's names for what the driver calls (the two layouts above)."""

    def __init__(self) -> None:
        try:  # 0.5.23: the package unified_cache/
            from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
            self.tree_core = True
        except ImportError:  # 0.5.13 to 0.5.16
            from sglang.srt.mem_cache.unified_cache_components.tree_component import ComponentType
            self.tree_core = False
        self.FULL, self.SWA, self.MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA

    def core(self, cache: Any) -> Any:
        """What holds the tree, its nodes and sizes."""
        return cache.tree_core if self.tree_core else cache

    def node(self, cache: Any, handle: Any) -> Any:
        """A node a match or lock names (0.5.23: a NodeId)."""
        return cache.tree_core.node_by_id(handle) if self.tree_core else handle

    def handle(self, node: Any) -> Any:
        return node.id if self.tree_core else node


class UnifiedSwaDriver(SlotOps):
    """One real unified tree and SWA allocator at a time, answering the requests above."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.allocator: Any = None
        self.pool: Any = None  # with a Mamba component: the request-slot pool holding the Mamba slot allocator
        self.api: Any = None

    def handle(self, op: str, args: Mapping[str, Any]) -> Any:
        return dispatch(self, op, args, OPS, self.cache is not None, "cache", "dump")

    def _node(self, path: list[int]) -> Any:
        node, rest = self.api.core(self.cache).root_node, tuple(path)
        while rest:
            child = node.children.get(rest[0])
            if child is None or tuple(child.key.token_ids) != rest[:len(child.key)]:
                raise ConfigError("node", "the token path of a node in the tree", list(path))
            node, rest = child, rest[len(child.key):]
        return node

    @staticmethod
    def _path(node: Any) -> list[int]:
        parts = []
        while node.parent is not None:
            parts.append(list(node.key.token_ids))
            node = node.parent
        return [t for part in reversed(parts) for t in part]

    def op_build(self, size: int, size_swa: int, sliding_window_size: int, mamba_size: int = 0) -> Any:
        import torch
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self.api = api = Api()
        self.allocator = SWATokenToKVPoolAllocator(size, size_swa, 1, torch.int64, "cpu", swa_pool_stub(), False)
        self.pool = mamba_pool_stub(mamba_size) if mamba_size else None
        components = (api.FULL, api.SWA) + ((api.MAMBA,) if mamba_size else ())
        params = dict(disable=False, req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.allocator,
                      page_size=1, sliding_window_size=sliding_window_size, tree_components=components)
        if api.tree_core:
            params["tree_core_backend"] = "python"
        if mamba_size:
            mamba_settings(api.tree_core)
        self.cache = UnifiedRadixCache(CacheInitParams(**params))
        return self.op_dump()

    def op_match(self, tokens: list[int]) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        match = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens)))
        if self.api.tree_core:
            indices = self.cache.path_device_indices(match.last_device_node)[:match.device_prefix_len]
        else:
            indices = match.device_indices
        return {"indices": indices.tolist(), "node": self._path(self.api.node(self.cache, match.last_device_node))}

    def op_insert(self, tokens: list[int], indices: list[int], prev_prefix_len: int,
                  mamba_value: list[int] | None = None) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        mamba = {} if mamba_value is None else {"mamba_value": self._tensor(mamba_value)}
        result = self.cache.insert(InsertParams(key=self._key(tokens), value=self._tensor(indices),
                                                prev_prefix_len=prev_prefix_len, **mamba))
        return {"prefix_len": int(result.prefix_len), "mamba_exist": bool(result.mamba_exist)}

    def op_lock(self, node: list[int]) -> Any:
        result = self.cache.inc_lock_ref(self.api.handle(self._node(node)))
        if self.api.tree_core:
            return result.component_lock_uuids.get(self.api.SWA)
        return result.swa_uuid_for_lock

    def _receipt(self, node: Any, swa_uuid_for_lock: int | None) -> Any:
        """What the release takes back: the uuid (0.5.14 to 0.5.16), or the lock's receipt (0.5.23: the anchor
        node and each component's boundary, Full's at the root)."""
        from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams

        if not self.api.tree_core:
            return DecLockRefParams(swa_uuid_for_lock=swa_uuid_for_lock)
        return DecLockRefParams(node_id=node.id, component_lock_uuids={self.api.FULL: None,
                                                                       self.api.SWA: swa_uuid_for_lock})

    def op_unlock(self, node: list[int], swa_uuid_for_lock: int | None, skip_swa: bool = False) -> Any:
        n = self._node(node)
        params = self._receipt(n, swa_uuid_for_lock)
        if skip_swa:  # cache_finished_req passes it from 0.5.14 on, for a request released early
            self.cache.dec_lock_ref(self.api.handle(n), params, skip_swa=True)
        else:
            self.cache.dec_lock_ref(self.api.handle(n), params)
        return None

    def op_release_window(self, node: list[int], swa_uuid_for_lock: int | None) -> Any:
        if self.api.tree_core:  # release_swa_prefix_lock -> release_swa(req.lock)
            from sglang.srt.mem_cache.base_prefix_cache import TreeLock

            n = self._node(node)
            self.cache.release_swa(TreeLock(n.id, self._receipt(n, swa_uuid_for_lock)))
            return True
        if not hasattr(self.cache, "dec_swa_lock_only"):  # maybe_evict_swa's guard
            return False
        self.cache.dec_swa_lock_only(self._node(node), swa_uuid_for_lock)
        return True

    def op_evict(self, num_tokens: int, swa_num_tokens: int, mamba_num: int = 0) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        result = self.cache.evict(EvictParams(num_tokens=num_tokens, swa_num_tokens=swa_num_tokens,
                                              mamba_num=mamba_num))
        return {"full": int(result.num_tokens_evicted), "swa": int(result.swa_num_tokens_evicted),
                "mamba": int(result.mamba_num_evicted)}

    def op_mamba_alloc(self, n: int) -> Any:
        out = self.pool.mamba_allocator.alloc(n)
        return None if out is None else out.tolist()

    def op_mamba_free(self, indices: list[int]) -> Any:
        self.pool.mamba_allocator.free(self._tensor(indices))
        return None

    def op_dump(self) -> Any:
        full_t, swa_t = self.api.FULL, self.api.SWA
        core = self.api.core(self.cache)
        rows = []
        stack = [((), c) for c in core.root_node.children.values()]
        while stack:
            path, n = stack.pop()
            path = path + tuple(n.key.token_ids)
            full, swa = n.component_data[full_t], n.component_data[swa_t]
            rows.append({"path": list(path), "full_value": full.value.tolist(), "full_lock_ref": full.lock_ref,
                         "swa_value": None if swa.value is None else swa.value.tolist(),
                         "swa_lock_ref": swa.lock_ref, "swa_uuid": swa.metadata.get("uuid")})
            if self.pool is not None:
                mamba = n.component_data[self.api.MAMBA]
                rows[-1].update(mamba_value=None if mamba.value is None else mamba.value.tolist(),
                                mamba_lock_ref=mamba.lock_ref)
            stack.extend((path, c) for c in n.children.values())
        out = {} if self.pool is None else {
            "mamba_free": self.pool.mamba_allocator.free_slots.tolist(),
            "mamba_available": int(self.pool.mamba_allocator.available_size()),
            "mamba_evictable": int(core.component_evictable_size_[self.api.MAMBA]),
            "mamba_protected": int(core.component_protected_size_[self.api.MAMBA])}
        return {**out, "nodes": sorted(rows, key=lambda r: r["path"]),
                "full_free": self.allocator.full_attn_allocator.free_pages.tolist(),
                "swa_free": self.allocator.swa_attn_allocator.free_pages.tolist(),
                "full_available": int(self.allocator.full_available_size()),
                "swa_available": int(self.allocator.swa_available_size()),
                "full_evictable": int(core.component_evictable_size_[full_t]),
                "full_protected": int(core.component_protected_size_[full_t]),
                "swa_evictable": int(core.component_evictable_size_[swa_t]),
                "swa_protected": int(core.component_protected_size_[swa_t])}
