"""vLLM KV offload worker (`vllm/v1/kv_offload/cpu/gpu_worker.py`) against the `kv-offload` worker mapping.

Two targets, both on upstream's own `SingleDirectionOffloadingHandler` (loaded with `compute_sub_block_ptrs`,
`cdiv` and the spec classes it uses; torch real, on CPU):

* `offload_transfer_async`: random geometries (the model's `swap_cases`: 1-3 tensors, padded pages and CPU
  rows, 1-3 groups sharing tensors, blocks_per_chunk 1-8, partial first and last chunks), both directions.
  Upstream's handler plans the batch and hands it to `swap_blocks_batch`, which the adapter replaces by a
  recorder; every recorded `(src_ptr, dst_ptr, size)` is turned into (tensor, src offset, dst offset, size)
  by the tensor bases and compared, in batch order, with the model's `plan_swap(...).ops`; the transfer's
  `num_bytes` with the model's. Then the model's properties `worker_mapping_is_a_bijection_with_page_bytes`
  and `round_trip_gpu_cpu_gpu_is_identity` are checked on upstream's triples (the round trip by doing the
  recorded copies on the CPU tensors). One input in five drops the last chunk id or adds a spare one: both
  sides must refuse it (upstream's assertions, the model's ConfigError on `chunk_ids`).
* `offload_get_finished`: jobs submitted to one handler, their end events fired in a random order between
  polls; the job ids each `get_finished` returns equal the model's `TransferQueue`'s.

Conventions: the GPU tensors are CPU tensors behind a view that reports `is_cuda` (the handler asserts it);
`current_platform` is a stand-in with a stream context and the CUDA events are stand-ins whose `query()` the
adapter controls; the descriptor buffers are plain CPU int64 tensors (`PIN_MEMORY` is not read). The CPU spec
is upstream's `BlockIDsLoadStoreSpec` base (`CPULoadStoreSpec` adds only the `chunk_ids` alias). Only the
direct layout is compared (the canonical layout's copy plans need certified mappings the model does not have).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.kv_offload.mapping import CopyOp, SwapPlan, apply_swap, plan_swap, side_bytes
from kvsim.models.kv_offload.mapping_jobs import TransferQueue

from ..loader import check_signature, load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive

RELPATH = "vllm/v1/kv_offload/cpu/gpu_worker.py"
BASE_RELPATH = "vllm/v1/kv_offload/base.py"  # GPULoadStoreSpec and its BlockIDsLoadStoreSpec base
SYMBOLS = ("SingleDirectionOffloadingHandler", "compute_sub_block_ptrs")
SUB_BLOCK_PARAMS = ("block_ids", "blocks_per_chunk", "output", "tensor", "skip_count")
TRANSFER_PARAMS = ("self", "job_id", "src_spec", "dst_spec")


class FakeEvent:
    """A CUDA event whose completion the adapter decides."""

    def __init__(self) -> None:
        self.fired = False

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return self.fired

    def synchronize(self) -> None:
        self.fired = True

    def elapsed_time(self, other: Any) -> float:
        return 1.0


class FakeStream:
    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


PLATFORM = SimpleNamespace(Stream=FakeStream, current_stream=FakeStream, stream=lambda s: contextlib.nullcontext(),
                           is_xpu=lambda: False, is_rocm=lambda: False)


class DeviceView:
    """A CPU int8 tensor that passes the handler's `is_cuda` assertion (pointer arithmetic only)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.dtype, self.ndim, self.shape = tensor, tensor.dtype, tensor.ndim, tensor.shape
        self.is_cuda, self.is_xpu = True, False

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def stride(self, dim: int) -> int:
        return self.tensor.stride(dim)


