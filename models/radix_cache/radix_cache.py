"""SGLang's radix tree of cached KV (`sglang/srt/mem_cache/radix_cache.py`, `RadixCache`, 0.5.23), LRU eviction.

Keys are token tuples cut to whole pages (`page_aligned`: upstream's `RadixKey.page_aligned`); a node's children
are keyed by their first page of tokens (`child_key`: the token itself at page size 1). A node's `value` is the
slots of its tokens, one per token. The root holds nothing and is locked once, so it is never evicted.

* `match_prefix(tokens) -> (prefix_len, indices, last_node)`: the longest cached page-aligned prefix; a match
  ending inside a node splits it (`_split_node`: the new node takes the first part and the child's lock count).
  Every node on the path gets this call's access time.
* `insert(tokens, indices) -> (prefix_len, last_node)`: prefix_len is how much of the page-aligned key was
  there already (the caller frees its own slots for that range); the rest becomes one new leaf.
* `inc_lock_ref(node)` / `dec_lock_ref(node)`: up the path to the root, a node moving its key length from
  `evictable_size` to `protected_size` when its count leaves 0, and back when it returns to 0.
* `evict(num_tokens) -> evicted`: unlocked leaves, least recently accessed first (upstream's heap over
  `LRUStrategy.get_priority`, `last_access_time`), until `num_tokens` are freed; each leaf's slots go back to the
  allocator (`free_segment(value, 0)`); a parent left childless and unlocked joins the heap.

Time is a logical clock: every match/insert reads it once for its path (upstream's one `time.monotonic()` per
call), every new node once more when made (upstream's `TreeNode.__init__`). Upstream's times are distinct in
practice; here they are by construction, so no two leaves tie and the eviction order is deterministic.
The LRU strategy is upstream's default (`--radix-eviction-policy lru`); hit counts and priorities, which only the
LFU and priority strategies read, are not modelled.

`freeze` gives the value form: the nodes by their full token path, with ranks in place of times (only their
order matters), so equal trees reached by different histories are one state.
"""

from __future__ import annotations

import heapq
from itertools import chain
from typing import NamedTuple, Sequence

from .allocator import PagedTokenToKVPoolAllocator
from .memory_pool import ReqToTokenPool


class NodeState(NamedTuple):
    path: tuple[int, ...]  # the tokens from the root to the node's end
    key_len: int  # the node's own tokens: path[-key_len:]
    value: tuple[int, ...]  # one slot per own token
    lock_ref: int
    last_access: int  # rank among the nodes' access times (0 oldest)


class TreeState(NamedTuple):
    nodes: tuple[NodeState, ...]  # sorted by path; the root ((), 0, ()) not listed
    evictable_size: int
    protected_size: int


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time", "full_path")

    def __init__(self, time: int) -> None:
        self.children: dict = {}
        self.parent: TreeNode | None = None
        self.key: tuple[int, ...] = ()
        self.value: tuple[int, ...] = ()
        self.lock_ref = 0
        self.last_access_time = time
        # the tokens from the root to its end, once `freeze` or `thaw` has them: they never change (a split moves
        # the first part of a node's key into a new parent), so every frozen tree holds this one tuple for them
        self.full_path: tuple[int, ...] | None = None

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access_time < other.last_access_time

    def path(self) -> tuple[int, ...]:
        parts = []
        node = self
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        return tuple(chain.from_iterable(reversed(parts)))


def _key(node: TreeNode) -> tuple[int, ...]:
    return node.key


def _full_path(node: TreeNode, parent_path: tuple[int, ...]) -> tuple[int, ...]:
    node.full_path = path = parent_path + node.key
    return path


