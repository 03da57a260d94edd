"""vLLM's real Triton kernel of the KV block zeroer as a conform target (`ZERO_KV_BLOCKS`, a kernel Differential).

`_zero_kv_blocks_kernel`, launched by `KVBlockZeroer.zero_block_ids` and `KVBlockZeroer.warmup`
(vllm/v1/worker/utils.py) in the kernel child on a CPU byte arena, against the model's reference memset
`kvsim.models.kv_zeroing.zeroer.zero_blocks`, bit for bit, on the geometries of `gpu_oracle.kernels.zero_kv_blocks`
(planned by every variant, raw segment tables, the pinned upstream layouts on a sentinel buffer). One input in
ten calls `warmup(num_kv_blocks)` (0-2 blocks: it zeroes block 0 when there is one), one in ten has no table
(`_meta` None: upstream's zeroer for a cache with no attention layer).

Adapter: the segment table is the model's (the planner half of `KVBlockZeroer.__init__` is the `KVBlockZeroer`
target's); the launcher's `_meta` tuple is filled from it with upstream's element order, its BLOCK_SIZE/max_chunks
by the model's fixed `launch_config` (upstream's formula); addresses are the arena's `data_ptr() + offset`;
`async_tensor_h2d` is `torch.tensor(..., device=)`. The arena travels to the child as a repeated tile where it
is one (the sentinel byte, the probe's pattern) and comes back as the runs of bytes the launch changed
(`arena_document`, `writes`): the 15 MB DeepSeek-V4 arena is not sent whole both ways. Before d6af803 (0.27.1: the kernel's parameters have no
`seg_block_strides_ptr`) `_meta` has 5 fields (the page doubles as the stride, no mask): the adapter fills that
`_meta`, the tables are the model's `pre_d6af803` plans of the cases' geometries (raw tables with stride := page,
drawn again when a write would leave the buffer) and the launch is `launch_config(table, pre_d6af803)` (the
unmasked launcher's formula).

Probe `zeroing_preserves_other_bytes` (the d6af803 seed bug's frame property, kernel side): upstream's own
`KVBlockZeroer.__init__` plans the pinned regression geometries (and drawn ones), upstream's kernel zeroes them on a
patterned arena with red zones (guard bytes) around every allocation, and no byte outside the zeroed blocks'
elements may change (`owned_bytes`, from the view elements).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.canon import to_jsonable
from kvsim.engine.conformance.adapters import Context, Differential, Probe
from kvsim.engine.conformance.answers import FAILED, capture
from kvsim.engine.errors import ConfigError

from ..kernels import call_kernel, kernel_examples
from ..source import EngineSource
from .common import load_in_child
from .zeroer import loading, ratio_shape, upstream_plan

UTILS = "vllm/v1/worker/utils.py"
ZERO_SYMBOLS = ("KVBlockZeroer", "_zero_kv_blocks_kernel")
RUNNER = f"{__name__}:run_zero"


# --- child side (torch and triton are imported here only) ---------------------------------------------

def run_zero(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    """The release's `zero_block_ids` (or `warmup`) with `_meta` filled from the document; the memory after."""
    import torch

    ns = load_in_child(source, UTILS, ZERO_SYMBOLS, device)
    before = arena_of(case["memory"])
    memory = torch.from_numpy(before.copy()).to(device)
    base = memory.data_ptr()
    zeroer = object.__new__(ns.KVBlockZeroer)
    zeroer.device = torch.device(device)
    zeroer._meta = None
    if case["addrs"] is not None:
        addrs = torch.tensor([base + a for a in case["addrs"]], dtype=torch.uint64, device=device)
        pages = torch.tensor(case["pages"], dtype=torch.int64, device=device)
        if case["strides"] is None:  # before d6af803: (seg_addrs, seg_page_sizes, max_chunks, blk_size, n_segs)
            zeroer._meta = (addrs, pages, case["max_chunks"], case["block_size"], len(case["addrs"]))
        else:
            zeroer._meta = (addrs, torch.tensor(case["strides"], dtype=torch.int64, device=device), pages,
                            case["max_chunks"], case["block_size"], len(case["addrs"]))
    if case.get("warmup") is not None:
        zeroer.warmup(case["warmup"])
    else:
        zeroer.zero_block_ids(list(case["block_ids"]))
    if device == "cuda":
        torch.cuda.synchronize()
    return {"writes": writes(before, memory.cpu().numpy())}


