"""SGLang's request-to-token pool (`sglang/srt/mem_cache/memory_pool.py`, `ReqToTokenPool`, 0.5.23) as the radix
cache's scheduler uses it: a row per running request, taken when the request is admitted
(`allocation.alloc_req_slots`, before its extend) and given back by `release_kv_cache` (at its finish and at a
retraction alike). The row's slots are the request's `row` (`common.Req`); the pool itself is counted: its free
rows, `len(free_slots)`, the number `SchedulerInvariantChecker._check_req_pool` compares (free rows + the rows
streaming sessions hold = the pool; no sessions here). Which row a request gets is not modelled (upstream pops the
free list's tail); only how many are free.
"""

from __future__ import annotations


class ReqToTokenPool:
    def __init__(self, size: int, free_slots: int | None = None) -> None:
        self.size = size
        self.free_slots = size if free_slots is None else free_slots
        self.problems: list[str] = []  # what an op found wrong (the step checks read it)

    def available_size(self) -> int:
        return self.free_slots

    def alloc(self) -> bool:
        """A row for one request (`alloc(reqs)` for a batch of one); False when none is free (upstream's None, which
        `alloc_req_slots` raises as a RuntimeError)."""
        if self.free_slots < 1:
            self.problems.append(f"alloc_req_slots: no free row in a pool of {self.size}")
            return False
        self.free_slots -= 1
        return True

    def free(self) -> None:
        """The request's row back (`free(req)`)."""
        self.free_slots += 1