def page_aligned(tokens: Sequence[int], page_size: int) -> tuple[int, ...]:
    return tuple(tokens[:len(tokens) // page_size * page_size])


class RadixCache:
    def __init__(self, allocator: PagedTokenToKVPoolAllocator | None, page_size: int) -> None:
        self.allocator, self.page_size = allocator, page_size
        self.req_to_token_pool: ReqToTokenPool | None = None  # the request pool, set by the system that has one
        self.clock = 0
        self.problems: list[str] = []  # what an op found wrong (the step checks read it)
        self.reset()

    def now(self) -> int:
        self.clock += 1
        return self.clock

    def reset(self) -> None:
        self.root_node = TreeNode(self.now())
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves: dict[TreeNode, None] = {}  # an ordered set: iteration order is insertion order

    def child_key(self, key: Sequence[int]):
        return key[0] if self.page_size == 1 else tuple(key[:self.page_size])

    def key_match(self, a: Sequence[int], b: Sequence[int]) -> int:
        """`RadixKey.match`: the common prefix length, rounded down to whole pages."""
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n // self.page_size * self.page_size

    # -- the public ops -----------------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[int, tuple[int, ...], TreeNode]:
        key = page_aligned(tokens, self.page_size)
        if not key:
            return 0, (), self.root_node
        value, last = self._match_prefix_helper(self.root_node, key)
        return len(value), value, last

    def insert(self, tokens: Sequence[int], indices: Sequence[int]) -> tuple[int, TreeNode]:
        key = page_aligned(tokens, self.page_size)
        return self._insert_helper(self.root_node, key, tuple(indices[:len(key)]))

    def inc_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            if node.lock_ref < 0:
                self.problems.append(f"node {list(node.path())}: lock_ref went to {node.lock_ref}")
            self._update_leaf_status(node)
            node = node.parent
        return delta

    def evict(self, num_tokens: int) -> int:
        heap = [(node.last_access_time, node) for node in self.evictable_leaves]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if x.lock_ref > 0 or x.children:
                self.problems.append(f"evicted node {list(x.path())}: lock_ref {x.lock_ref}, "
                                     f"{len(x.children)} children")
            if self.allocator is not None:
                self.allocator.free_segment(x.value, 0)
            num_evicted += len(x.value)
            self._delete_leaf(x)
            if not x.parent.children and x.parent.lock_ref == 0:
                heapq.heappush(heap, (x.parent.last_access_time, x.parent))
        return num_evicted

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def path_device_indices(self, node: TreeNode) -> tuple[int, ...]:
        values = []
        while node is not self.root_node:
            values.append(node.value)
            node = node.parent
        return tuple(chain.from_iterable(reversed(values)))

    def node_at(self, path: Sequence[int]) -> TreeNode:
        """The node whose full token path is `path` (the root for ())."""
        node, rest = self.root_node, tuple(path)
        while rest:
            node = node.children[self.child_key(rest)]
            rest = rest[len(node.key):]
        return node

    def all_nodes(self) -> list[TreeNode]:
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out[1:]

    # -- helpers, as upstream's ---------------------------------------------------------------------------------
    def _match_prefix_helper(self, node: TreeNode, key: tuple[int, ...]):
        access_time = self.now()
        node.last_access_time = access_time
        value: list[int] = []
        while key and self.child_key(key) in node.children:
            child = node.children[self.child_key(key)]
            child.last_access_time = access_time
            prefix_len = self.key_match(child.key, key)
            if prefix_len < len(child.key):
                new_node = self._split_node(child, prefix_len)
                value += new_node.value
                node = new_node
                break
            value += child.value
            node = child
            key = key[prefix_len:]
        return tuple(value), node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        new_node = TreeNode(self.now())
        new_node.children = {self.child_key(child.key[split_len:]): child}
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.key, new_node.value = child.key[:split_len], child.value[:split_len]
        child.parent = new_node
        child.key, child.value = child.key[split_len:], child.value[split_len:]
        new_node.parent.children[self.child_key(new_node.key)] = new_node
        return new_node

    def _insert_helper(self, node: TreeNode, key: tuple[int, ...], value: tuple[int, ...]):
        access_time = self.now()
        node.last_access_time = access_time
        if not key:
            return 0, node
        total_prefix_length = 0
        while key and self.child_key(key) in node.children:
            node = node.children[self.child_key(key)]
            node.last_access_time = access_time
            prefix_len = self.key_match(node.key, key)
            total_prefix_length += prefix_len
            key, value = key[prefix_len:], value[prefix_len:]
            if prefix_len < len(node.key):
                node = self._split_node(node, prefix_len)
        if key:
            new_node = TreeNode(self.now())
            new_node.parent, new_node.key, new_node.value = node, key, value
            node.children[self.child_key(key)] = new_node
            self.evictable_size_ += len(key)
            self._update_leaf_status(node)
            self._update_leaf_status(new_node)
            node = new_node
        return total_prefix_length, node

    def _delete_leaf(self, node: TreeNode) -> None:
        del node.parent.children[self.child_key(node.key)]
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.pop(node, None)
        self._update_leaf_status(node.parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.pop(node, None)
            return
        self.evictable_leaves.setdefault(node, None)

    # -- value form ---------------------------------------------------------------------------------------------
    def freeze(self) -> TreeState:
        """The value form: its nodes in the order of their paths, as a walk from the root gives them with each node's
        children in the order of their keys (siblings' keys differ in their first page, so a subtree's paths all
        sort between its siblings'), each path its parent's and its own key, not a walk up per node and a sort of
        paths that share their first hundreds of tokens."""
        walked: list[tuple[tuple[int, ...], TreeNode]] = []
        stack = [((), self.root_node)]
        while stack:
            path, node = stack.pop()
            if node is not self.root_node:
                walked.append((path, node))
            if node.children:  # the least key on top, taken first
                stack.extend((c.full_path or _full_path(c, path), c)
                             for c in sorted(node.children.values(), key=_key, reverse=True))
        order = {t: i for i, t in enumerate(sorted({n.last_access_time for _, n in walked}))}
        return TreeState(tuple(NodeState(path, len(n.key), n.value, n.lock_ref, order[n.last_access_time])
                               for path, n in walked), self.evictable_size_, self.protected_size_)

    @classmethod
    def thaw(cls, s: TreeState, allocator: PagedTokenToKVPoolAllocator | None, page_size: int) -> "RadixCache":
        """The live tree of `s`; its clock runs past every rank, so every later time is newer than all of them."""
        tree = cls(allocator, page_size)
        by_path = {(): tree.root_node}
        for ns in s.nodes:  # sorted by path: a parent before its children
            node = TreeNode(ns.last_access)
            node.key, node.value, node.lock_ref = ns.path[len(ns.path) - ns.key_len:], ns.value, ns.lock_ref
            node.full_path = ns.path
            node.parent = by_path[ns.path[:len(ns.path) - ns.key_len]]
            node.parent.children[tree.child_key(node.key)] = node
            by_path[ns.path] = node
        tree.root_node.last_access_time = -1
        tree.clock = len(s.nodes) + 1
        tree.evictable_size_, tree.protected_size_ = s.evictable_size, s.protected_size
        for node in tree.all_nodes():
            tree._update_leaf_status(node)
        return tree
