"""SGLang's paged KV allocator (`sglang/srt/mem_cache/allocator/paged.py`, `PagedTokenToKVPoolAllocator`, 0.5.23).

Indices are token slots; page p holds slots `p * page_size .. p * page_size + page_size - 1`. Page 0 is reserved
(the padded slot upstream writes dummy outputs to): the free pages start as 1 .. num_pages, front first.

* `alloc(n)` takes `n // page_size` whole pages from the front of the free list (upstream's floor: a size that is
  not page-aligned loses its remainder, silently unless `SGLANG_DEBUG_MEMORY_POOL` asserts) and returns their
  slots, page by page; None when the free pages (after merging the staged ones) are too few.
* `alloc_extend(prefix_len, seq_len, last_loc)` and `alloc_decode(seq_len, last_loc)`: one request's slots as the
  scheduler asks for them (`alloc_extend_naive`, `alloc_decode_naive`): first the rest of the page the prefix
  ends in (`last_loc + 1, ...`), then new pages from the front of the free list, the last one partly used.
* `free(indices)`: the pages the slots are on, each once, ascending (upstream's `torch.unique`);
  `free_segment(indices, start_pos)`: a segment of a request's row starting on a page boundary, one page per
  `page_size` slots (`free_index[::page_size]`), in the order given; `free_page_ids(pages)`.
* Released pages go to the *front* of the free list (`torch.cat((page_ids, free_pages))`), so the next `alloc`
  reuses them first; with `need_sort` they are staged instead and merged, sorted ascending, when an alloc runs
  short (`merge_and_sort_free`). Inside `free_group_begin` .. `free_group_end` every free is held back:
  `free`'s slots are released at the end through `free` (sorted), then the page-id frees (`free_segment`,
  `free_page_ids`) in front of them.
* `available_size()`: (free + staged pages) * page_size.

The model records what upstream's debug mode would assert (a page freed while free, page 0 freed, a segment
start off a page boundary) in `problems` instead of raising, so a check can report it.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class AllocatorState(NamedTuple):
    free_pages: tuple[int, ...]  # front first: the order alloc takes them
    staged_pages: tuple[int, ...]  # need_sort only: freed, waiting for merge_and_sort_free


class PagedTokenToKVPoolAllocator:
    def __init__(self, num_pages: int, page_size: int, need_sort: bool = False) -> None:
        self.num_pages, self.page_size, self.need_sort = num_pages, page_size, need_sort
        self.size = num_pages * page_size
        self.problems: list[str] = []
        self.clear()

    def clear(self) -> None:
        self.free_pages: list[int] = list(range(1, self.num_pages + 1))
        self.staged_pages: list[int] = []
        self.free_group: list[tuple[int, ...]] | None = None
        self.free_page_ids_group: list[tuple[int, ...]] = []

    # -- value form ---------------------------------------------------------------------------------------------
    def freeze(self) -> AllocatorState:
        assert self.free_group is None, "a free group is open"
        return AllocatorState(tuple(self.free_pages), tuple(self.staged_pages))

    @classmethod
    def thaw(cls, s: AllocatorState, num_pages: int, page_size: int, need_sort: bool = False) \
            -> "PagedTokenToKVPoolAllocator":
        a = cls(num_pages, page_size, need_sort)
        a.free_pages, a.staged_pages = list(s.free_pages), list(s.staged_pages)
        return a

    # -- sizes --------------------------------------------------------------------------------------------------
    def available_size(self) -> int:
        return (len(self.free_pages) + len(self.staged_pages)) * self.page_size

    def all_free_pages(self) -> list[int]:
        return self.free_pages + self.staged_pages

    def merge_and_sort_free(self) -> None:
        if self.staged_pages:
            self.free_pages = sorted(self.free_pages + self.staged_pages)
            self.staged_pages = []

    # -- allocation ---------------------------------------------------------------------------------------------
    def slots(self, pages: Sequence[int]) -> tuple[int, ...]:
        return tuple(p * self.page_size + k for p in pages for k in range(self.page_size))

    def alloc(self, need_size: int) -> tuple[int, ...] | None:
        num_pages = need_size // self.page_size
        if num_pages > len(self.free_pages):
            self.merge_and_sort_free()
        if num_pages > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        return self.slots(out)

    @staticmethod
    def num_new_pages(prefix_len: int, seq_len: int, page_size: int) -> int:
        """Upstream's `get_num_new_pages` for one request: pages a row of `seq_len` slots has that one of
        `prefix_len` has not."""
        return -(-seq_len // page_size) - -(-prefix_len // page_size)

    def alloc_extend(self, prefix_len: int, seq_len: int, last_loc: int) -> tuple[int, ...] | None:
        """Slots for positions `prefix_len .. seq_len - 1` of one request whose slot at `prefix_len - 1` is
        `last_loc` (-1 for none): the prefix's partial page first, then whole new pages, the last one partly."""
        ps = self.page_size
        # upstream's bound before launching the kernel: extend_num_tokens // page_size + bs + 1 pages
        if (seq_len - prefix_len) // ps + 2 > len(self.free_pages):
            self.merge_and_sort_free()
        new = self.num_new_pages(prefix_len, seq_len, ps)
        if new > len(self.free_pages):
            return None
        ceil_prefix = -(-prefix_len // ps) * ps
        first = min(seq_len, ceil_prefix) - prefix_len  # the rest of the prefix's last page
        out = [last_loc + 1 + i for i in range(first)]
        pages, self.free_pages = self.free_pages[:new], self.free_pages[new:]
        out += [p * ps + k for p in pages for k in range(ps)][:seq_len - prefix_len - first]
        return tuple(out)

    def alloc_decode(self, seq_len: int, last_loc: int) -> tuple[int, ...] | None:
        """The slot for position `seq_len - 1` of one request whose slot at `seq_len - 2` is `last_loc`: a new
        page's first slot when the position starts a page, else `last_loc + 1`."""
        if 1 > len(self.free_pages):  # upstream: bs > len(free_pages)
            self.merge_and_sort_free()
        new = self.num_new_pages(seq_len - 1, seq_len, self.page_size)
        if new > len(self.free_pages):
            return None
        if not new:
            return (last_loc + 1,)
        page, self.free_pages = self.free_pages[0], self.free_pages[1:]
        return (page * self.page_size,)

    # -- freeing ------------------------------------------------------------------------------------------------
    def free(self, free_index: Sequence[int]) -> None:
        if not free_index:
            return
        if self.free_group is None:
            self._release_page_ids(sorted({i // self.page_size for i in free_index}))
        else:
            self.free_group.append(tuple(free_index))

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        if not free_index:
            return
        if start_pos % self.page_size:
            self.problems.append(f"free_segment at {start_pos}: expected a page-aligned start "
                                 f"(page_size {self.page_size})")
        self.free_page_ids([i // self.page_size for i in free_index[::self.page_size]])

    def free_page_ids(self, page_ids: Sequence[int]) -> None:
        if not page_ids:
            return
        if self.free_group is None:
            self._release_page_ids(list(page_ids))
        else:
            self.free_page_ids_group.append(tuple(page_ids))

    def _release_page_ids(self, page_ids: list[int]) -> None:
        free = set(self.all_free_pages())
        for p in page_ids:
            if p == 0:
                self.problems.append("page 0 (reserved) freed")
            elif p in free:
                self.problems.append(f"page {p} freed while free")
            free.add(p)
        if self.need_sort:
            self.staged_pages += page_ids
        else:
            self.free_pages = page_ids + self.free_pages

    def free_group_begin(self) -> None:
        assert self.free_group is None, "free groups cannot be nested"
        self.free_group = []
        self.free_page_ids_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free([i for idx in pending for i in idx])
        if self.free_page_ids_group:
            self._release_page_ids([p for ids in self.free_page_ids_group for p in ids])
            self.free_page_ids_group = []
