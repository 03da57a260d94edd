"""KV-cache geometry as vLLM's `KVBlockZeroer` sees it, and who owns which byte.

Follows the inputs of `KVBlockZeroer` in `vllm/v1/worker/utils.py` around the
packed-stride fix d6af803 (PR #50276): backing allocations, one tensor view
per layer (byte offset, shape, strides, element size, which dimension indexes
blocks), and per KV-cache group the spec block size and the attention
backend's kernel block size (virtual block splitting).

The model places the allocations in one byte address space (`Arena`) with red
zones between them, so a reference memset can show where an out-of-bounds
write would land instead of corrupting the host. Addresses in this model are
arena offsets; upstream uses device pointers (`data_ptr()`).

`owned_bytes` is the oracle the properties judge the planner with. It
enumerates the elements of each view, so it never uses the planner's
page-span formula.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from kvsim.engine.errors import ConfigError, check_int, require

VIEW_KINDS = ("attention", "mamba")
ARENA_ALIGN = 64  # allocations start 64-byte aligned, like any device allocator would give


def _ints(values: Iterable[Any], field_name: str, minimum: int) -> tuple[int, ...]:
    return tuple(check_int(v, f"{field_name}[{i}]", minimum=minimum) for i, v in enumerate(values))


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV-cache group: tokens per spec block and per attention-kernel block.

    `block_size % kernel_block_size == 0` is the planner's upstream assertion,
    not checked here; a kernel block larger than the spec block is not a
    configuration vLLM can build, so that is rejected at construction.
    """

    block_size: int
    kernel_block_size: int

    def __post_init__(self) -> None:
        check_int(self.block_size, "block_size", minimum=1)
        check_int(self.kernel_block_size, "kernel_block_size", minimum=1)
        require(self.kernel_block_size <= self.block_size, "kernel_block_size",
                f"at most block_size={self.block_size}", self.kernel_block_size)

    @property
    def ratio(self) -> int:
        """Kernel blocks per logical block (floor, as the pre-fix planner computed it)."""
        return self.block_size // self.kernel_block_size


@dataclass(frozen=True)
class KVView:
    """One layer's KV tensor: `torch.as_strided` parameters over one allocation.

    `offset` is in bytes from the allocation start and must be a multiple of
    `element_size` (torch stores a storage offset in elements). Strides are in
    elements, as `Tensor.stride()` reports them. `kind="mamba"` marks state
    tensors the zeroer must leave alone.
    """

    layer: str
    allocation: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    element_size: int
    block_dim: int = 0
    group: int = 0
    kind: str = "attention"

    def __post_init__(self) -> None:
        name = f"view {self.layer}"
        object.__setattr__(self, "shape", _ints(self.shape, f"{name}.shape", 1))
        object.__setattr__(self, "strides", _ints(self.strides, f"{name}.strides", 1))
        require(len(self.shape) == len(self.strides) and len(self.shape) > 0, f"{name}.strides",
                f"one stride per dimension of shape {self.shape}", self.strides)
        check_int(self.allocation, f"{name}.allocation", minimum=0)
        check_int(self.offset, f"{name}.offset", minimum=0)
        check_int(self.group, f"{name}.group", minimum=0)
        require(self.element_size in (1, 2, 4, 8), f"{name}.element_size", "one of 1, 2, 4, 8", self.element_size)
        check_int(self.block_dim, f"{name}.block_dim", minimum=0, maximum=len(self.shape) - 1)
        require(self.offset % self.element_size == 0, f"{name}.offset",
                f"a multiple of element_size={self.element_size} (torch storage offsets count elements)",
                self.offset)
        require(self.kind in VIEW_KINDS, f"{name}.kind", f"one of {VIEW_KINDS}", self.kind)

    @property
    def extent_bytes(self) -> int:
        """Bytes from the view's first element to the end of its last one."""
        return self.element_size * (1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides)))

    @property
    def block_stride_bytes(self) -> int:
        return self.strides[self.block_dim] * self.element_size

    def block_byte_offsets(self) -> np.ndarray:
        """Sorted byte offsets, from the view start, of every byte of kernel block 0 (read-only: worked out once
        per layout, as a plan asks it of every view for every block)."""
        return _block_byte_offsets(self.shape, self.strides, self.element_size, self.block_dim)


