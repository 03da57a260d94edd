"""The unified radix cache's third component, Mamba (SGLang 0.5.15's `unified_cache_components/mamba_component.py`,
0.5.20 on `unified_cache/components/mamba.py`), and the Mamba state pool's slot allocator (`HybridReqToTokenPool`'s
`MambaSlotAllocator`, `mem_cache/memory_pool.py`), without the extra (ping-pong) buffer, so at page size 1.

A node holds at most one Mamba state slot (`node.mamba.value`, a one-slot tuple), the state after its last token;
a split leaves it on the suffix (`redistribute_on_node_split`). The component's lock is on the locked node only,
not its path (`acquire_component_lock`; 0.5.15 skips a node without a state, 0.5.20 counts it: the model's locks
always land on a node with a state, where the two agree). Its internal
eviction priority is the lowest (Full 2 > SWA 1 > Mamba 0): evicting its state cascades into nothing, while an SWA
tombstone cascades into the node's Mamba state (`_cascade_evict`, which asserts the state unlocked). A request owns
one slot of the pool while it runs (`req.mamba_pool_idx`); caching an unfinished request donates a fresh slot to
the tree (`prepare_for_caching_req`), a finished one hands its own over, and either is freed when the node already
has a state (`mamba_exist`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .unified_swa import UnifiedRadixCache, UnifiedTreeNode


class MambaSlotAllocator:
    """Slots 1..size (slot 0 reserved), taken lowest first (the free order is not modelled)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free_slots = set(range(1, size + 1))
        self.problems: list[str] = []

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> tuple[int, ...] | None:
        if need_size > len(self.free_slots):
            return None
        out = tuple(sorted(self.free_slots)[:need_size])
        self.free_slots.difference_update(out)
        return out

    def free(self, indices: Sequence[int]) -> None:
        for i in indices:
            if i in self.free_slots or not 1 <= i <= self.size:
                self.problems.append(f"mamba slot {i} freed while free or out of range")
            self.free_slots.add(i)

    def freeze(self) -> tuple[int, ...]:
        return tuple(sorted(self.free_slots))

    @classmethod
    def thaw(cls, free: Sequence[int], size: int) -> "MambaSlotAllocator":
        a = cls(size)
        a.free_slots = set(free)
        return a


class MambaComponent:
    """The component's hooks, called by the tree where upstream's `UnifiedRadixCache` calls them; the sizes are
    the tree's `component_evictable_size_` / `component_protected_size_` for Mamba (slots, not tokens)."""

    def __init__(self, tree: "UnifiedRadixCache", allocator: MambaSlotAllocator) -> None:
        self.tree, self.allocator = tree, allocator
        self.evictable_size_ = self.protected_size_ = 0

    # -- match and insert ----------------------------------------------------------------------------------------
    @staticmethod
    def validator(node: "UnifiedTreeNode") -> bool:
        """`create_match_validator(match_device_only=True)`: a match may end only at a node with a state."""
        return node.mamba.value is not None

    def refresh_match_end(self, node: "UnifiedTreeNode") -> None:
        """`reset_node_and_parents_mru`: the matched node and its ancestors with a state become the most recent,
        the node the most recent of them."""
        marked = []
        while node is not self.tree.root_node:
            if node.mamba.value is not None:
                marked.append(node)
            node = node.parent
        for n in reversed(marked):
            n.mamba_lru_time = self.tree.now()

    def touch(self, node: "UnifiedTreeNode") -> None:
        """`refresh_lru(WALKDOWN)`: a node an insert walks through, with a state, becomes the most recent."""
        if node.mamba.value is not None:
            node.mamba_lru_time = self.tree.now()

    def commit_insert(self, node: "UnifiedTreeNode", mamba_value: tuple[int, ...]) -> bool:
        """`commit_insert_component_data` on the insert's last node; whether a state was there (`mamba_exist`)."""
        cd = node.mamba
        if cd.value is not None:
            node.mamba_lru_time = self.tree.now()
            return True
        cd.value = tuple(mamba_value)
        node.mamba_lru_time = self.tree.now()
        self.evictable_size_ += len(cd.value)
        return False

    def split(self, new_parent: "UnifiedTreeNode", child: "UnifiedTreeNode", keeps_recency: bool) -> None:
        """`redistribute_on_node_split`: the state and its lock stay on the child; the child re-enters the LRU
        list most recent (0.5.15) or keeps its place (0.5.20, #38482)."""
        new_parent.mamba.value, new_parent.mamba.lock_ref, new_parent.mamba_lru_time = None, 0, None
        if child.mamba.value is not None and not keeps_recency:
            child.mamba_lru_time = self.tree.now()

    # -- locks ---------------------------------------------------------------------------------------------------
    def acquire(self, node: "UnifiedTreeNode") -> None:
        cd = node.mamba
        if node is self.tree.root_node or cd.value is None:  # a tombstone: in the receipt's skip_lock_node_ids
            return
        if cd.lock_ref == 0:
            self.evictable_size_ -= len(cd.value)
            self.protected_size_ += len(cd.value)
        cd.lock_ref += 1

    def release(self, node: "UnifiedTreeNode", asserts: bool) -> None:
        """`release_component_lock`: before 0.5.20 a release at lock_ref 0 does nothing; from 0.5.20 (`asserts`)
        it is an assertion failure."""
        cd = node.mamba
        if node is self.tree.root_node:
            return
        if cd.lock_ref == 0:
            if asserts:
                self.tree.problems.append(f"node {list(node.path())}: mamba release at lock_ref 0 (assert)")
            return
        if cd.lock_ref == 1 and cd.value is not None:
            self.evictable_size_ += len(cd.value)
            self.protected_size_ -= len(cd.value)
        cd.lock_ref -= 1

    # -- eviction ------------------------------------------------------------------------------------------------
    def evict_component(self, node: "UnifiedTreeNode") -> int:
        """`evict_component` and the LRU detach: free the node's state slot."""
        cd = node.mamba
        if cd.value is None:
            return 0
        if cd.lock_ref:
            self.tree.problems.append(f"evicted the mamba state of node {list(node.path())}: mamba lock_ref "
                                      f"{cd.lock_ref}")
        self.allocator.free(cd.value)
        freed = len(cd.value)
        self.evictable_size_ -= freed
        cd.value, node.mamba_lru_time = None, None
        return freed

    def drive_eviction(self, mamba_num: int, tracker: dict[str, int]) -> None:
        """`MambaComponent.drive_eviction`: the least recent unlocked state; a device leaf goes whole, another
        node loses its state only (no component of lower internal priority to cascade into)."""
        while tracker["mamba"] < mamba_num:
            listed = [n for n in self.tree.all_nodes() if n.mamba_lru_time is not None and n.mamba.lock_ref == 0]
            x = min(listed, key=lambda n: n.mamba_lru_time, default=None)
            if x is None:
                break
            if self.tree._is_device_leaf(x):
                self.tree._evict_device_leaf(x, tracker)
            else:
                tracker["mamba"] += self.evict_component(x)