def load(source: EngineSource) -> SimpleNamespace:
    import torch

    first = load_definitions(source.file(BASE_RELPATH), ["GPULoadStoreSpec"], where=BASE_RELPATH,
                             version=source.label)
    gpu_spec = first.GPULoadStoreSpec
    base = next(c for c in gpu_spec.__mro__ if c.__name__ == "BlockIDsLoadStoreSpec")
    buffers = lambda n: tuple(torch.zeros(max(n, 1), dtype=torch.int64) for _ in range(3))  # noqa: E731
    ns = load_definitions(source.file(RELPATH), list(SYMBOLS), where=RELPATH, version=source.label,
                          extra_globals={"current_platform": PLATFORM, "_new_descriptor_buffers": buffers,
                                         "BlockIDsLoadStoreSpec": base, "GPULoadStoreSpec": gpu_spec,
                                         "_select_swap_blocks_fn": lambda *a, **k: None})
    check_signature(ns.compute_sub_block_ptrs, SUB_BLOCK_PARAMS, f"{RELPATH}:compute_sub_block_ptrs")
    check_signature(ns.SingleDirectionOffloadingHandler.transfer_async, TRANSFER_PARAMS,
                    f"{RELPATH}:SingleDirectionOffloadingHandler.transfer_async")
    return SimpleNamespace(handler=ns.SingleDirectionOffloadingHandler, gpu_spec=gpu_spec, cpu_spec=base)


class Side:
    """One side's tensors as torch views over numpy bytes, and pointer -> (tensor, offset) resolution."""

    def __init__(self, geometry: Any, gpu: bool, buffers: list[np.ndarray]) -> None:
        import torch

        self.arrays = [b.copy() for b in buffers]
        self.tensors = []
        for t, array in enumerate(self.arrays):
            flat = torch.from_numpy(array).view(torch.int8)
            if gpu:
                self.tensors.append(DeviceView(flat.view(geometry.num_gpu_blocks, geometry.gpu_page_bytes[t])))
            else:
                self.tensors.append(flat.as_strided((geometry.num_cpu_chunks, geometry.cpu_page_bytes(t)),
                                                    (geometry.cpu_row_stride(t), 1)))

    def resolve(self, ptr: int, size: int) -> tuple[int, int] | None:
        for t, array in enumerate(self.arrays):
            base = array.ctypes.data
            if base <= ptr and ptr + size <= base + len(array):
                return t, ptr - base
        return None


def run_swap(ns: SimpleNamespace, case: Any, gpu_to_cpu: bool, spec: Any, src_bufs: list[np.ndarray],
             dst_bufs: list[np.ndarray]) -> tuple[list[Any], int, list[np.ndarray]]:
    """Upstream's batch for one transfer: [(tensor, src, dst, size) or ("outside", ...)], num_bytes, and the dst
    tensors after doing the recorded copies."""
    g = case.geometry
    gpu, cpu = (Side(g, True, src_bufs), Side(g, False, dst_bufs)) if gpu_to_cpu else \
        (Side(g, True, dst_bufs), Side(g, False, src_bufs))
    refs = [[SimpleNamespace(tensor_idx=r.tensor_idx, page_size_bytes=r.page_size_bytes, mapping=None) for r in group]
            for group in g.group_data_refs]
    handler = ns.handler(gpu.tensors, cpu.tensors, g.blocks_per_chunk, refs, gpu_to_cpu)
    recorded: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    handler._swap_blocks_batch = lambda s, d, n, **kw: recorded.append((s.numpy().copy(), d.numpy().copy(),
                                                                        n.numpy().copy()))
    handler._event_pool.extend([FakeEvent(), FakeEvent()])
    gpu_spec = ns.gpu_spec(list(spec.block_ids), list(spec.group_sizes), list(spec.block_indices))
    cpu_spec = ns.cpu_spec(list(spec.chunk_ids))
    handler.transfer_async(1, *((gpu_spec, cpu_spec) if gpu_to_cpu else (cpu_spec, gpu_spec)))
    src_side, dst_side = (gpu, cpu) if gpu_to_cpu else (cpu, gpu)
    ops: list[Any] = []
    for src, dst, sizes in recorded:
        for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist()):
            a, b = src_side.resolve(s, n), dst_side.resolve(d, n)
            if a is None or b is None or a[0] != b[0]:
                ops.append(("outside", a, b, n))
                continue
            ctypes.memmove(d, s, n)
            ops.append((a[0], a[1], b[1], n))
    return ops, handler._transfers[-1].num_bytes, dst_side.arrays


CHANGES = ("exact", "exact", "exact", "one chunk id short", "one chunk id extra")