@functools.lru_cache(maxsize=64)
def _block_byte_offsets(shape: tuple[int, ...], strides: tuple[int, ...], element_size: int,
                        block_dim: int) -> np.ndarray:
    offsets = np.zeros(1, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if d != block_dim:
            offsets = np.add.outer(offsets, np.arange(n, dtype=np.int64) * s * element_size).ravel()
    offsets = np.unique(np.add.outer(offsets, np.arange(element_size, dtype=np.int64)).ravel())
    offsets.setflags(write=False)
    return offsets


@dataclass(frozen=True)
class KVCacheGeometry:
    """Backing allocations (bytes), KV-cache groups and layer views."""

    allocations: tuple[int, ...]
    groups: tuple[KVCacheGroup, ...]
    views: tuple[KVView, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocations", _ints(self.allocations, "allocations", 1))
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "views", tuple(self.views))
        require(bool(self.groups), "groups", "at least one KV-cache group", self.groups)
        require(any(v.kind == "attention" for v in self.views), "views", "at least one attention view",
                [v.layer for v in self.views])
        for i, view in enumerate(self.views):
            require(view.allocation < len(self.allocations), f"views[{i}].allocation",
                    f"an index below {len(self.allocations)}", view.allocation)
            require(view.group < len(self.groups), f"views[{i}].group", f"an index below {len(self.groups)}",
                    view.group)
            size = self.allocations[view.allocation]
            require(view.offset + view.extent_bytes <= size, f"views[{i}] ({view.layer})",
                    f"a view inside allocation {view.allocation} of {size} bytes",
                    f"bytes {view.offset}..{view.offset + view.extent_bytes}")

    @property
    def num_blocks(self) -> int:
        """Logical blocks every attention view can hold (the allocator's num_blocks)."""
        return min(v.shape[v.block_dim] // self.groups[v.group].ratio
                   for v in self.views if v.kind == "attention")

    def attention_views(self) -> list[tuple[int, KVView]]:
        return [(i, v) for i, v in enumerate(self.views) if v.kind == "attention"]

    @classmethod
    def from_jsonable(cls, data: Mapping[str, Any]) -> "KVCacheGeometry":
        """Inverse of `kvsim.canon.to_jsonable` (used to hand a case to a sanitizer subprocess)."""
        try:
            return cls(allocations=tuple(data["allocations"]),
                       groups=tuple(KVCacheGroup(**g) for g in data["groups"]),
                       views=tuple(KVView(**{**v, "shape": tuple(v["shape"]), "strides": tuple(v["strides"])})
                                   for v in data["views"]))
        except (KeyError, TypeError) as exc:
            raise ConfigError("geometry", "a JSON object with allocations, groups and views", str(exc)) from None


@dataclass(frozen=True)
class Arena:
    """Where each allocation sits in one byte address space.

    A red zone before, between and after the allocations is large enough to
    hold any write the pre-fix plan makes (it overruns by less than one
    logical block stride), so the reference memset never leaves the buffer and
    a property can see exactly which foreign bytes were hit.
    """

    bases: tuple[int, ...]
    sizes: tuple[int, ...]
    size: int

    def __post_init__(self) -> None:
        require(len(self.bases) == len(self.sizes), "arena.bases", "one base per allocation", self.bases)
        end = 0
        for i, (base, size) in enumerate(zip(self.bases, self.sizes)):
            require(base >= end, f"arena.bases[{i}]", f"an address >= {end} (allocations must not overlap)", base)
            end = base + size
        require(self.size >= end, "arena.size", f"at least {end}", self.size)

    @classmethod
    def for_geometry(cls, geometry: KVCacheGeometry, red_zone: int | None = None) -> "Arena":
        if red_zone is None:
            red_zone = max(v.block_stride_bytes * geometry.groups[v.group].ratio for v in geometry.views)
        red_zone = round_up(max(red_zone, ARENA_ALIGN), ARENA_ALIGN)
        bases, cursor = [], red_zone
        for size in geometry.allocations:
            bases.append(cursor)
            cursor = round_up(cursor + size + red_zone, ARENA_ALIGN)
        return cls(tuple(bases), geometry.allocations, cursor)

    def allocation_at(self, addr: int) -> int | None:
        for i, (base, size) in enumerate(zip(self.bases, self.sizes)):
            if base <= addr < base + size:
                return i
        return None

    def inside(self) -> np.ndarray:
        """Boolean mask over the arena: True for bytes that belong to some allocation."""
        mask = np.zeros(self.size, dtype=bool)
        for base, size in zip(self.bases, self.sizes):
            mask[base:base + size] = True
        return mask

    def describe(self, addr: int) -> str:
        index = self.allocation_at(addr)
        if index is not None:
            return f"allocation {index} + {addr - self.bases[index]}"
        before = [i for i, b in enumerate(self.bases) if b + self.sizes[i] <= addr]
        if before:
            i = before[-1]
            return f"{addr - self.bases[i] - self.sizes[i]} bytes past the end of allocation {i}"
        return f"{self.bases[0] - addr} bytes before allocation 0"


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def view_start(arena: Arena, view: KVView) -> int:
    return arena.bases[view.allocation] + view.offset


def kernel_blocks_of(geometry: KVCacheGeometry, view: KVView, block_ids: Iterable[int]) -> list[int]:
    """Kernel blocks b*ratio .. b*ratio+ratio-1 of every logical block b (virtual block splitting)."""
    ratio = geometry.groups[view.group].ratio
    return sorted({b * ratio + v for b in block_ids for v in range(ratio)})


def owned_bytes(geometry: KVCacheGeometry, arena: Arena, block_ids: Iterable[int]) -> np.ndarray:
    """Boolean mask of the arena bytes that hold an element of a given logical block, in any attention view.

    Exact ownership: a view whose kernel block leaves holes inside its page
    span (say a head slice of a wider tensor) has those holes outside the mask,
    although upstream's page span clears them. The layouts built here have no
    such holes.
    """
    block_ids = list(block_ids)
    mask = np.zeros(arena.size, dtype=bool)
    for _, view in geometry.attention_views():
        offsets = view.block_byte_offsets() + view_start(arena, view)
        for k in kernel_blocks_of(geometry, view, block_ids):
            if k < view.shape[view.block_dim]:
                mask[offsets + k * view.block_stride_bytes] = True
    return mask


@dataclass(frozen=True)
class ByteOwner:
    """Who a byte belongs to, for violation messages."""

    where: str
    owners: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return f"{self.where} ({', '.join(self.owners) if self.owners else 'padding, owned by no view'})"


def owner_of(geometry: KVCacheGeometry, arena: Arena, addr: int) -> ByteOwner:
    """Every (view, kernel block) whose elements include byte `addr`, plus its allocation position."""
    if arena.allocation_at(addr) is None:
        return ByteOwner(arena.describe(addr), ("red zone outside every allocation",))
    owners = []
    for view in geometry.views:
        rel = addr - view_start(arena, view)
        if rel < 0 or rel >= view.extent_bytes:
            continue
        offsets = view.block_byte_offsets()
        for k in range(view.shape[view.block_dim]):
            r = rel - k * view.block_stride_bytes
            i = int(np.searchsorted(offsets, r))
            if i < len(offsets) and offsets[i] == r:
                owners.append(f"{view.kind} layer {view.layer} kernel block {k}")
    return ByteOwner(arena.describe(addr), tuple(owners))


def outer_dims(view: KVView, anywhere: bool = False) -> tuple[int, ...]:
    """Dimensions whose stride spans more than one block (K/V, head groups): before the block dimension, or
    (`anywhere`, vLLM 0.29.0's standardized block-first views) on either side of it."""
    dims = range(len(view.shape)) if anywhere else range(view.block_dim)
    return tuple(d for d in dims if d != view.block_dim
                 and view.strides[d] * view.element_size > view.block_stride_bytes)


def outer_offsets(view: KVView, anywhere: bool = False) -> list[int]:
    """Byte offset of every combination of outer indices, in row-major order."""
    dims = outer_dims(view, anywhere)
    return [sum(i * view.strides[d] * view.element_size for i, d in zip(idx, dims))
            for idx in itertools.product(*(range(view.shape[d]) for d in dims))]
