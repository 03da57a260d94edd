"""The #52615 rename (block -> chunk) as two naming adapters over one model.

vLLM #52615 renamed the CPU offloading manager's unit from "block" to "chunk" with no intended change
of behaviour: vLLM 0.29.0 is the last release with the old names, 0.30.0 the first with the new ones.
A `Naming` lists the names a caller (a test, an out-of-tree tier, the conformance adapter) reads;
`NamedManager` exposes the one model under either naming, and `trace` runs an operation list through
an adapter reading every observation by that adapter's names. The property `old_and_new_names_trace_equal`
checks the two traces are equal, which is what a missed rename (a field read through `getattr`, a
default hiding a missing attribute) breaks. The conformance adapter reads the real releases through
the same two namings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .manager import CPUOffloadingManager
from .variants import FIXED, OffloadVariant


@dataclass(frozen=True)
class Naming:
    label: str
    capacity_arg: str  # the constructor's capacity argument
    num_units: str  # the capacity attribute
    num_allocated: str  # the high-water mark
    num_evictable: str  # count of ref_cnt == 0
    num_write_pending: str  # count of ref_cnt == -1
    get_num_free: str  # free slots
    status_class: str  # the per-slot status record
    status_id: str  # its slot id field
    spec_ids: str  # the slot ids of a CPULoadStoreSpec, as callers read them
    lru_chunks: str  # the LRU policy's resident map
    chunk_level: str  # the value of OffloadPolicy's offload-as-you-go member (BLOCK_LEVEL -> CHUNK_LEVEL)


OLD_NAMES = Naming("vllm <= 0.29.0 (before #52615)", "num_blocks", "_num_blocks", "_num_allocated_blocks",
                   "_num_evictable_cache_blocks", "_num_write_pending_blocks", "_get_num_free_blocks",
                   "BlockStatus", "block_id", "block_ids", "blocks", "block_level")
NEW_NAMES = Naming("vllm >= 0.30.0 (#52615)", "num_chunks", "_num_chunks", "_num_allocated_chunks",
                   "_num_evictable_cache_chunks", "_num_write_pending_chunks", "_get_num_free_chunks",
                   "ChunkStatus", "chunk_id", "chunk_ids", "chunks", "chunk_level")
NAMINGS = {"old": OLD_NAMES, "new": NEW_NAMES}

# the model's own attribute for each renamed one (the model speaks the new names)
_CANONICAL = {"num_units": "_num_chunks", "num_allocated": "_num_allocated_chunks",
              "num_evictable": "_num_evictable_cache_chunks", "num_write_pending": "_num_write_pending_chunks",
              "get_num_free": "_get_num_free_chunks"}


class NamedRecord:
    """A slot status or a load/store spec seen through a naming (one renamed field)."""

    def __init__(self, field: str, value: Any) -> None:
        object.__setattr__(self, field, value)


class NamedManager:
    """The model's manager under a naming: renamed attributes answer by the naming's names only."""

    def __init__(self, naming: Naming, variant: OffloadVariant = FIXED, **kwargs: Any) -> None:
        capacity = kwargs.pop(naming.capacity_arg)
        self.naming = naming
        self._m = CPUOffloadingManager(capacity, variant=variant, **kwargs)
        self._names = {getattr(naming, field): canonical for field, canonical in _CANONICAL.items()}

    def __getattr__(self, name: str) -> Any:
        names = object.__getattribute__(self, "_names")
        if name in names:
            return getattr(object.__getattribute__(self, "_m"), names[name])
        raise AttributeError(f"{type(self).__name__} ({self.naming.label}) has no attribute {name!r}")

    def prepare_store(self, keys: Sequence[int], req: int) -> Any:
        out = self._m.prepare_store(keys, req)
        if out is None:
            return None
        return (out.keys_to_store, NamedRecord(self.naming.spec_ids, out.chunk_ids), out.evicted_keys)

    def prepare_load(self, keys: Sequence[int], req: int) -> NamedRecord:
        return NamedRecord(self.naming.spec_ids, self._m.prepare_load(keys, req))

    def status(self, key: int) -> NamedRecord | None:
        chunk = self._m.resident().get(key)
        return None if chunk is None else NamedRecord(self.naming.status_id, chunk.chunk_id)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._names))

    # the operations whose results carry no renamed field
    def complete_store(self, keys: Sequence[int], success: bool = True) -> None:
        self._m.complete_store(keys, success)

    def complete_load(self, keys: Sequence[int]) -> None:
        self._m.complete_load(keys)

    def touch(self, keys: Sequence[int]) -> None:
        self._m.touch(keys)

    def lookup(self, key: int) -> Any:
        return self._m.lookup(key)

    def on_request_finished(self, req: int) -> None:
        self._m.on_request_finished(req)

    def reset_cache(self) -> None:
        self._m.reset_cache()

    def take_events(self) -> Any:
        return self._m.take_events()

    def get_stats(self) -> Any:
        return self._m.get_stats()


def observe(adapter: NamedManager, keys: Sequence[int]) -> dict[str, Any]:
    """Everything a caller reads of the manager, through the adapter's names only."""
    n = adapter.naming
    slots = {}
    for key in keys:
        status = adapter.status(key)
        if status is not None:
            slots[key] = getattr(status, n.status_id)
    return {"capacity": getattr(adapter, n.num_units), "allocated": getattr(adapter, n.num_allocated),
            "evictable": getattr(adapter, n.num_evictable), "write_pending": getattr(adapter, n.num_write_pending),
            "free": getattr(adapter, n.get_num_free)(), "slots": slots}


def run_op(adapter: NamedManager, op: tuple) -> Any:
    """One operation `(name, *args)` on an adapter; its result as plain data, read by the adapter's names."""
    name, *args = op
    n = adapter.naming
    if name == "prepare_store":
        out = adapter.prepare_store(*args)
        return None if out is None else (out[0], tuple(getattr(out[1], n.spec_ids)), out[2])
    if name == "prepare_load":
        return tuple(getattr(adapter.prepare_load(*args), n.spec_ids))
    return getattr(adapter, name)(*args)


def trace(naming: Naming, ops: Sequence[tuple], keys: Sequence[int], variant: OffloadVariant = FIXED,
          **kwargs: Any) -> list[Any]:
    """The (result, observation) of each operation, run on a fresh adapter under `naming`."""
    adapter = NamedManager(naming, variant, **kwargs)
    out = []
    for op in ops:
        out.append((op[0], run_op(adapter, op), observe(adapter, keys)))
    return out