def changed_spec(case: Any, change: str) -> Any:
    """The case's spec, or (where the case allows it) one with the last chunk id dropped or a spare slot added:
    a transfer both sides must refuse (upstream asserts, the model raises ConfigError)."""
    spec, used = case.spec, set(case.spec.chunk_ids)
    spare = [c for c in range(case.geometry.num_cpu_chunks) if c not in used]
    if change == "one chunk id short" and spec.chunk_ids:
        return replace(spec, chunk_ids=spec.chunk_ids[:-1])
    if change == "one chunk id extra" and spare:
        return replace(spec, chunk_ids=spec.chunk_ids + (spare[0],))
    return spec


def run_transfer(source: EngineSource, options: RunOptions) -> TargetResult:
    from hypothesis import strategies as st

    from kvsim.properties.kv_offload import mapping as props
    from kvsim.properties.kv_offload.mapping_strategies import swap_cases

    started = time.perf_counter()
    ns = load(source)
    result = TargetResult("offload_transfer_async", source.version)
    failures: dict[str, str] = {}

    refused = [0]

    def check(drawn: Any) -> None:
        case, gpu_to_cpu, change = drawn
        g = case.geometry
        spec = changed_spec(case, change)
        src, dst = case.buffers(gpu_to_cpu, 1), case.buffers(not gpu_to_cpu, 2)
        result.compared += 1
        try:
            model = plan_swap(g, spec, gpu_to_cpu)
        except ConfigError as exc:
            model, model_refusal = None, str(exc)
        try:
            got, num_bytes, after = run_swap(ns, case, gpu_to_cpu, spec, src, dst)
        except AssertionError as exc:
            if model is not None:
                result.diverge(_describe(case, gpu_to_cpu, spec), {"ops": len(model.ops)},
                               f"AssertionError in transfer_async: {exc}")
            else:
                refused[0] += 1
            return
        if model is None:
            result.diverge(_describe(case, gpu_to_cpu, spec), f"refuses: {model_refusal}", {"ops": len(got)})
            return
        want = [(o.tensor_idx, o.src, o.dst, o.size) for o in model.ops]
        if got != want or num_bytes != model.num_bytes:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            result.diverge(_describe(case, gpu_to_cpu, spec),
                           {"ops": len(want), "num_bytes": model.num_bytes, "first": want[first:first + 1]},
                           {"ops": len(got), "num_bytes": num_bytes, "first": got[first:first + 1]})
            return
        if any(not np.array_equal(a, b) for a, b in zip(after, apply_swap(model, src, dst))):
            result.diverge(_describe(case, gpu_to_cpu, spec), "the model's bytes", "other bytes after the copies")
        if spec != case.spec:
            return
        for name, fn in (("worker_mapping_is_a_bijection_with_page_bytes",
                          props.worker_mapping_is_a_bijection_with_page_bytes),
                         ("round_trip_gpu_cpu_gpu_is_identity", props.round_trip_gpu_cpu_gpu_is_identity)):
            try:
                with _plans_from_upstream(ns, case):
                    fn(case, None)
            except PropertyViolation as exc:
                failures.setdefault(name, str(exc))

    drive(st.tuples(swap_cases(), st.booleans(), st.sampled_from(CHANGES)), check, options)
    for name in ("worker_mapping_is_a_bijection_with_page_bytes", "round_trip_gpu_cpu_gpu_is_identity"):
        result.prop(name, "fails" if name in failures else "holds", failures.get(name, ""))
    result.note = (f"random geometries, both directions; triples in batch order, bytes, and the model's properties; "
                   f"{refused[0]} inconsistent chunk lists refused by both")
    return result.finish(started)


@contextlib.contextmanager
def _plans_from_upstream(ns: SimpleNamespace, case: Any):  # type: ignore[no-untyped-def]
    """Inside, the model's properties see upstream's plans: the properties module's `plan_swap` answers with
    upstream's recorded triples (its `apply_swap` then does exactly those copies)."""
    from kvsim.properties.kv_offload import mapping as props

    saved = props.plan_swap

    def upstream_plan(geometry: Any, spec: Any, gpu_to_cpu: bool) -> SwapPlan:
        src = [np.zeros(n, np.uint8) for n in side_bytes(geometry, gpu_to_cpu)]
        dst = [np.zeros(n, np.uint8) for n in side_bytes(geometry, not gpu_to_cpu)]
        try:
            ops, num_bytes, _ = run_swap(ns, case, gpu_to_cpu, spec, src, dst)
        except AssertionError as exc:
            raise ConfigError("upstream transfer_async", "a plan", f"AssertionError: {exc}") from None
        if any(op[0] == "outside" for op in ops):
            raise PropertyViolation(f"upstream copies: expected inside the tensors, got {ops}")
        return SwapPlan(gpu_to_cpu, (), tuple(CopyOp(*op) for op in ops), num_bytes)

    props.plan_swap = upstream_plan  # type: ignore[assignment]
    try:
        yield
    finally:
        props.plan_swap = saved


