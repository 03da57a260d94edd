"""The decode staging handler's three pure decisions, as the model makes them (SGLang 05c7ebf .. 0.5.23).

`system.PdStaging` takes these decisions through these functions, and `kvsim conform sglang`
(`kvsim.conform.sglang.findings`) compares them with upstream's own code in
`common/staging_handler.py`, then runs the findings' properties on upstream's functions:

- `req_allocates`: `handle_staging_req`'s dedupe test. A chunk whose entry holds no live
  allocation (`infos[k][0] < 0`, and not ALLOC_OVERSIZED) is allocated again, including one
  that was scattered, since `submit_chunk_scatter` zeroes the entry to `(-1, -1, 0, -1, 0)`
  (finding `sglang-05c7ebf-staging-late-req-realloc`);
- `fan_in_complete`: `handle_chunk_arrived` submits the scatter once `len(arrivals) >=
  num_writers`, counting entries, not writers (`sglang-05c7ebf-staging-dup-ready`,
  `sglang-0523-staging-dup-ready-reenqueue`);
- `scatter_complete`: `advance_scatter` completes a room once all ranks succeeded and no
  event and no *allocated* slot remains; a chunk never allocated does not count
  (`sglang-05c7ebf-staging-lost-req-success`).
"""

from __future__ import annotations

from typing import Sequence

from .state import NOT_ALLOCATED


def req_allocates(alloc_id: int) -> bool:
    """A STAGING_REQ for a chunk whose entry holds `alloc_id` (-1 none or scattered, -2 oversized) allocates."""
    return alloc_id == NOT_ALLOCATED


def fan_in_complete(arrivals: Sequence[tuple], writers: int) -> bool:
    """The CHUNK_READY arrivals recorded for a slot complete its fan-in: `len(arrivals) >= num_writers`."""
    return len(arrivals) >= writers


def scatter_complete(all_success: bool, events: Sequence[int], infos: Sequence[int]) -> bool:
    """The room's staging is done: all ranks succeeded, no scatter event pending, no allocated slot left."""
    return all_success and not events and all(a < 0 for a in infos)
