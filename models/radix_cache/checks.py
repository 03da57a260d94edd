"""The radix cache's and the allocator's invariants as checks returning None when they hold, else a message.

They read the value forms (`TreeState`, `AllocatorState`, the requests' rows and locks); many follow
`SchedulerInvariantChecker` (`managers/scheduler_components/invariant_checker.py`): the pool's tokens are free,
evictable, protected or held by a running request, each once.
"""

from __future__ import annotations

from collections import Counter
from collections import _count_elements as count  # the C loop of `Counter.update`
from itertools import chain, repeat
from operator import mod, sub
from typing import Callable, Sequence

from .allocator import AllocatorState
from .radix_cache import NodeState, TreeState


def tree_pages(tree: TreeState, page_size: int) -> list[int]:
    if page_size == 1:  # a slot is its page
        return list(chain.from_iterable(n.value for n in tree.nodes))
    return [i // page_size for n in tree.nodes for i in n.value[::page_size]]


def pool_accounting(tree: TreeState, alloc: AllocatorState, held: Sequence[Sequence[int]], num_pages: int,
                    page_size: int) -> str | None:
    """free + evictable + protected + held by running requests (their rows past the tree's part) = the pool,
    page by page: every page 1..num_pages in exactly one of them, page 0 in none."""
    listed = [*alloc.free_pages, *alloc.staged_pages, *tree_pages(tree, page_size), *chain.from_iterable(held)]
    sizes = (len(alloc.free_pages) + len(alloc.staged_pages)) * page_size + tree.evictable_size + \
        tree.protected_size + sum(len(pages) for pages in held) * page_size
    # each page 1..num_pages once, as the pages sorted show in C (the free list's runs sort at once)
    if sizes == num_pages * page_size and sorted(listed) == list(range(1, num_pages + 1)):
        return None
    owners: Counter = Counter()
    count(owners, listed)  # in the order listed (the message lists pages in it)
    wrong = {p: c for p, c in owners.items() if c != 1 or not 1 <= p <= num_pages}
    missing = [p for p in range(1, num_pages + 1) if p not in owners]
    if wrong or missing or sizes != num_pages * page_size:
        return f"pages owned more than once or out of range {wrong}, owned by none {missing}; free + evictable " \
               f"+ protected + held = {sizes} tokens, expected the pool's {num_pages * page_size}"
    return None


def lock_refs(tree: TreeState, locks: Sequence[tuple[int, ...]]) -> str | None:
    """A node's lock count is the number of requests whose locked node is it or below (never negative);
    protected_size is the tokens of the locked nodes, evictable_size those of the others."""
    held = Counter(locks)  # equal locks (requests of one prompt at one node) compared once
    protected = evictable = 0
    for n in tree.nodes:
        path, size = n.path, len(n.path)
        # a lock is at or below n where it starts with n's path: its token at n's last position first (one
        # lookup, where most locks differ), the whole prefix only then
        want = sum(c for lock, c in held.items() if len(lock) >= size and (not size or lock[size - 1] == path[-1])
                   and lock[:size] == path)
        if n.lock_ref != want:
            return f"node {list(n.path)}: expected lock_ref {want} (requests locking it or below), got {n.lock_ref}"
        if n.lock_ref:
            protected += n.key_len
        else:
            evictable += n.key_len
    if (protected, evictable) != (tree.protected_size, tree.evictable_size):
        return f"expected protected_size {protected} and evictable_size {evictable} (the tree's nodes), got " \
               f"{tree.protected_size} and {tree.evictable_size}"
    return None


def tree_shape(tree: TreeState, page_size: int, aligned: Callable[[Sequence[int]], str | None] | None = None) \
        -> str | None:
    """Every node holds whole pages, one slot per token, each page's slots contiguous from its start; its
    parent is a node; no two children of a node start with the same page. `aligned`: `page_aligned_slots` of a
    node's slots from position 0 (an `AlignedRows`, which answers again for the slots it checked)."""
    aligned = aligned or (lambda row: page_aligned_slots(row, 0, page_size))
    paths = {n.path for n in tree.nodes} | {()}
    starts: Counter = Counter()
    for n in tree.nodes:
        if n.key_len <= 0 or n.key_len % page_size or len(n.value) != n.key_len:
            return f"node {list(n.path)}: expected a key of whole pages with one slot a token, got " \
                   f"{n.key_len} tokens and {len(n.value)} slots"
        parent = n.path[:len(n.path) - n.key_len]
        if parent not in paths:
            return f"node {list(n.path)}: its parent {list(parent)} is not in the tree"
        starts[parent + n.path[len(parent):len(parent) + page_size]] += 1
        problem = aligned(n.value)
        if problem is not None:
            return f"node {list(n.path)}: {problem}"
    dup = [list(k) for k, c in starts.items() if c > 1]
    return f"two children start with the same page: {dup}" if dup else None


def page_aligned_slots(row: Sequence[int], start: int, page_size: int) -> str | None:
    """Position `start + i` sits at offset `(start + i) % page_size` of its page, and a page's positions share
    one page."""
    if page_size == 1:  # every slot sits at offset 0 of a page of its own
        return None
    # the whole row at once, in C: every slot one past the slot before but at a page's first position, and the
    # first slot and every page's first one at their offsets (the walk below names the first position that is not)
    n, first = len(row), (-start) % page_size  # the first position on a page's first offset
    steps = list(map(sub, row[1:], row[:-1]))  # steps[i - 1]: slot i - slot i - 1
    starts = range((first or page_size) - 1, n - 1, page_size)  # (a page's first position may step anywhere)
    steps[starts.start:starts.stop:page_size] = [1] * len(starts)
    if not n or (row[0] % page_size == start % page_size and steps.count(1) == n - 1 and
                 not any(map(mod, row[first::page_size], repeat(page_size)))):
        return None
    for i, slot in enumerate(row):
        offset = (start + i) % page_size
        if slot % page_size != offset or (offset and i and slot != row[i - 1] + 1):
            return f"position {start + i} at slot {slot}: expected offset {offset} of a page, after the slot of " \
                   f"the position before on the same page (page_size {page_size}), row {list(row)}"
    return None


class AlignedRows:
    """`page_aligned_slots(row, 0, page_size)`, kept for the rows it found aligned lately, by identity: a state's
    rows and node slots are mostly the very tuples of the state before (a step changes a request's row or a node
    or two), so each is checked once, not once a state. It holds the rows it vouches for (an id is not reused
    while its object lives), at most `capacity` of them; anything but a tuple is checked every time."""

    __slots__ = ("page_size", "capacity", "ok")

    def __init__(self, page_size: int, capacity: int = 1024) -> None:
        self.page_size, self.capacity = page_size, capacity
        self.ok: dict[int, tuple[int, ...]] = {}

    def __call__(self, row: Sequence[int]) -> str | None:
        if self.ok.get(id(row)) is row:
            return None
        problem = page_aligned_slots(row, 0, self.page_size)
        if problem is None and type(row) is tuple:
            if len(self.ok) >= self.capacity:
                self.ok.clear()
            self.ok[id(row)] = row
        return problem

    def __reduce__(self) -> tuple:  # a copy (a worker's system) starts empty: the rows it holds are this process's
        return AlignedRows, (self.page_size, self.capacity)


def path_slots(nodes: dict[tuple[int, ...], NodeState], path: tuple[int, ...]) -> tuple[int, ...] | None:
    """The slots of the nodes from the root to the node whose full token path is `path` (`nodes`: the tree's by
    path), as `path_device_indices(node_at(path))` gives them in the live tree whose children start with distinct
    pages (`tree_shape`); None where `path` or a node above it is not in the tree."""
    values = []
    while path:
        node = nodes.get(path)
        if node is None or node.key_len <= 0:
            return None
        values.append(node.value)
        path = path[:len(path) - node.key_len]
    return tuple(chain.from_iterable(reversed(values)))


def free_list(alloc: AllocatorState) -> str | None:
    """No page twice in the free pages and the staged ones, never page 0."""
    pages = alloc.free_pages + alloc.staged_pages
    if len(set(pages)) != len(pages) or 0 in pages:
        return f"free pages {list(alloc.free_pages)} + staged {list(alloc.staged_pages)}: expected each page once, " \
               f"never page 0"
    return None


def longest_prefix(tree: TreeState, tokens: Sequence[int], page_size: int) -> tuple[int, tuple[int, ...]]:
    """What `match_prefix` must answer, found without the tree's walk: the longest page-aligned prefix of
    `tokens` that some node's path starts with, and the slots the nodes on it hold."""
    key = tuple(tokens[:len(tokens) // page_size * page_size])
    best = 0
    for n in tree.nodes:
        common = 0
        for a, b in zip(n.path, key):
            if a != b:
                break
            common += 1
        best = max(best, common // page_size * page_size)
    slots: list[int] = []
    for n in sorted(tree.nodes, key=lambda n: len(n.path)):
        start = len(n.path) - n.key_len
        if start < best and n.path[:min(len(n.path), best)] == key[:min(len(n.path), best)] and start == len(slots):
            slots += n.value[:best - start]
    return best, tuple(slots)


def match_is_longest(tree_before: TreeState, tokens: Sequence[int], page_size: int, prefix_len: int,
                     indices: Sequence[int]) -> str | None:
    """`match_prefix` returned the longest page-aligned cached prefix of the key and its slots."""
    want, slots = longest_prefix(tree_before, tokens, page_size)
    if (prefix_len, tuple(indices)) != (want, slots):
        return f"match_prefix({list(tokens)}): expected {want} tokens at slots {list(slots)}, got {prefix_len} " \
               f"at {list(indices)}"
    return None
