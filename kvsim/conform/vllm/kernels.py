"""vLLM's real Triton kernel of the KV block zeroer as a conform target.

* `zero-kv-blocks-kernel`: `_zero_kv_blocks_kernel` launched by `KVBlockZeroer.zero_block_ids`
  (vllm/v1/worker/utils.py) on a CPU byte arena, against the model's reference memset
  `kvsim.models.kv_zeroing.zeroer.zero_blocks`, bit for bit, on the geometries of
  `gpu_oracle.kernels.zero_kv_blocks` (planned by every variant, raw segment tables, the pinned
  upstream layouts on a sentinel buffer).
  Adapter: the segment table is the model's (the planner half of `KVBlockZeroer.__init__` is the
  planner target's); the launcher's `_meta` tuple is filled from it with upstream's element order,
  its BLOCK_SIZE/max_chunks by the model's fixed `launch_config` (upstream's formula); addresses are
  the arena's `data_ptr() + offset`; `async_tensor_h2d` is `torch.tensor(..., device=)`.
  Before d6af803 (0.27.1) the kernel takes no stride column (`_meta` has 5 fields, the page doubles as the
  stride, no mask): the adapter fills that `_meta`, the tables are the model's `pre_d6af803` plans of the
  cases' geometries (raw tables with stride := page, drawn again when a write would leave the buffer) and
  the launch is `launch_config(table, pre_d6af803)` (the unmasked launcher's formula).
  Probe `zeroing_preserves_other_bytes` (the d6af803 seed bug's frame property, kernel side): upstream's own
  `KVBlockZeroer.__init__` plans the pinned regression geometries (and drawn ones), upstream's kernel zeroes
  them on a patterned arena with red zones (guard bytes) around every allocation, and no byte outside the
  zeroed blocks' elements may change (`owned_bytes`, from the view elements).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvsim.engine.errors import ConfigError

from ..kernels import Divergence, KernelCheck, Probe, as_target, first_byte_difference, unpacked
from ..source import EngineSource

UTILS = "vllm/v1/worker/utils.py"
MERGE = "vllm/v1/attention/ops/triton_merge_attn_states.py"
ZERO_SYMBOLS = ("KVBlockZeroer", "_zero_kv_blocks_kernel")
MERGE_SYMBOLS = ("merge_attn_states", "merge_attn_states_kernel")
META_FIELDS = 6  # (seg_addrs, seg_block_strides, seg_page_sizes, max_chunks, blk_size, n_segs)


# --- child side (torch and triton are imported here only) ---------------------------------------------

from .common import load_in_child as _load


def run_zero(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    ns = _load(source, UTILS, ZERO_SYMBOLS, device)
    memory = torch.from_numpy(unpack(case["memory"])).to(device)
    base = memory.data_ptr()
    zeroer = object.__new__(ns.KVBlockZeroer)
    zeroer.device = torch.device(device)
    addrs = torch.tensor([base + a for a in case["addrs"]], dtype=torch.uint64, device=device)
    pages = torch.tensor(case["pages"], dtype=torch.int64, device=device)
    if case["strides"] is None:  # before d6af803: (seg_addrs, seg_page_sizes, max_chunks, blk_size, n_segs)
        zeroer._meta = (addrs, pages, case["max_chunks"], case["block_size"], len(case["addrs"]))
    else:
        zeroer._meta = (addrs, torch.tensor(case["strides"], dtype=torch.int64, device=device), pages,
                        case["max_chunks"], case["block_size"], len(case["addrs"]))
    zeroer.zero_block_ids(list(case["block_ids"]))
    if device == "cuda":
        torch.cuda.synchronize()
    return {"memory": pack(memory.cpu().numpy())}


CHILD_KERNELS = {"vllm.zero_kv_blocks": run_zero}


# --- parent side: the zeroing kernel ------------------------------------------------------------------

def zero_document(memory: np.ndarray, table: Any, block_ids: Any, launch: Any = None, *,
                  pre: bool = False) -> dict[str, Any]:
    """The child's case; for the launcher before d6af803 (`pre`) without the stride column and with the unmasked
    launch of the table's (pre_d6af803) variant, else with the fixed launcher's."""
    from kvsim.gpu_oracle.runtime.asan import pack
    from kvsim.models.kv_zeroing.zeroer import FIXED, SegmentTable, launch_config

    if launch is None:
        config = launch_config(SegmentTable(table.segments, table.num_blocks, table.variant if pre else FIXED))
        launch = (config.block_size, config.max_chunks)
    return {"memory": pack(memory), "addrs": [s.addr for s in table.segments],
            "strides": None if pre else [s.block_stride for s in table.segments],
            "pages": [s.page for s in table.segments], "block_ids": [int(b) for b in block_ids],
            "block_size": launch[0], "max_chunks": launch[1]}


_STRIDES: dict[str, bool] = {}


def has_strides(source: EngineSource) -> bool:
    """The d6af803 kernel takes a per-segment block stride; before it (0.27.1) the page doubles as the stride."""
    import ast

    key = str(source.file(UTILS))
    if key not in _STRIDES:
        tree = ast.parse(source.file(UTILS).read_text(encoding="utf-8", errors="replace"))
        kernel = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                       and n.name == "_zero_kv_blocks_kernel"), None)
        _STRIDES[key] = kernel is None or "seg_block_strides_ptr" in [a.arg for a in kernel.args.args]
    return _STRIDES[key]


def pre_fix_table(case: Any) -> Any:
    """The table a pre-d6af803 launcher runs for a KernelCase: the model's pre_d6af803 plan of its geometry, or
    its raw rows with stride := page; Hypothesis draws again when a write would leave the buffer."""
    from hypothesis import reject

    from kvsim.models.kv_zeroing.zeroer import VARIANTS, Segment, SegmentTable, plan_segments, write_spans

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


def zero_compare(child: Any, case: Any) -> Divergence | None:
    """A gpu_oracle KernelCase (random bytes) or PinnedCase (sentinel bytes; the fixed plan, or pre_d6af803's
    on a release before d6af803)."""
    from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import SENTINEL, KernelCase
    from kvsim.models.kv_zeroing.geometry import Arena
    from kvsim.models.kv_zeroing.zeroer import VARIANTS, plan_segments, zero_blocks

    pre = not has_strides(child.source)
    if isinstance(case, KernelCase):
        memory, ids = case.memory(), case.block_ids
        table = pre_fix_table(case) if pre else case.table
    else:
        arena = Arena.for_geometry(case.geometry)
        table = plan_segments(case.geometry, variant=VARIANTS["pre_d6af803" if pre else "fixed"], arena=arena)
        memory, ids = np.full(arena.size, SENTINEL, dtype=np.uint8), case.block_ids
    expected = memory.copy()
    zero_blocks(expected, table, ids)
    got = unpacked(child.call("vllm.zero_kv_blocks", zero_document(memory, table, ids, pre=pre)), "memory")
    differ = first_byte_difference(expected, got)
    if differ is None:
        return None
    return Divergence(case, f"reference memset (zero_blocks, {table.variant.name} table)",
                      "KVBlockZeroer.zero_block_ids", differ)


def frame_cases() -> list[tuple[str, Any, tuple[int, ...]]]:
    """The pinned regression geometries, the last-block overrun cases, and a few drawn kv-zeroing layouts."""
    from hypothesis import HealthCheck, given, settings

    from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import overrun_cases, pinned_geometries
    from kvsim.properties.kv_zeroing.strategies import ZEROING_CASES

    cases = list(pinned_geometries())
    cases += [(f"{c.name}, last block", c.geometry, c.block_ids) for c in overrun_cases() if c.variant == "fixed"]
    drawn: list[Any] = []

    def keep(case: Any) -> None:
        drawn.append(case)

    settings(max_examples=FRAME_DRAWN, database=None, derandomize=True, deadline=None,
             suppress_health_check=list(HealthCheck))(given(ZEROING_CASES)(keep))()
    return cases + [(f"drawn layout {i}", c.geometry, tuple(c.block_ids)) for i, c in enumerate(drawn)]


FRAME_DRAWN = 8


def frame_probe(child: Any) -> str | None:
    """The d6af803 seed bug's frame property on upstream's planner and kernel: bytes outside the zeroed blocks
    (other layers of a packed row, padding, other blocks, the guard bytes around each allocation) keep their value."""
    from kvsim.models.kv_zeroing.geometry import Arena, owned_bytes, owner_of

    from .zeroer import load as load_zeroer, release_variant, upstream_table, whole_logical_blocks

    up = load_zeroer(child.source)
    variant = release_variant(child.source.version)
    for name, geometry, ids in frame_cases():
        if up.takes_num_blocks and not whole_logical_blocks(geometry):
            continue  # a view 0.33.0's allocator does not build (the KVBlockZeroer target's RATIO_SHAPE)
        arena = Arena.for_geometry(geometry)
        planned = upstream_table(up, geometry, arena, variant)
        if isinstance(planned, BaseException):
            continue
        table, (block, max_chunks, _) = planned
        if up.has_strides != has_strides(child.source):
            return "the zeroer's _meta and the kernel disagree on the stride column"
        before = (np.arange(arena.size, dtype=np.int64) * 131 % 251 + 1).astype(np.uint8)  # no zero byte
        document = zero_document(before, table, ids, (block, max_chunks), pre=not up.has_strides)
        after = unpacked(child.call("vllm.zero_kv_blocks", document), "memory")
        foreign = (after != before) & ~owned_bytes(geometry, arena, ids)
        if foreign.any():
            outside = int((foreign & ~arena.inside()).sum())
            first = owner_of(geometry, arena, int(np.flatnonzero(foreign)[0]))
            return (f"{name}: bytes changed outside blocks {sorted(set(ids))}: expected 0, got {int(foreign.sum())}, "
                    f"{outside} of them guard bytes outside every allocation (first at {first})")
    return None


def _zero_strategy() -> Any:
    from kvsim.gpu_oracle.kernels.zero_kv_blocks import strategies

    return strategies.kernel_cases


def _zero_pinned() -> list[Any]:
    from kvsim.gpu_oracle.kernels.zero_kv_blocks.cases import sentinel_cases

    return [c for c in sentinel_cases() if c.chunk_width is None]  # upstream's launcher picks the chunk width


ZERO_KV_BLOCKS = KernelCheck(
    engine="vllm", name="zero-kv-blocks-kernel", relpath=UTILS, symbols=ZERO_SYMBOLS, model="kv-zeroing",
    doc=__doc__.split("\n* ")[1].strip(), kernel="vllm.zero_kv_blocks", strategy=_zero_strategy,
    compare=zero_compare, pinned=_zero_pinned,
    probes=(Probe("zeroing_preserves_other_bytes",
                  "the d6af803 frame property on upstream's planner and kernel, guard bytes around each allocation",
                  frame_probe),))


CHECKS = (ZERO_KV_BLOCKS,)


TARGETS = tuple(as_target(c) for c in CHECKS)

