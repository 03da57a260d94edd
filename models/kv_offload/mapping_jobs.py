"""Transfer jobs of the worker side: in-order completion of one direction's swaps, and the byte offsets of a
tiering `TransferJob` in the primary (CPU) view (research note vllm.md 3.2 "Tiering" and "GPU<->CPU transfer").

* `TransferQueue`: upstream's `SingleDirectionOffloadingHandler` runs each transfer on its own stream that first
  waits for the previous transfer's end event, so transfers complete in submission order; `get_finished` pops
  finished transfers from the head of the queue only. A job whose event fired behind an unfinished one is not
  reported until the head is.
* `job_offsets`: a file-system tier reads or writes chunk slot `c` at byte `c * chunk_bytes` of the primary
  memoryview (`chunk_bytes = primary_kv_view.strides[0]`), one file per key; `validate_offsets` is upstream's
  bounds check of a batch (`tiering/fs/io.py`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from kvsim.engine.errors import require


@dataclass(frozen=True)
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int


@dataclass
class TransferQueue:
    """One direction's transfers: `transfer_async` appends, `complete` marks an end event fired (the device may
    fire them in any order it likes; the model lets the caller choose), `get_finished` pops the finished head."""

    _transfers: deque[tuple[int, int]] = field(default_factory=deque)  # (job_id, num_bytes), submission order
    _fired: set[int] = field(default_factory=set)

    def transfer_async(self, job_id: int, num_bytes: int) -> bool:
        require(all(job_id != j for j, _ in self._transfers), "job_id", "an id not in flight", job_id)
        self._transfers.append((job_id, num_bytes))
        return True

    def complete(self, job_id: int) -> None:
        """The end event of `job_id` fired (`end_event.query()` now returns True)."""
        require(any(job_id == j for j, _ in self._transfers), "job_id", "a job in flight", job_id)
        self._fired.add(job_id)

    def get_finished(self) -> list[TransferResult]:
        results = []
        while self._transfers and self._transfers[0][0] in self._fired:
            job_id, num_bytes = self._transfers.popleft()
            self._fired.discard(job_id)
            results.append(TransferResult(job_id, True, num_bytes))
        return results

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(j for j, _ in self._transfers)


def chunk_offset(chunk_id: int, chunk_bytes: int) -> int:
    """Where chunk slot `chunk_id` starts in the primary view."""
    return chunk_id * chunk_bytes


def job_offsets(chunk_ids: Sequence[int], chunk_bytes: int) -> list[int]:
    """The offsets a file-system tier reads or writes for one `TransferJob`, co-indexed with its keys."""
    return [chunk_offset(int(c), chunk_bytes) for c in chunk_ids]


def validate_offsets(view_bytes: int, offsets: Sequence[int], block_size: int) -> None:
    """Upstream `_validate_offsets`: every `[offset, offset + block_size)` inside a view of `view_bytes`."""
    for offset in offsets:
        require(0 <= offset and offset + block_size <= view_bytes, "offset",
                f"a block of {block_size} bytes inside a view of {view_bytes}", offset)