def _describe(case: Any, gpu_to_cpu: bool, spec: Any) -> dict[str, Any]:
    g, s = case.geometry, spec
    return {"direction": "gpu_to_cpu" if gpu_to_cpu else "cpu_to_gpu", "gpu_page_bytes": list(g.gpu_page_bytes),
            "blocks_per_chunk": g.blocks_per_chunk, "cpu_row_padding": g.cpu_row_padding,
            "refs": [[(r.tensor_idx, r.page_size_bytes) for r in grp] for grp in g.group_data_refs],
            "block_ids": list(s.block_ids), "group_sizes": list(s.group_sizes),
            "block_indices": list(s.block_indices), "chunk_ids": list(s.chunk_ids)}


def run_order(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.kv_offload.mapping_strategies import QUEUE_CASES
    from kvsim.models.kv_offload.mapping import DataRef, SwapGeometry

    started = time.perf_counter()
    ns = load(source)
    result = TargetResult("offload_get_finished", source.version)
    geometry = SwapGeometry((4,), 2, 2, 1, ((DataRef(0, 4),),))

    def check(queue_case: Any) -> None:
        gpu = Side(geometry, True, [np.zeros(8, np.uint8)])
        cpu = Side(geometry, False, [np.zeros(8, np.uint8)])
        refs = [[SimpleNamespace(tensor_idx=0, page_size_bytes=4, mapping=None)]]
        handler = ns.handler(gpu.tensors, cpu.tensors, 1, refs, True)
        handler._swap_blocks_batch = lambda *a, **k: None
        model, events = TransferQueue(), {}
        for job_id, _ in queue_case.jobs:
            handler._event_pool.extend([FakeEvent(), FakeEvent()])
            handler.transfer_async(job_id, ns.gpu_spec([0], [1], [0]), ns.cpu_spec([1]))
            events[job_id] = handler._transfer_events[job_id]
            model.transfer_async(job_id, 4)
        polls_model, polls_upstream = [], []
        for step in queue_case.steps:
            if step[0] == "fire":
                events[step[1]].fired = True
                model.complete(step[1])
            else:
                polls_upstream.append([(r.job_id, r.success, r.transfer_size) for r in handler.get_finished()])
                polls_model.append([(r.job_id, r.success, r.transfer_size) for r in model.get_finished()])
        result.compared += 1
        if polls_upstream != polls_model:
            result.diverge({"jobs": [j for j, _ in queue_case.jobs], "steps": [list(s) for s in queue_case.steps]},
                           polls_model, polls_upstream)

    drive(QUEUE_CASES, check, options)
    result.note = "1-8 jobs, end events fired in any order between polls"
    return result.finish(started)


# --- upstream's Triton swap kernel (`swap_blocks_triton.py`) on the model's triples, in the kernel child -----

TRITON_RELPATH = "vllm/v1/kv_offload/cpu/swap_blocks_triton.py"
TRITON_SYMBOLS = ("_swap_blocks_kernel", "NUM_SMS", "THRESHOLD_BYTES", "MIN_N")
CHILD_KERNEL = "vllm.offload_swap_blocks_triton"


def run_swap_triton(source: EngineSource, case: Any, device: str) -> dict[str, Any]:
    """Child side: the release's `_swap_blocks_kernel` on the triples of `case` (host sources, pinned on CUDA;
    device destinations), launched as `swap_blocks_batch` launches it, with `_select_swap_blocks_fn`'s
    BYTES_PER_CHUNK; the destination tensors afterwards."""
    import torch
    import triton

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from ..triton_child import load_upstream
    from .common import vllm_modules

    ns = load_upstream(source, TRITON_RELPATH, TRITON_SYMBOLS, modules=vllm_modules(device))
    src = [torch.from_numpy(unpack(d)) for d in case["src"]]
    if device == "cuda":
        src = [t.pin_memory() for t in src]
    dst = [torch.from_numpy(unpack(d)).to(device) for d in case["dst"]]
    ops = case["ops"]
    if ops:
        def addresses(tensors: list[Any], pick: int) -> Any:
            return torch.tensor([tensors[op[0]].data_ptr() + op[pick] for op in ops], dtype=torch.int64,
                                device=device)

        sizes = torch.tensor([op[3] for op in ops], dtype=torch.int64, device=device)
        chunk = min(triton.next_power_of_2(max(case["page_sizes"])), 8192)
        ns._swap_blocks_kernel[(min(ns.NUM_SMS, len(ops)),)](addresses(src, 1), addresses(dst, 2), sizes, len(ops),
                                                             BYTES_PER_CHUNK=chunk)
        if device == "cuda":
            torch.cuda.synchronize()
    return {"dst": [pack(t.cpu().numpy()) for t in dst], "threshold": ns.THRESHOLD_BYTES, "min_n": ns.MIN_N}


CHILD_KERNELS = {CHILD_KERNEL: run_swap_triton}


def _triton_strategy() -> Any:
    from kvsim.properties.kv_offload.mapping_strategies import swap_cases

    return swap_cases(max_page=64, align=8)


def triton_compare(child: Any, case: Any) -> Any:
    """Parent side: the model's CPU->GPU plan run by upstream's kernel against the model's `apply_swap`."""
    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from ..kernels import Divergence, first_byte_difference

    plan = plan_swap(case.geometry, case.spec, False)
    src, dst = case.buffers(False, 1), case.buffers(True, 2)
    pages = [r.page_size_bytes for refs in case.geometry.group_data_refs for r in refs]
    result = child.call(CHILD_KERNEL, {"src": [pack(b) for b in src], "dst": [pack(b) for b in dst],
                                       "ops": [[o.tensor_idx, o.src, o.dst, o.size] for o in plan.ops],
                                       "page_sizes": pages})
    if max(pages) >= result["threshold"]:
        return None  # upstream picks the DMA path for pages this large
    want = apply_swap(plan, src, dst)
    for t, (a, b) in enumerate(zip(want, map(unpack, result["dst"]))):
        where = first_byte_difference(a, b)
        if where:
            return Divergence(_describe(case, False, case.spec), f"apply_swap: tensor {t}", f"tensor {t}: {where}",
                              f"{len(plan.ops)} triples")
    return None


def run_triton(source: EngineSource, options: RunOptions) -> TargetResult:
    from .. import triton_child
    from ..kernels import KernelCheck, run_kernel_check

    if __name__ not in triton_child.KERNEL_MODULES:
        result = TargetResult("offload-swap-triton", source.version, status="skipped",
                              note=f"the kernel child does not load {__name__}: add it to "
                                   f"kvsim.conform.triton_child.KERNEL_MODULES")
        return result
    check = KernelCheck(engine="vllm", name="offload-swap-triton", relpath=TRITON_RELPATH, symbols=TRITON_SYMBOLS,
                        model="kv-offload", doc=TRITON_DOC, kernel=CHILD_KERNEL, strategy=_triton_strategy,
                        compare=triton_compare)
    return run_kernel_check(check, source, options)


TRITON_DOC = ("upstream's Triton swap_blocks_batch kernel (the CPU->GPU fast path for small 8-byte-aligned pages) on "
              "the model's triples; bytes against apply_swap")

TARGETS = (
    Target("vllm", "offload_transfer_async", RELPATH, SYMBOLS, "kv-offload",
           "the batched swap's (src, dst, size) triples and bytes per transfer, random geometries", run_transfer),
    Target("vllm", "offload_get_finished", RELPATH, SYMBOLS, "kv-offload",
           "transfers reported in submission order whatever order their events fire in", run_order),
    Target("vllm", "offload-swap-triton", TRITON_RELPATH, TRITON_SYMBOLS, "kv-offload", TRITON_DOC, run_triton),
)
