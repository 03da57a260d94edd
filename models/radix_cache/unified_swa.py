"""SGLang's unified radix cache with a sliding-window (SWA) component (`sglang/srt/mem_cache/unified_radix_cache.py`,
`unified_cache_components/full_component.py`, `swa_component.py`, `allocator/swa.py`, 0.5.15; 0.5.20 moved them to
`unified_cache/unified_tree_core.py` and `unified_cache/components/`), the per-node lock counts of #28161. The variant's
flags (`variants.UnifiedSwaVariant`) are read where the releases differ: the tombstone recovery under a Full lock
(0.5.15), the SWA segment lock over tombstones and the split's LRU recency (0.5.20, #38482), the Mamba lock's
release after the early release (0.5.20's TreeCore).

Every node carries one component record per pool (`ComponentData`: value, lock_ref, the SWA window lock's
`uuid`): Full (the full-attention slots), SWA (the sliding-window pool's slots, `None` once tombstoned) and, with a
Mamba pool, Mamba (one state slot or `None`; `mamba.MambaComponent`, the third of `tree_components`).

* `SWATokenToKVPoolAllocator`: two pools of slots, a full slot mapped to the SWA slot allocated with it
  (`full_to_swa_index_mapping`); `free` gives both back, `free_swa` the SWA one only.
* `match_prefix(tokens) -> (indices, last_device_node)`: the walk splits a node a match ends inside; the match
  ends at the deepest node every component's validator accepts (the SWA validator: a window of SWA values ending
  there, counted from the last tombstone); then the SWA LRU's window refresh (`reset_node_and_window_ancestors_mru`).
* `insert(tokens, value, prev_prefix_len)`: the overlap frees the request's duplicate slots past its protected
  part; an SWA tombstone on the path is recovered from the request's fresh slots (`update_component_on_insert_overlap`
  branch 1: the node's old full slots freed); the rest becomes a new leaf with an SWA value.
* `inc_lock_ref(node) -> swa_uuid_for_lock`: Full locks the whole path; SWA locks from the node up until a window
  of SWA tokens is locked, skipping tombstones, and marks the window's top with a uuid (`acquire_component_lock`);
  Mamba locks the node's state only.
* `dec_lock_ref(node, swa_uuid_for_lock, skip_swa)`: all released along the same walks (`release_component_lock`);
  `skip_swa` skips SWA, and from 0.5.20 Mamba too (flag `mamba_lock_receipt`: before, the Mamba lock the early
  release dropped is released again, taking another request's).
* `dec_swa_lock_only(node, swa_uuid_for_lock)`: the early release of the SWA window lock (`release_window_lock`),
  Full's lock kept, and (#28161's second layer) the node's locks of lower internal priority than SWA's, Mamba's,
  dropped with it, so that full >= swa >= mamba holds on every node. New in 0.5.14 (#28161, both layers);
  0.5.13's UnifiedRadixCache has no such method, so the scheduler's `hasattr` guard skips the call (`swa_system`,
  variant `pre_28161`).
* `evict(num_tokens, swa_num_tokens, mamba_num)`: Full evicts unlocked device leaves, LRU first
  (`FullComponent.drive_eviction`, `_evict_device_leaf`, every component of the leaf freed); SWA walks its LRU
  skipping SWA-locked nodes: a device leaf goes whole, another node is tombstoned (its SWA slots freed, the node
  kept) and `_cascade_evict` frees its Mamba state (Mamba's internal priority 0 < SWA's 1 < Full's 2); Mamba walks
  its LRU skipping Mamba-locked states: a device leaf goes whole, another node loses its state only. Evicting or
  tombstoning a locked component is recorded as a problem (upstream's `_cascade_evict` asserts `cd.lock_ref == 0`
  on each component it cascades into). #28161's other `_cascade_evict` line, sparing a locked component whose
  internal priority is at least the trigger's, acts only when the node is a device leaf at the cascade, which
  without HiCache an SWA or Mamba trigger never reaches (their drives take a device leaf whole first).

Left out (the smallest scope where #28161 shows): page sizes above 1, Mamba's extra (ping-pong) buffer and its
branching states (`mamba_branching_seqlen`: with neither, a match ends only at a node where some request's cached
sequence ended, so a prefix shared by different prompts hits nothing), the copy of a matched state into the
request's own slot (`cow_mamba`: no slot accounting), HiCache (host values, host locks, write-back), sessions,
`swa_evicted_seqlen` (a request's own out-of-window SWA slots freed during decode, `free_swa_out_of_window_slots`:
inserts always carry 0, so an insert never creates a tombstone, only eviction does), priorities, hit counts and
events. A new leaf longer than the window is split so that its last window is a node of its own
(`_maybe_split_leaf_for_swa_lock`).
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple, Sequence

from .mamba import MambaComponent, MambaSlotAllocator
from .variants import SWA_FIXED, UnifiedSwaVariant


class ComponentData:
    __slots__ = ("value", "lock_ref", "uuid")

    def __init__(self, value: tuple[int, ...] | None = None, lock_ref: int = 0, uuid: int | None = None) -> None:
        self.value, self.lock_ref, self.uuid = value, lock_ref, uuid


class UnifiedTreeNode:
    __slots__ = ("children", "parent", "key", "full", "swa", "mamba", "last_access_time", "swa_lru_time",
                 "mamba_lru_time")

    def __init__(self, time: int) -> None:
        self.children: dict[int, UnifiedTreeNode] = {}
        self.parent: UnifiedTreeNode | None = None
        self.key: tuple[int, ...] = ()
        self.full, self.swa, self.mamba = ComponentData(), ComponentData(), ComponentData()
        self.last_access_time = time
        self.swa_lru_time: int | None = None  # its place in the SWA LRU list; None: not in it
        self.mamba_lru_time: int | None = None  # the same in the Mamba LRU list

    def path(self) -> tuple[int, ...]:
        parts, node = [], self
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        return tuple(itertools.chain.from_iterable(reversed(parts)))


class NodeState(NamedTuple):
    path: tuple[int, ...]
    key_len: int
    full_value: tuple[int, ...]
    full_lock_ref: int
    swa_value: tuple[int, ...] | None  # None: tombstoned
    swa_lock_ref: int
    swa_uuid: int | None  # renumbered in path order (only equality with a request's uuid matters)
    last_access: int  # rank among the nodes' access times
    swa_lru: int | None  # rank in the SWA LRU list (0 least recent)
    mamba_value: tuple[int, ...] | None = None  # the Mamba state's slot; None: none (or no Mamba component)
    mamba_lock_ref: int = 0
    mamba_lru: int | None = None  # rank in the Mamba LRU list


class UnifiedTreeState(NamedTuple):
    nodes: tuple[NodeState, ...]  # sorted by path, the root not listed
    full_evictable_size: int
    full_protected_size: int
    swa_evictable_size: int
    swa_protected_size: int
    mamba_evictable_size: int = 0
    mamba_protected_size: int = 0


class SWAAllocatorState(NamedTuple):
    full_free: tuple[int, ...]
    swa_free: tuple[int, ...]
    full_to_swa: tuple[tuple[int, int], ...]  # (full slot, swa slot) for every mapped full slot, sorted


class SWATokenToKVPoolAllocator:
    """Page size 1; slot 0 of each pool reserved; free slots taken lowest first (free-list order not modelled)."""

    def __init__(self, size: int, size_swa: int) -> None:
        self.size, self.size_swa = size, size_swa
        self.full_free = set(range(1, size + 1))
        self.swa_free = set(range(1, size_swa + 1))
        self.full_to_swa: dict[int, int] = {}
        self.problems: list[str] = []

    def full_available_size(self) -> int:
        return len(self.full_free)

    def swa_available_size(self) -> int:
        return len(self.swa_free)

    def alloc(self, need_size: int) -> tuple[int, ...] | None:
        if need_size > len(self.full_free) or need_size > len(self.swa_free):
            return None
        full = sorted(self.full_free)[:need_size]
        swa = sorted(self.swa_free)[:need_size]
        self.full_free.difference_update(full)
        self.swa_free.difference_update(swa)
        self.full_to_swa.update(zip(full, swa))
        return tuple(full)

    def free(self, indices: Sequence[int]) -> None:
        self.free_full(indices)
        self.free_swa(indices)

    def free_full(self, indices: Sequence[int]) -> None:
        for i in indices:
            if i in self.full_free or not 1 <= i <= self.size:
                self.problems.append(f"full slot {i} freed while free or out of range")
            self.full_free.add(i)

    def free_swa(self, indices: Sequence[int]) -> None:
        for i in indices:
            j = self.full_to_swa.pop(i, 0)
            if j:
                if j in self.swa_free:
                    self.problems.append(f"swa slot {j} freed while free")
                self.swa_free.add(j)

    def remap(self, full: Sequence[int], incoming: Sequence[int]) -> None:
        """`full` takes the SWA slots `incoming` was allocated with; `incoming`'s Full slots are freed (Full only)."""
        for f, i in zip(full, incoming):
            self.full_to_swa[f] = self.full_to_swa.pop(i, 0)
        self.free_full(incoming)

    def translate_loc_from_full_to_swa(self, indices: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.full_to_swa.get(i, 0) for i in indices)

    def freeze(self) -> SWAAllocatorState:
        return SWAAllocatorState(tuple(sorted(self.full_free)), tuple(sorted(self.swa_free)),
                                 tuple(sorted(self.full_to_swa.items())))

    @classmethod
    def thaw(cls, s: SWAAllocatorState, size: int, size_swa: int) -> "SWATokenToKVPoolAllocator":
        a = cls(size, size_swa)
        a.full_free, a.swa_free, a.full_to_swa = set(s.full_free), set(s.swa_free), dict(s.full_to_swa)
        return a