# --- the arena both ways: a tiled pattern out, the changed bytes back ---------------------------------

def arena_document(memory: np.ndarray, tile: np.ndarray | None = None) -> dict[str, Any]:
    """The arena as the child's case holds it: `tile` repeated to the arena's size where it is one (the sentinel
    byte, the frame probe's pattern: a 15 MB arena sent as a few bytes), else every byte."""
    from kvsim.gpu_oracle.runtime.asan import pack

    if tile is not None:
        return {"tile": pack(tile), "size": int(memory.size)}
    return pack(memory)


def arena_of(document: Mapping[str, Any]) -> np.ndarray:
    from kvsim.gpu_oracle.runtime.asan import unpack

    if "tile" in document:
        return tiled(unpack(document["tile"]), document["size"])
    return unpack(document)


def tiled(tile: np.ndarray, size: int) -> np.ndarray:
    return np.tile(tile, -(-size // tile.size))[:size]


def writes(before: np.ndarray, after: np.ndarray) -> dict[str, Any]:
    """The bytes `after` holds where it differs from `before`, as runs: starts, ends (exclusive), the new bytes."""
    from kvsim.gpu_oracle.runtime.asan import pack

    changed = np.flatnonzero(before != after)
    cut = np.flatnonzero(np.diff(changed) > 1) + 1
    starts = changed[np.concatenate(([0], cut))] if changed.size else changed
    ends = changed[np.concatenate((cut - 1, [changed.size - 1]))] + 1 if changed.size else changed
    return {"starts": pack(starts.astype(np.int64)), "ends": pack(ends.astype(np.int64)), "bytes": pack(after[changed])}


def written(before: np.ndarray, runs: Mapping[str, Any]) -> np.ndarray:
    """`before` with the child's `writes` applied: the arena after the launch."""
    from kvsim.gpu_oracle.runtime.asan import unpack

    after = before.copy()
    spans = zip(unpack(runs["starts"]).tolist(), unpack(runs["ends"]).tolist())
    at = [np.arange(start, end) for start, end in spans]
    if at:
        after[np.concatenate(at)] = unpack(runs["bytes"])
    return after


# --- parent side ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelInput:
    """One call: a gpu_oracle `KernelCase` (random bytes) or `PinnedCase` (sentinel bytes); `warmup`: None (a
    `zero_block_ids(case.block_ids)` call) or the `num_kv_blocks` of a `warmup` call; `planned`: False for a
    zeroer without a table."""

    case: Any
    warmup: int | None = None
    planned: bool = True


def zero_document(memory: np.ndarray, table: Any, block_ids: Any, launch: Any = None, *,
                  pre: bool = False, warmup: int | None = None, planned: bool = True,
                  tile: np.ndarray | None = None) -> dict[str, Any]:
    """The child's case (`tile`: the arena is that tile repeated, `arena_document`); for the launcher before
    d6af803 (`pre`) without the stride column and with the unmasked launch of the pre_d6af803 variant, else with
    the fixed launcher's."""
    from kvsim.models.kv_zeroing.variants import VARIANTS
    from kvsim.models.kv_zeroing.zeroer import FIXED, launch_config

    if launch is None:
        config = launch_config(table, VARIANTS["pre_d6af803"] if pre else FIXED)
        launch = (config.block_size, config.max_chunks)
    rows = table.segments if planned else None
    return {"memory": arena_document(memory, tile), "addrs": None if rows is None else [s.addr for s in rows],
            "strides": None if pre or rows is None else [s.block_stride for s in rows],
            "pages": None if rows is None else [s.page for s in rows], "block_ids": [int(b) for b in block_ids],
            "block_size": launch[0], "max_chunks": launch[1], "warmup": warmup}


def has_strides(kernel: Any) -> bool:
    """The d6af803 kernel takes a per-segment block stride; before it (0.27.1) the page doubles as the stride."""
    return "seg_block_strides_ptr" in inspect.signature(kernel).parameters


def pre_fix_table(case: Any) -> Any:
    """The table a pre-d6af803 launcher runs for a KernelCase: the model's pre_d6af803 plan of its geometry, or
    its raw rows with stride := page; Hypothesis draws again when a write would leave the buffer."""
    from hypothesis import reject

    from kvsim.models.kv_zeroing.variants import VARIANTS
    from kvsim.models.kv_zeroing.zeroer import Segment, SegmentTable, plan_segments, write_spans

    pre = VARIANTS["pre_d6af803"]
    try:
        table = (plan_segments(case.geometry, pre, arena=case.arena) if case.geometry is not None else
                 SegmentTable(tuple(Segment(s.addr, s.page, s.page) for s in case.table.segments),
                              case.table.num_blocks, pre))
    except ConfigError:
        reject()
    if any(end > case.arena.size for _, end in write_spans(table, case.block_ids)):
        reject()
    return table


def prepared(ctx: Context, inp: KernelInput) -> tuple[np.ndarray, Any, tuple[int, ...], dict[str, Any]]:
    """(memory before, table, block IDs, the child's document) of one input, made once per input."""
    from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import SENTINEL, KernelCase
    from kvsim.models.kv_zeroing.geometry import Arena
    from kvsim.models.kv_zeroing.variants import VARIANTS
    from kvsim.models.kv_zeroing.zeroer import plan_segments

    if ctx.state.get("input") is not inp:
        pre = ctx.state["pre"]
        case = inp.case
        if isinstance(case, KernelCase):
            memory, ids = case.memory(), tuple(case.block_ids)
            table = pre_fix_table(case) if pre else case.table
        else:
            arena = Arena.for_geometry(case.geometry)
            table = plan_segments(case.geometry, variant=VARIANTS["pre_d6af803" if pre else "fixed"], arena=arena)
            memory, ids = np.full(arena.size, SENTINEL, dtype=np.uint8), tuple(case.block_ids)
        tile = None if isinstance(case, KernelCase) else np.full(1, SENTINEL, dtype=np.uint8)
        document = zero_document(memory, table, ids, pre=pre, warmup=inp.warmup, planned=inp.planned, tile=tile)
        ctx.state["input"], ctx.state["prepared"] = inp, (memory, table, ids, document)
    return ctx.state["prepared"]


def zero_model(ctx: Context, inp: KernelInput) -> dict[str, Any]:
    """The reference memset of the same table and block IDs (`warmup(n)`: block 0 when n > 0)."""
    from kvsim.models.kv_zeroing.zeroer import zero_blocks

    memory, table, ids, _ = prepared(ctx, inp)
    expected = memory.copy()
    if inp.warmup is not None:
        ids = (0,) if inp.warmup > 0 else ()
    if inp.planned:
        zero_blocks(expected, table, ids)
    return {"memory": expected}


def zero_upstream(ctx: Context, inp: KernelInput) -> dict[str, Any]:
    memory, _, _, document = prepared(ctx, inp)
    return {"memory": written(memory, call_kernel(ctx, RUNNER, document)["writes"])}


@st.composite
def kernel_inputs(draw: st.DrawFn) -> KernelInput:
    from kvsim.gpu_oracle.kernels.zero_kv_blocks import strategies

    case, roll = draw(strategies.kernel_cases), draw(st.integers(0, 9))
    if roll == 1:
        return KernelInput(case, warmup=draw(st.integers(0, 2)))
    return KernelInput(case, planned=roll != 2)


def pinned_inputs(ctx: Context) -> list[KernelInput]:
    from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import sentinel_cases

    return [KernelInput(c) for c in sentinel_cases() if c.chunk_width is None]  # the launcher picks the width


def describe(ctx: Context, inp: KernelInput) -> dict[str, Any]:
    shown: dict[str, Any] = {"case": to_jsonable(inp.case)}
    if inp.warmup is not None:
        shown["warmup"] = inp.warmup
    if not inp.planned:
        shown["planned"] = False
    return shown


def prepare(ctx: Context) -> None:
    ctx.state["pre"] = not has_strides(ctx.up._zero_kv_blocks_kernel)


def note(ctx: Context) -> str:
    table = "pre_d6af803 tables, unmasked launch" if ctx.state["pre"] else "stride column, masked launch"
    return f"{table}; launched by KVBlockZeroer.zero_block_ids and warmup in the kernel child"


# --- the frame probe: upstream's planner and kernel together ------------------------------------------

FRAME_DRAWN = 8
PATTERN = (np.arange(251) * 131 % 251 + 1).astype(np.uint8)  # byte i of an arena is PATTERN[i % 251]: never 0


def frame_cases() -> list[tuple[str, Any, tuple[int, ...]]]:
    """The pinned regression geometries, the last-block overrun cases, and a few drawn kv-zeroing layouts."""
    from kvsim.engine.draws import derandomized_draws
    from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import overrun_cases, pinned_geometries
    from kvsim.properties.kv_zeroing.strategies import ZEROING_CASES

    cases = list(pinned_geometries())
    cases += [(f"{c.name}, last block", c.geometry, c.block_ids) for c in overrun_cases() if c.variant == "fixed"]
    drawn = derandomized_draws(ZEROING_CASES, FRAME_DRAWN)
    return cases + [(f"drawn layout {i}", c.geometry, tuple(c.block_ids)) for i, c in enumerate(drawn)]


def frame_probe(ctx: Context) -> str | None:
    """The d6af803 seed bug's frame property on upstream's planner and kernel: bytes outside the zeroed blocks
    (other layers of a packed row, padding, other blocks, the guard bytes around each allocation) keep their value."""
    from kvsim.models.kv_zeroing.geometry import Arena, owned_bytes, owner_of
    from kvsim.properties.kv_zeroing.cases import ZeroingCase

    from .zeroer import ZeroerCase, release_shape

    cls = ctx.up.KVBlockZeroer
    derives_ratio = release_shape(cls).takes_num_blocks
    for name, geometry, ids in frame_cases():
        if derives_ratio and ratio_shape(ZeroerCase(ZeroingCase(geometry, ids), "probe")) == "not built":
            continue  # a view 0.30.0+'s allocator does not build (the KVBlockZeroer target's NOT_BUILT)
        planned = upstream_plan(cls, geometry)
        if planned is None:
            continue
        table, launch = planned
        arena = Arena.for_geometry(geometry)
        before = tiled(PATTERN, arena.size)  # no zero byte
        document = zero_document(before, table, ids, (launch["block_size"], launch["max_chunks"]),
                                 pre=ctx.state["pre"], tile=PATTERN)
        answer = capture(call_kernel, ctx, RUNNER, document)
        if isinstance(answer, FAILED):
            return f"{name}: upstream's kernel on upstream's plan: {answer}"
        after = written(before, answer["writes"])
        foreign = (after != before) & ~owned_bytes(geometry, arena, ids)
        if foreign.any():
            outside = int((foreign & ~arena.inside()).sum())
            first = owner_of(geometry, arena, int(np.flatnonzero(foreign)[0]))
            return (f"{name}: bytes changed outside blocks {sorted(set(ids))}: expected 0, got {int(foreign.sum())}, "
                    f"{outside} of them guard bytes outside every allocation (first at {first})")
    return None


ZERO_KV_BLOCKS = Differential(
    kernel=True, examples=kernel_examples, loading=loading, prepare=prepare,
    inputs=lambda ctx: kernel_inputs(), pinned=pinned_inputs, model=zero_model, upstream=zero_upstream,
    describe=describe, note=note,
    probes=(Probe("zeroing_preserves_other_bytes",
                  "the d6af803 frame property on upstream's planner and kernel, guard bytes around each allocation",
                  frame_probe),))