class InsertResult(NamedTuple):
    prefix_len: int
    mamba_exist: bool = True  # the insert's last node had a Mamba state (the caller frees the one it offered)


class UnifiedRadixCache:
    def __init__(self, allocator: SWATokenToKVPoolAllocator, sliding_window_size: int,
                 variant: UnifiedSwaVariant = SWA_FIXED, mamba_allocator: MambaSlotAllocator | None = None) -> None:
        self.allocator, self.sliding_window_size, self.variant = allocator, sliding_window_size, variant
        # the Mamba component (tree_components FULL, SWA, MAMBA), with a Mamba pool; None: FULL and SWA only
        self.mamba = None if mamba_allocator is None else MambaComponent(self, mamba_allocator)
        self.clock = 0
        self.uuids = itertools.count(1)
        self.problems: list[str] = []
        self.root_node = UnifiedTreeNode(self.now())
        self.full_evictable_size_ = self.full_protected_size_ = 0
        self.swa_evictable_size_ = self.swa_protected_size_ = 0

    def now(self) -> int:
        self.clock += 1
        return self.clock

    # -- match ---------------------------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], UnifiedTreeNode]:
        key = tuple(tokens)
        node, value = self.root_node, []
        best, best_len = node, 0
        window = float("inf")  # the SWA validator's running length: SWA tokens since the last tombstone
        while key and key[0] in node.children:
            child = node.children[key[0]]
            prefix_len = _match_len(child.key, key)
            if prefix_len < len(child.key):
                child = self._split_node(child, prefix_len)
            value += child.full.value
            node = child
            if node.swa.value is None:
                window = 0
            else:
                window += len(node.key)
                if window >= self.sliding_window_size and (self.mamba is None or self.mamba.validator(node)):
                    best, best_len = node, len(value)
            key = key[prefix_len:]
        self._reset_node_and_window_ancestors_mru(best)
        if self.mamba is not None:
            self.mamba.refresh_match_end(best)
        t = self.now()
        n: UnifiedTreeNode | None = best
        while n is not None:
            n.last_access_time = t
            n = n.parent
        return tuple(value[:best_len]), best

    def _reset_node_and_window_ancestors_mru(self, node: UnifiedTreeNode) -> None:
        """The node and its ancestors within window + page_size tokens that hold SWA values become the most
        recent, the node the most recent of them."""
        marked, accumulated = [], 0
        while node is not self.root_node and accumulated < self.sliding_window_size + 1:
            if node.swa.value is not None:
                marked.append(node)
            accumulated += len(node.key)
            node = node.parent
        for n in reversed(marked):
            n.swa_lru_time = self.now()

    def _split_node(self, child: UnifiedTreeNode, split_len: int) -> UnifiedTreeNode:
        new = UnifiedTreeNode(self.now())
        new.parent, new.key = child.parent, child.key[:split_len]
        new.children = {child.key[split_len]: child}
        new.full = ComponentData(child.full.value[:split_len], child.full.lock_ref)
        child.full.value = child.full.value[split_len:]
        # SWAComponent.redistribute_on_node_split: the lock count copied, the value cut, the uuid to the parent
        sv = child.swa.value
        new.swa = ComponentData(None if sv is None else sv[:split_len], child.swa.lock_ref, child.swa.uuid)
        child.swa.value, child.swa.uuid = (None if sv is None else sv[split_len:]), None
        child.key = child.key[split_len:]
        new.parent.children[new.key[0]] = new
        child.parent = new
        if self.mamba is not None:
            self.mamba.split(new, child, self.variant.split_keeps_suffix_recency)
        if self.variant.split_keeps_suffix_recency:  # #38482: the child keeps its place, the prefix just older
            older = [n.swa_lru_time for n in self.all_nodes()
                     if n.swa_lru_time is not None and n.swa_lru_time < (child.swa_lru_time or 0)]
            new.swa_lru_time = None if new.swa.value is None else \
                (child.swa_lru_time + max(older, default=child.swa_lru_time - 1)) / 2
        else:  # the child leaves the SWA LRU list; the new node, then the child, enter it most recent
            new.swa_lru_time = None if new.swa.value is None else self.now()
            child.swa_lru_time = None if child.swa.value is None else self.now()
        child.last_access_time = self.now()
        return new

    def _maybe_split_leaf_for_swa_lock(self, leaf: UnifiedTreeNode) -> None:
        """Cap a fresh SWA leaf at one window, so that locking it pins one window of the SWA pool."""
        if leaf.swa.value is None or leaf.swa.lock_ref > 0 or len(leaf.key) <= self.sliding_window_size:
            return
        self._split_node(leaf, len(leaf.key) - self.sliding_window_size)

    # -- insert --------------------------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], value: Sequence[int], prev_prefix_len: int,
               mamba_value: tuple[int, ...] | None = None) -> InsertResult:
        """`mamba_value`: the Mamba state slot committed on the insert's last node (with a Mamba component)."""
        key, value = tuple(tokens), tuple(value[:len(tokens)])
        node = self.root_node
        t = self.now()
        node.last_access_time = t
        total = 0
        while key and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access_time = t
            if self.mamba is not None:
                self.mamba.touch(node)
            prefix_len = _match_len(node.key, key)
            if prefix_len < len(node.key):
                node = self._split_node(node, prefix_len)
            value_slice = value[:prefix_len]
            consumed_from = prefix_len
            if prev_prefix_len < total + prefix_len and node.swa.value is None:
                # update_component_on_insert_overlap, branch 1 (swa_evicted_seqlen 0): recover the tombstone
                if node.swa.lock_ref and not self.variant.swa_lock_covers_tombstones:
                    self.problems.append(f"tombstone {list(node.path())} has swa lock_ref {node.swa.lock_ref}")
                if node.full.lock_ref and self.variant.recovers_under_full_lock:
                    # _restore_device_value_with_locked_full: the locked Full slots stay and take the incoming SWA
                    # slots; the incoming Full slots are freed (Full only)
                    self.allocator.remap(node.full.value, value_slice)
                else:
                    self.allocator.free(node.full.value)
                    node.full.value = value_slice
                node.swa.value = self.allocator.translate_loc_from_full_to_swa(node.full.value)
                node.swa_lru_time = self.now()
                if node.swa.lock_ref:  # set_component_device_value: a value materialized under lock is protected
                    self.swa_protected_size_ += len(value_slice)
                else:
                    self.swa_evictable_size_ += len(value_slice)
                consumed_from = 0
            dup_start = max(0, prev_prefix_len - total)
            if dup_start < consumed_from:
                self.allocator.free(value_slice[dup_start:consumed_from])
            total += prefix_len
            key, value = key[prefix_len:], value[prefix_len:]
        if key:
            new = UnifiedTreeNode(self.now())
            new.parent, new.key = node, key
            new.full.value = value
            new.swa.value = self.allocator.translate_loc_from_full_to_swa(value)
            new.swa_lru_time = self.now()
            node.children[key[0]] = new
            self.full_evictable_size_ += len(key)
            self.swa_evictable_size_ += len(key)
            self._maybe_split_leaf_for_swa_lock(new)
            node = new
        self._reset_node_and_window_ancestors_mru(node)
        if self.mamba is None or node is self.root_node:
            return InsertResult(total)
        if mamba_value is None:
            self.problems.append(f"insert of {list(tokens)} without a mamba value (assert)")
            return InsertResult(total)
        return InsertResult(total, self.mamba.commit_insert(node, mamba_value))

    # -- locks ---------------------------------------------------------------------------------------------------
    def inc_lock_ref(self, node: UnifiedTreeNode) -> int | None:
        cur = node
        while cur is not self.root_node:  # FullComponent.acquire_component_lock
            if cur.full.lock_ref == 0:
                self.full_evictable_size_ -= len(cur.key)
                self.full_protected_size_ += len(cur.key)
            cur.full.lock_ref += 1
            cur = cur.parent
        cur, locked, swa_uuid = node, 0, None  # SWAComponent.acquire_component_lock
        segment = self.variant.swa_lock_covers_tombstones
        while cur is not self.root_node and locked < self.sliding_window_size:
            cd = cur.swa
            if cd.value is None and not segment:
                cur = cur.parent
                continue
            if cd.lock_ref == 0 and cd.value is not None:
                self.swa_evictable_size_ -= len(cur.key)
                self.swa_protected_size_ += len(cur.key)
            cd.lock_ref += 1
            locked += len(cur.key)
            if locked >= self.sliding_window_size:
                if cd.uuid is None:
                    cd.uuid = next(self.uuids)
                swa_uuid = cd.uuid
            cur = cur.parent
        if self.mamba is not None:  # MambaComponent.acquire_component_lock: the node only
            self.mamba.acquire(node)
        return swa_uuid

    def dec_lock_ref(self, node: UnifiedTreeNode, swa_uuid_for_lock: int | None, skip_swa: bool = False) -> None:
        """`skip_swa` after the early release: before 0.5.20 the Mamba lock it dropped is released again (a
        release at lock_ref 0 does nothing); 0.5.20's TreeCore skips SWA and below (`skip_swa_and_below`)."""
        cur = node
        while cur is not self.root_node:  # FullComponent.release_component_lock
            if cur.full.lock_ref == 1:
                self.full_evictable_size_ += len(cur.key)
                self.full_protected_size_ -= len(cur.key)
            cur.full.lock_ref -= 1
            if cur.full.lock_ref < 0:
                self.problems.append(f"node {list(cur.path())}: full lock_ref went to {cur.full.lock_ref}")
            cur = cur.parent
        if not skip_swa:
            self._release_swa_lock(node, swa_uuid_for_lock)
        if self.mamba is not None and not (skip_swa and self.variant.mamba_lock_receipt):
            self.mamba.release(node, asserts=self.variant.mamba_lock_receipt)

    def _release_swa_lock(self, node: UnifiedTreeNode, swa_uuid_for_lock: int | None) -> None:
        cur = node  # SWAComponent.release_component_lock
        while cur is not self.root_node:
            cd = cur.swa
            if cd.lock_ref == 0:
                if self.variant.swa_lock_covers_tombstones:  # every segment node was counted: assert ref > 0
                    self.problems.append(f"node {list(cur.path())}: swa segment release at lock_ref 0")
                    return
                cur = cur.parent
                continue
            if cd.lock_ref == 1 and cd.value is not None:
                self.swa_evictable_size_ += len(cd.value)
                self.swa_protected_size_ -= len(cd.value)
            cd.lock_ref -= 1
            if swa_uuid_for_lock and cd.uuid == swa_uuid_for_lock:
                break
            cur = cur.parent

    def dec_swa_lock_only(self, node: UnifiedTreeNode, swa_uuid_for_lock: int | None) -> None:
        """`UnifiedRadixCache.dec_swa_lock_only` -> `SWAComponent.release_window_lock` (new in 0.5.14)."""
        cur = node
        segment = self.variant.swa_lock_covers_tombstones
        while cur is not self.root_node:
            cd = cur.swa
            if segment and cd.lock_ref == 0:  # release_window_lock asserts lock_ref > 0
                self.problems.append(f"node {list(cur.path())}: swa window release at lock_ref 0")
                return
            if not segment and (cd.value is None or cd.lock_ref == 0):
                if swa_uuid_for_lock and cd.uuid == swa_uuid_for_lock:
                    break
                cur = cur.parent
                continue
            cd.lock_ref -= 1
            if cd.lock_ref == 0 and cd.value is not None:
                self.swa_protected_size_ -= len(cur.key)
                self.swa_evictable_size_ += len(cur.key)
                if self._is_device_leaf(cur):
                    self._evict_swa_component(cur)
            if swa_uuid_for_lock and cd.uuid == swa_uuid_for_lock:
                break
            cur = cur.parent
        # #28161's second layer: drop the locks of strictly lower internal priority than SWA's on the node (Mamba)
        if self.mamba is not None:
            self.mamba.release(node, asserts=self.variant.mamba_lock_receipt)

    # -- eviction ------------------------------------------------------------------------------------------------
    def _is_device_leaf(self, node: UnifiedTreeNode) -> bool:
        if node is self.root_node or node.full.lock_ref > 0 or node.swa.lock_ref > 0 or node.mamba.lock_ref > 0:
            return False
        return not node.children

    def evictable_device_leaves(self) -> list[UnifiedTreeNode]:
        return [n for n in self.all_nodes() if self._is_device_leaf(n)]

    def evict(self, num_tokens: int = 0, swa_num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, ...]:
        """The tokens (Full, SWA) freed, and with a Mamba component the Mamba states freed too."""
        tracker = {"full": 0, "swa": 0, "mamba": 0}
        heap = [(n.last_access_time, n.path(), n) for n in self.evictable_device_leaves()]  # FullComponent
        heapq.heapify(heap)
        while tracker["full"] < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if not self._is_device_leaf(x) or x.parent is None:
                continue
            parent = x.parent
            self._evict_device_leaf(x, tracker)
            if self._is_device_leaf(parent):
                heapq.heappush(heap, (parent.last_access_time, parent.path(), parent))
        while tracker["swa"] < swa_num_tokens:  # SWAComponent.drive_eviction
            x = self._swa_lru_no_lock()
            if x is None:
                break
            if self._is_device_leaf(x):
                self._evict_device_leaf(x, tracker)
            else:  # tombstone; `_cascade_evict` from an SWA trigger reaches no Full value (internal priority 2 > 1)
                tracker["swa"] += self._evict_swa_component(x)
                self._cascade_evict(x, tracker)
        if self.mamba is None:
            return tracker["full"], tracker["swa"]
        self.mamba.drive_eviction(mamba_num, tracker)
        return tracker["full"], tracker["swa"], tracker["mamba"]

    def _cascade_evict(self, node: UnifiedTreeNode, tracker: dict[str, int]) -> None:
        """`_cascade_evict` from an SWA tombstone on a node that is not a device leaf: into the components of lower
        internal priority (Mamba's state, asserted unlocked: `evict_component` records it). 0.5.14's sparing of a
        locked component whose internal priority is at least the trigger's (#28161) acts only when the node is a
        device leaf at the cascade, which an SWA or Mamba trigger never reaches without HiCache (their drives take
        a device leaf whole first), so it is not stated."""
        if self.mamba is not None:
            tracker["mamba"] += self.mamba.evict_component(node)

    def _swa_lru_no_lock(self) -> UnifiedTreeNode | None:
        """The least recent node of the SWA LRU list whose SWA lock is 0 (`get_lru_no_lock`)."""
        listed = [n for n in self.all_nodes() if n.swa_lru_time is not None and n.swa.lock_ref == 0]
        return min(listed, key=lambda n: n.swa_lru_time, default=None)

    def _evict_swa_component(self, node: UnifiedTreeNode) -> int:
        """`SWAComponent.evict_component` and the LRU detach: tombstone the node's SWA value."""
        cd = node.swa
        if cd.value is None:
            return 0
        if cd.lock_ref:
            self.problems.append(f"tombstoned node {list(node.path())}: swa lock_ref {cd.lock_ref}")
        self.allocator.free_swa(node.full.value)
        freed = len(cd.value)
        self.swa_evictable_size_ -= freed
        cd.value, node.swa_lru_time = None, None
        return freed

    def _evict_device_leaf(self, node: UnifiedTreeNode, tracker: dict[str, int]) -> None:
        if node.full.lock_ref or node.swa.lock_ref or node.mamba.lock_ref or node.children:
            self.problems.append(f"evicted node {list(node.path())}: full lock_ref {node.full.lock_ref}, swa "
                                 f"lock_ref {node.swa.lock_ref}, mamba lock_ref {node.mamba.lock_ref}, "
                                 f"{len(node.children)} children")
        self.allocator.free_full(node.full.value)
        tracker["full"] += len(node.full.value)
        self.full_evictable_size_ -= len(node.full.value)
        tracker["swa"] += self._evict_swa_component(node)
        if self.mamba is not None:
            tracker["mamba"] += self.mamba.evict_component(node)
        del node.parent.children[node.key[0]]

    # -- reading -------------------------------------------------------------------------------------------------
    def all_nodes(self) -> list[UnifiedTreeNode]:
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children[k] for k in sorted(node.children))
        return out[1:]

    def node_at(self, path: Sequence[int]) -> UnifiedTreeNode:
        node, rest = self.root_node, tuple(path)
        while rest:
            node = node.children[rest[0]]
            rest = rest[len(node.key):]
        return node

    def path_device_indices(self, node: UnifiedTreeNode) -> tuple[int, ...]:
        values = []
        while node is not self.root_node:
            values.append(node.full.value)
            node = node.parent
        return tuple(itertools.chain.from_iterable(reversed(values)))

    def freeze(self, uuids: dict[int, int]) -> UnifiedTreeState:
        """The value form; `uuids` is filled with the renumbering of the live uuids (old -> new), for the
        requests' `swa_uuid_for_lock` to follow."""
        nodes = sorted(self.all_nodes(), key=lambda n: n.path())
        access = {t: i for i, t in enumerate(sorted({n.last_access_time for n in nodes}))}
        lru = {t: i for i, t in enumerate(sorted(n.swa_lru_time for n in nodes if n.swa_lru_time is not None))}
        mamba_lru = {t: i for i, t in enumerate(sorted(n.mamba_lru_time for n in nodes
                                                        if n.mamba_lru_time is not None))}
        for n in nodes:
            if n.swa.uuid is not None:
                uuids.setdefault(n.swa.uuid, len(uuids) + 1)
        return UnifiedTreeState(tuple(NodeState(
            n.path(), len(n.key), n.full.value, n.full.lock_ref, n.swa.value, n.swa.lock_ref,
            None if n.swa.uuid is None else uuids[n.swa.uuid], access[n.last_access_time],
            None if n.swa_lru_time is None else lru[n.swa_lru_time], n.mamba.value, n.mamba.lock_ref,
            None if n.mamba_lru_time is None else mamba_lru[n.mamba_lru_time]) for n in nodes),
            self.full_evictable_size_, self.full_protected_size_, self.swa_evictable_size_,
            self.swa_protected_size_, *((0, 0) if self.mamba is None else
                                        (self.mamba.evictable_size_, self.mamba.protected_size_)))

    @classmethod
    def thaw(cls, s: UnifiedTreeState, allocator: SWATokenToKVPoolAllocator, sliding_window_size: int,
             variant: UnifiedSwaVariant = SWA_FIXED,
             mamba_allocator: MambaSlotAllocator | None = None) -> "UnifiedRadixCache":
        tree = cls(allocator, sliding_window_size, variant, mamba_allocator)
        by_path = {(): tree.root_node}
        for ns in s.nodes:
            node = UnifiedTreeNode(ns.last_access)
            node.key = ns.path[len(ns.path) - ns.key_len:]
            node.full = ComponentData(ns.full_value, ns.full_lock_ref)
            node.swa = ComponentData(ns.swa_value, ns.swa_lock_ref, ns.swa_uuid)
            node.swa_lru_time = ns.swa_lru
            node.mamba = ComponentData(ns.mamba_value, ns.mamba_lock_ref)
            node.mamba_lru_time = ns.mamba_lru
            node.parent = by_path[ns.path[:len(ns.path) - ns.key_len]]
            node.parent.children[node.key[0]] = node
            by_path[ns.path] = node
        tree.root_node.last_access_time = -1
        tree.clock = len(s.nodes) + 1
        tree.uuids = itertools.count(1 + max((ns.swa_uuid or 0 for ns in s.nodes), default=0))
        tree.full_evictable_size_, tree.full_protected_size_ = s.full_evictable_size, s.full_protected_size
        tree.swa_evictable_size_, tree.swa_protected_size_ = s.swa_evictable_size, s.swa_protected_size
        if tree.mamba is not None:
            tree.mamba.evictable_size_, tree.mamba.protected_size_ = s.mamba_evictable_size, s.mamba_protected_size
        return tree


def _match_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
