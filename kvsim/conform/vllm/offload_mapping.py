"""vLLM KV offload worker (`vllm/v1/kv_offload/cpu/gpu_worker.py`) against the `kv-offload` worker mapping.

Three adapters, on upstream's own `SingleDirectionOffloadingHandler` (loaded with `compute_sub_block_ptrs`, `cdiv`
and the spec classes it uses; torch real, on CPU) and its Triton swap kernel:

* `TRANSFER` (`offload_transfer_async`, a Differential): random geometries (the model's `swap_cases`: 1-3 tensors,
  padded pages and CPU rows, 1-3 groups sharing tensors, blocks_per_chunk 1-8, partial first and last chunks),
  both directions, the host memory pinned or not. Upstream's handler plans the batch and hands it to its swap
  function, which the adapter's `_select_swap_blocks_fn` stand-in makes a recorder (and records what it was
  asked with: the direction and whether the host memory is pinned); every recorded `(src_ptr, dst_ptr, size)` is
  turned into (tensor, src offset, dst offset, size) by the tensor bases and the copies are done on the CPU
  tensors. Compared, field by field: the return value, the triples in batch order, the transfer's `num_bytes`,
  the descriptor buffers' size (exact for the direct layout: one per block and data reference), how many batches
  were handed over (none for an empty transfer) and with which `is_src_access_order_any`, and the destination
  tensors' bytes afterwards, against the model's `plan_swap` and `apply_swap`. One input in five drops the last
  chunk id or adds a spare one: both sides must refuse it (upstream's assertions, the model's ConfigError).
  One input in two runs after earlier (empty) transfers on the same handler: one or two still in flight (the
  stream waits on the last one's end event) or one finished (its descriptor buffers are pooled, and too small: the
  handler grows them). One input in four is on XPU tensors (the handler asserts CUDA or XPU); a probe builds a
  handler of no tensors, which upstream must refuse as the model refuses a geometry of none.
  The model's properties `worker_mapping_is_a_bijection_with_page_bytes` and
  `round_trip_gpu_cpu_gpu_is_identity` are checked on upstream's triples.
* `FINISHED` (`offload_get_finished`, a Lockstep): one handler and the model's `TransferQueue`; transfers
  submitted (1-4 blocks each), end events fired in any order, `get_finished` polled, `wait` on some job ids (their
  events synchronized), all interleaved; after every step the results and the jobs in flight are compared.
  Events, streams and descriptor buffers are reused from the handler's pools as upstream reuses them.
* `SWAP_TRITON` (`offload-swap-triton`, a kernel Differential): upstream's `swap_blocks_batch` launcher and its
  Triton `_swap_blocks_kernel` in the kernel child, on the model's CPU->GPU triples (8-byte-aligned pages up to
  64 bytes, 0-100 triples), `bytes_per_chunk` drawn (8-256) and `is_src_access_order_any` drawn; the destination
  tensors' bytes against `apply_swap` (pinned first: 24 triples of 64- and 56-byte pages, and MIN_N triples one
  word a chunk), and the path taken: the launcher's documented rule is the DMA path (`ops.swap_blocks_batch`, a
  stand-in copying by the descriptors it is handed and recording its `is_src_access_order_any`) below
  `MIN_N` descriptors (upstream's constant), the kernel from there.

Conventions: the GPU tensors are CPU tensors behind a view that reports `is_cuda` (the handler asserts it);
`current_platform` is a stand-in with a stream context and the CUDA events are stand-ins whose `query()` the
adapter controls (`record` re-arms a reused one); the descriptor buffers are plain CPU int64 tensors of the size
asked (`PIN_MEMORY` is not read). The CPU spec is upstream's `BlockIDsLoadStoreSpec` base (`CPULoadStoreSpec`
adds only the `chunk_ids` alias). Only the direct layout is compared (`canonical_layout=False`: the canonical
layout's copy plans need certified mappings the model does not have). In the kernel child the launcher's
address tensors are wrapped so `.to("cuda")` keeps them where they are under the interpreter.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential, Lockstep, Operation, Probe
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.kv_offload.mapping import CopyOp, DataRef, SwapGeometry, SwapPlan, TransferSpec, apply_swap, \
    plan_swap, side_bytes
from kvsim.models.kv_offload.mapping_jobs import TransferQueue

from ..kernels import call_kernel, kernel_examples
from ..loader import check_signature
from ..source import EngineSource

RELPATH = "vllm/v1/kv_offload/cpu/gpu_worker.py"
BASE_RELPATH = "vllm/v1/kv_offload/base.py"  # GPULoadStoreSpec and its BlockIDsLoadStoreSpec base
SUB_BLOCK_PARAMS = ("block_ids", "blocks_per_chunk", "output", "tensor", "skip_count")
TRANSFER_PARAMS = ("self", "job_id", "src_spec", "dst_spec")
REFUSALS = Exact(refusals=("AssertionError",))


class FakeEvent:
    """A CUDA event whose completion the adapter decides (recording it again re-arms it)."""

    def __init__(self) -> None:
        self.fired = False

    def record(self, stream: Any = None) -> None:
        self.fired = False

    def query(self) -> bool:
        return self.fired

    def synchronize(self) -> None:
        self.fired = True

    def elapsed_time(self, other: Any) -> float:
        return 1.0


class FakeStream:
    def __init__(self) -> None:
        self.waited: list[Any] = []

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        self.waited.append(event)


PLATFORM = SimpleNamespace(Stream=FakeStream, current_stream=FakeStream, stream=lambda s: contextlib.nullcontext(),
                           is_xpu=lambda: False, is_rocm=lambda: False)


class DeviceView:
    """A CPU int8 tensor that passes the handler's device assertion as a CUDA or an XPU tensor (pointer arithmetic
    only)."""

    def __init__(self, tensor: Any, xpu: bool = False) -> None:
        self.tensor, self.dtype, self.ndim, self.shape = tensor, tensor.dtype, tensor.ndim, tensor.shape
        self.is_cuda, self.is_xpu = not xpu, xpu

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def stride(self, dim: int) -> int:
        return self.tensor.stride(dim)


class SwapRecorder:
    """What `_select_swap_blocks_fn` gives the handler: a swap that records its batches, and what it was asked."""

    def __init__(self, refs: Any, gpu_to_cpu: bool, host_memory_is_pinned: bool = True) -> None:
        self.selected_for = {"gpu_to_cpu": gpu_to_cpu, "host_memory_is_pinned": host_memory_is_pinned}
        self.batches: list[dict[str, Any]] = []

    def __call__(self, src: Any, dst: Any, sizes: Any, **kwargs: Any) -> None:
        self.batches.append({"src": src.numpy().copy(), "dst": dst.numpy().copy(), "sizes": sizes.numpy().copy(),
                             "kwargs": dict(kwargs)})


def buffers(n: int) -> tuple[Any, Any, Any]:
    """`_new_descriptor_buffers`: plain CPU int64 tensors of the size asked."""
    import torch

    return tuple(torch.zeros(n, dtype=torch.int64) for _ in range(3))  # type: ignore[return-value]


def loading(upstream: Any, up: SimpleNamespace) -> dict[str, Any]:
    """gpu_worker.py loads with the platform, descriptor-buffer and swap-selection stand-ins and base.py's spec
    classes (loaded first)."""
    if upstream.file != RELPATH:
        return {}
    return {"extra_globals": {"current_platform": PLATFORM, "_new_descriptor_buffers": buffers,
                              "BlockIDsLoadStoreSpec": cpu_spec(up), "GPULoadStoreSpec": up.GPULoadStoreSpec,
                              "_select_swap_blocks_fn": SwapRecorder}}


def cpu_spec(up: SimpleNamespace) -> type:
    """The CPU side's spec class: `GPULoadStoreSpec`'s `BlockIDsLoadStoreSpec` base."""
    return next(c for c in up.GPULoadStoreSpec.__mro__ if c.__name__ == "BlockIDsLoadStoreSpec")


def prepare(ctx: Context) -> None:
    import inspect

    check_signature(ctx.up.compute_sub_block_ptrs, SUB_BLOCK_PARAMS, f"{RELPATH}:compute_sub_block_ptrs")
    check_signature(ctx.up.SingleDirectionOffloadingHandler.transfer_async, TRANSFER_PARAMS,
                    f"{RELPATH}:SingleDirectionOffloadingHandler.transfer_async")
    # the handler's optional parameters this release has (0.28.0: canonical_layout; 0.33.0: host_memory_is_pinned)
    ctx.state["optional"] = set(inspect.signature(ctx.up.SingleDirectionOffloadingHandler.__init__).parameters) & {
        "canonical_layout", "host_memory_is_pinned"}


class Side:
    """One side's tensors as torch views over numpy bytes, and pointer -> (tensor, offset) resolution."""

    def __init__(self, geometry: Any, gpu: bool, arrays: list[np.ndarray], xpu: bool = False) -> None:
        import torch

        self.arrays = [a.copy() for a in arrays]
        self.tensors = []
        for t, array in enumerate(self.arrays):
            flat = torch.from_numpy(array).view(torch.int8)
            if gpu:
                self.tensors.append(DeviceView(flat.view(geometry.num_gpu_blocks, geometry.gpu_page_bytes[t]), xpu))
            else:
                self.tensors.append(flat.as_strided((geometry.num_cpu_chunks, geometry.cpu_page_bytes(t)),
                                                    (geometry.cpu_row_stride(t), 1)))

    def resolve(self, ptr: int, size: int) -> tuple[int, int] | None:
        for t, array in enumerate(self.arrays):
            base = array.ctypes.data
            if base <= ptr and ptr + size <= base + len(array):
                return t, ptr - base
        return None


# -- offload_transfer_async ----------------------------------------------------------------------------------

CHANGES = ("exact", "exact", "exact", "one chunk id short", "one chunk id extra")
# earlier empty transfers on the same handler: one in flight, two in flight (the new one waits on the last), one
# finished
EARLIER = (None, None, None, "in flight", "two in flight", "finished")
IN_FLIGHT = {None: 0, "in flight": 1, "two in flight": 2, "finished": 1}  # the earlier transfers submitted


@dataclass(frozen=True)
class TransferCase:
    case: Any  # a SwapCase
    gpu_to_cpu: bool
    change: str = "exact"
    pinned: bool = True  # host_memory_is_pinned
    earlier: str | None = None
    xpu: bool = False  # the GPU tensors are XPU tensors (the handler asserts CUDA or XPU)

    @property
    def spec(self) -> TransferSpec:
        return changed_spec(self.case, self.change)


def changed_spec(case: Any, change: str) -> TransferSpec:
    """The case's spec, or (where the case allows it) one with the last chunk id dropped or a spare slot added:
    a transfer both sides must refuse (upstream asserts, the model raises ConfigError)."""
    spec, used = case.spec, set(case.spec.chunk_ids)
    spare = [c for c in range(case.geometry.num_cpu_chunks) if c not in used]
    if change == "one chunk id short" and spec.chunk_ids:
        return replace(spec, chunk_ids=spec.chunk_ids[:-1])
    if change == "one chunk id extra" and spare:
        return replace(spec, chunk_ids=spec.chunk_ids + (spare[0],))
    return spec


def transfer_inputs(ctx: Context) -> Any:
    from kvsim.properties.kv_offload.mapping_strategies import swap_cases

    pinned = st.booleans() if "host_memory_is_pinned" in ctx.state["optional"] else st.just(True)
    return st.builds(TransferCase, swap_cases(), st.booleans(), st.sampled_from(CHANGES), pinned,
                     st.sampled_from(EARLIER), st.sampled_from((False, False, False, True)))


def ops_of(triples: Any) -> list[dict[str, int]]:
    return [{"tensor": t, "src": s, "dst": d, "size": n} for t, s, d, n in triples]


def transfer_model(ctx: Context, tc: TransferCase) -> dict[str, Any]:
    g = tc.case.geometry
    plan = plan_swap(g, tc.spec, tc.gpu_to_cpu)
    src, dst = tc.case.buffers(tc.gpu_to_cpu, 1), tc.case.buffers(not tc.gpu_to_cpu, 2)
    return {"returned": True, "ops": ops_of((o.tensor_idx, o.src, o.dst, o.size) for o in plan.ops),
            "num_bytes": plan.num_bytes, "descriptors": len(plan.ops),
            "batches": [{"is_src_access_order_any": not tc.gpu_to_cpu}] if plan.ops else [],
            "selected_for": {"gpu_to_cpu": tc.gpu_to_cpu, "host_memory_is_pinned": tc.pinned},
            "dst": apply_swap(plan, src, dst),
            "waits_for_the_transfer_in_flight": tc.earlier in ("in flight", "two in flight")}


def run_swap(ctx: Context, case: Any, gpu_to_cpu: bool, spec: TransferSpec, src_bufs: list[np.ndarray],
             dst_bufs: list[np.ndarray], *, pinned: bool = True, earlier: str | None = None,
             xpu: bool = False) -> dict[str, Any]:
    """Upstream's handler on one transfer (after earlier empty ones, in flight or finished; `xpu`: on XPU tensors):
    what it returned, its triples (("outside", ...) for a pointer in no tensor), num_bytes, descriptor size,
    batches, whether it waits on the last transfer in flight, and the dst tensors after doing the recorded
    copies."""
    g = case.geometry
    gpu, cpu = (Side(g, True, src_bufs, xpu), Side(g, False, dst_bufs)) if gpu_to_cpu else \
        (Side(g, True, dst_bufs, xpu), Side(g, False, src_bufs))
    refs = [[SimpleNamespace(tensor_idx=r.tensor_idx, page_size_bytes=r.page_size_bytes, mapping=None) for r in group]
            for group in g.group_data_refs]
    optional = {"canonical_layout": False, "host_memory_is_pinned": pinned}
    up = ctx.up
    handler = up.SingleDirectionOffloadingHandler(gpu.tensors, cpu.tensors, g.blocks_per_chunk, refs, gpu_to_cpu,
                                                  **{k: v for k, v in optional.items() if k in ctx.state["optional"]})
    swap = handler._swap_blocks_batch
    handler._event_pool.extend(FakeEvent() for _ in range(6))
    empty = TransferSpec((), tuple(0 for _ in refs), tuple(0 for _ in refs), ())
    for job_id in range(IN_FLIGHT[earlier]):
        submit(up, handler, 2 + job_id, empty, gpu_to_cpu)
        if earlier == "finished":
            handler._transfers[-1].end_event.fired = True
            handler.get_finished()
    in_flight = handler._transfers[-1].end_event if handler._transfers else None
    returned = submit(up, handler, 1, spec, gpu_to_cpu)
    transfer = handler._transfers[-1]
    src_side, dst_side = (gpu, cpu) if gpu_to_cpu else (cpu, gpu)
    ops: list[Any] = []
    for batch in swap.batches:
        for s, d, n in zip(batch["src"].tolist(), batch["dst"].tolist(), batch["sizes"].tolist()):
            a, b = src_side.resolve(s, n), dst_side.resolve(d, n)
            if a is None or b is None or a[0] != b[0]:
                ops.append(("outside", a, b, n))
                continue
            ctypes.memmove(d, s, n)
            ops.append((a[0], a[1], b[1], n))
    return {"returned": returned, "ops": ops, "num_bytes": transfer.num_bytes,
            "descriptors": int(transfer.batch_src.numel()),
            "batches": [{"is_src_access_order_any": b["kwargs"].get("is_src_access_order_any")} for b in swap.batches],
            "selected_for": swap.selected_for, "dst": dst_side.arrays,
            "waits_for_the_transfer_in_flight": in_flight is not None and any(e is in_flight
                                                                             for e in transfer.stream.waited)}


def submit(up: SimpleNamespace, handler: Any, job_id: int, spec: TransferSpec, gpu_to_cpu: bool) -> Any:
    gpu = up.GPULoadStoreSpec(list(spec.block_ids), list(spec.group_sizes), list(spec.block_indices))
    cpu = cpu_spec(up)(list(spec.chunk_ids))
    return handler.transfer_async(job_id, *((gpu, cpu) if gpu_to_cpu else (cpu, gpu)))


def transfer_upstream(ctx: Context, tc: TransferCase) -> dict[str, Any]:
    src, dst = tc.case.buffers(tc.gpu_to_cpu, 1), tc.case.buffers(not tc.gpu_to_cpu, 2)
    got = run_swap(ctx, tc.case, tc.gpu_to_cpu, tc.spec, src, dst, pinned=tc.pinned, earlier=tc.earlier, xpu=tc.xpu)
    got["ops"] = [{"outside": [op[1], op[2], op[3]]} if op[0] == "outside" else
                  {"tensor": op[0], "src": op[1], "dst": op[2], "size": op[3]} for op in got["ops"]]
    return got


@contextlib.contextmanager
def plans_from_upstream(ctx: Context, case: Any) -> Iterator[None]:
    """Inside, the model's properties see upstream's plans: the properties module's `plan_swap` answers with
    upstream's recorded triples (its `apply_swap` then does exactly those copies)."""
    from kvsim.properties.kv_offload import mapping as props

    saved = props.plan_swap

    def upstream_plan(geometry: Any, spec: Any, gpu_to_cpu: bool) -> SwapPlan:
        src = [np.zeros(n, np.uint8) for n in side_bytes(geometry, gpu_to_cpu)]
        dst = [np.zeros(n, np.uint8) for n in side_bytes(geometry, not gpu_to_cpu)]
        try:
            got = run_swap(ctx, case, gpu_to_cpu, spec, src, dst)
        except AssertionError as exc:
            raise ConfigError("upstream transfer_async", "a plan", f"AssertionError: {exc}") from None
        if any(op[0] == "outside" for op in got["ops"]):
            raise PropertyViolation(f"upstream copies: expected inside the tensors, got {got['ops']}")
        return SwapPlan(gpu_to_cpu, (), tuple(CopyOp(*op) for op in got["ops"]), got["num_bytes"])

    props.plan_swap = upstream_plan  # type: ignore[assignment]
    try:
        yield
    finally:
        props.plan_swap = saved


def mapping_check(name: str) -> Check:
    """The model's mapping property `name` on upstream's plans of the input's consistent transfer."""
    def check(ctx: Context, tc: TransferCase, answer: Any) -> None:
        from kvsim.properties.kv_offload import mapping as props

        if tc.change != "exact":
            return
        with plans_from_upstream(ctx, tc.case):
            try:
                getattr(props, name).fn(tc.case, None)
            except ConfigError:  # upstream refused the other direction of a consistent transfer: the differential's
                pass
    return Check(name, check)


def describe_transfer(ctx: Context, tc: TransferCase) -> dict[str, Any]:
    g, s = tc.case.geometry, tc.spec
    shown = {"direction": "gpu_to_cpu" if tc.gpu_to_cpu else "cpu_to_gpu", "gpu_page_bytes": list(g.gpu_page_bytes),
             "blocks_per_chunk": g.blocks_per_chunk, "cpu_row_padding": g.cpu_row_padding,
             "refs": [[[r.tensor_idx, r.page_size_bytes] for r in grp] for grp in g.group_data_refs],
             "block_ids": list(s.block_ids), "group_sizes": list(s.group_sizes),
             "block_indices": list(s.block_indices), "chunk_ids": list(s.chunk_ids)}
    if not tc.pinned:
        shown["host_memory_is_pinned"] = False
    if tc.earlier:
        shown["after_an_empty_transfer"] = tc.earlier
    if tc.xpu:
        shown["device"] = "xpu"
    return shown


def no_tensors_refused(ctx: Context) -> str | None:
    """A handler of no KV tensors: upstream asserts, as the model refuses a geometry of none."""
    try:
        SwapGeometry((), 1, 1, 1, ((),))
    except ConfigError:
        pass
    else:
        return "the model accepted a geometry of no tensor"
    optional = {"canonical_layout": False, "host_memory_is_pinned": True}
    try:
        ctx.up.SingleDirectionOffloadingHandler([], [], 1, [[]], True, **{
            k: v for k, v in optional.items() if k in ctx.state["optional"]})
    except AssertionError:
        return None
    return "upstream built a handler of no KV tensors (the model refuses a geometry of none)"


TRANSFER = Differential(
    loading=loading, prepare=prepare, inputs=transfer_inputs, model=transfer_model, upstream=transfer_upstream,
    compare=REFUSALS, describe=describe_transfer,
    probes=(Probe("no_tensors_refused", "a handler of no KV tensors is refused, as the model refuses a geometry of "
                                        "none", no_tensors_refused),),
    checks=(mapping_check("worker_mapping_is_a_bijection_with_page_bytes"),
            mapping_check("round_trip_gpu_cpu_gpu_is_identity")),
    note=lambda ctx: "random geometries, both directions; triples in batch order, bytes, and the model's properties")


# -- offload_get_finished: a lockstep of one handler and the model's transfer queue ---------------------------

QUEUE_GEOMETRY = SwapGeometry((4,), 8, 8, 1, ((DataRef(0, 4),),))
JOB_IDS = 12


def queue_spec(blocks: int) -> TransferSpec:
    return TransferSpec(tuple(range(blocks)), (blocks,), (0,), tuple(range(blocks)))


class UpstreamQueue:
    """One upstream handler (GPU -> CPU); firing a job's end event is the device finishing it."""

    def __init__(self, ctx: Context) -> None:
        self.up = ctx.up
        g = QUEUE_GEOMETRY
        gpu, cpu = Side(g, True, [np.zeros(side_bytes(g, True)[0], np.uint8)]), \
            Side(g, False, [np.zeros(side_bytes(g, False)[0], np.uint8)])
        self.sides = (gpu, cpu)
        refs = [[SimpleNamespace(tensor_idx=0, page_size_bytes=4, mapping=None)]]
        self.handler = ctx.up.SingleDirectionOffloadingHandler(gpu.tensors, cpu.tensors, 1, refs, True)

    def call(self, op: str, args: Any) -> Any:
        h = self.handler
        if op == "transfer_async":
            while len(h._event_pool) < 2:  # the device's events: stand-ins the adapter fires
                h._event_pool.append(FakeEvent())
            return submit(self.up, h, args["job_id"], queue_spec(args["blocks"]), True)
        if op == "fire":
            h._transfer_events[args].fired = True
            return None
        if op == "wait":
            return h.wait(set(args))
        return [{"job_id": r.job_id, "success": r.success, "transfer_size": r.transfer_size}
                for r in h.get_finished()]

    def observe(self) -> dict[str, Any]:
        return {"in_flight": [t.job_id for t in self.handler._transfers],
                "events": sorted(self.handler._transfer_events)}


class ModelQueue:
    def __init__(self) -> None:
        self.queue = TransferQueue()

    def call(self, op: str, args: Any) -> Any:
        q = self.queue
        if op == "transfer_async":
            return q.transfer_async(args["job_id"], plan_swap(QUEUE_GEOMETRY, queue_spec(args["blocks"]),
                                                              True).num_bytes)
        if op == "fire":
            return q.complete(args)
        if op == "wait":  # the given jobs' end events synchronized: they fire
            for job_id in sorted(set(args) & set(q.in_flight)):
                q.complete(job_id)
            return None
        return [{"job_id": r.job_id, "success": r.success, "transfer_size": r.transfer_size}
                for r in q.get_finished()]

    def observe(self) -> dict[str, Any]:
        return {"in_flight": list(self.queue.in_flight), "events": sorted(self.queue.in_flight)}


def new_job(view: ModelQueue) -> Any:
    free = [j for j in range(JOB_IDS) if j not in view.queue.in_flight]
    return st.fixed_dictionaries({"job_id": st.sampled_from(free), "blocks": st.integers(1, 4)}) if free else None


def unfired(view: ModelQueue) -> Any:
    waiting = [j for j in view.queue.in_flight if j not in view.queue._fired]
    return st.sampled_from(waiting) if waiting else None


def polled(view: ModelQueue, job_id: Any) -> list[tuple[str, Any]]:
    return [("get_finished", ())]


FINISHED = Lockstep(
    loading=loading, prepare=prepare,
    start=lambda ctx: st.just({"direction": "gpu_to_cpu"}),
    sides=lambda ctx, config: (ModelQueue(), UpstreamQueue(ctx)),
    # a fire is followed by a poll, as the worker polls after the device finishes a job: a poll that reads the wrong
    # end of the queue (or pops past an unfired job) meets a queue with fired and unfired jobs in every order
    operations=(Operation("transfer_async", new_job), Operation("fire", unfired, then=polled),
                Operation("get_finished", st.just(())),
                Operation("wait", st.lists(st.integers(0, JOB_IDS - 1), max_size=3, unique=True).map(tuple))),
    steps=30,
    note=lambda ctx: "transfers, end events fired in any order, polls and waits interleaved; pooled events reused")


# -- upstream's Triton swap kernel (`swap_blocks_triton.py`) on the model's triples, in the kernel child -----

TRITON_RELPATH = "vllm/v1/kv_offload/cpu/swap_blocks_triton.py"
TRITON_SYMBOLS = ("swap_blocks_batch", "_swap_blocks_kernel", "NUM_SMS", "THRESHOLD_BYTES", "MIN_N")
TRITON_RUNNER = f"{__name__}:run_swap_triton"


class Addresses:
    """A launcher's descriptor tensor whose `.to("cuda", ...)` keeps it on the kernel child's device (the
    interpreter runs on CPU tensors)."""

    def __init__(self, tensor: Any, device: str) -> None:
        self.tensor, self.device = tensor, device

    def numel(self) -> int:
        return self.tensor.numel()

    def to(self, device: Any, non_blocking: bool = False) -> Any:
        return self.tensor.to(self.device, non_blocking=non_blocking)


def run_swap_triton(source: EngineSource, case: dict[str, Any], device: str) -> dict[str, Any]:
    """Child side: the release's `swap_blocks_batch` on the triples of `case` (host sources, pinned on CUDA;
    device destinations), with `ops.swap_blocks_batch` a stand-in for the DMA engine: on the CPU it copies by the
    descriptors it is handed (source address, destination address, size: what the launcher passes is what is
    checked), on CUDA the case's triples; the destination tensors afterwards and which path ran."""
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from .common import load_in_child

    src = [torch.from_numpy(unpack(d)) for d in case["src"]]
    if device == "cuda":
        src = [t.pin_memory() for t in src]
    dst = [torch.from_numpy(unpack(d)).to(device) for d in case["dst"]]
    dma: list[Any] = []

    def dma_swap(src_addrs: Any, dst_addrs: Any, sizes: Any, is_src_access_order_any: bool = False) -> None:
        dma.append(is_src_access_order_any)
        if device == "cpu":
            for s, d, n in zip(*(getattr(a, "tensor", a).tolist() for a in (src_addrs, dst_addrs, sizes))):
                ctypes.memmove(d, s, n)
            return
        for op in case["ops"]:
            dst[op[0]][op[2]:op[2] + op[3]].copy_(src[op[0]][op[1]:op[1] + op[3]])

    ns = load_in_child(source, TRITON_RELPATH, TRITON_SYMBOLS, device)
    ns.swap_blocks_batch.__globals__["ops"] = SimpleNamespace(swap_blocks_batch=dma_swap)
    ops = case["ops"]

    def addresses(tensors: list[Any], pick: int) -> Any:
        return Addresses(torch.tensor([tensors[op[0]].data_ptr() + op[pick] for op in ops], dtype=torch.int64),
                         device)

    sizes = Addresses(torch.tensor([op[3] for op in ops], dtype=torch.int64), device)
    ns.swap_blocks_batch(addresses(src, 1), addresses(dst, 2), sizes, case["is_src_access_order_any"],
                         bytes_per_chunk=case["bytes_per_chunk"])
    if device == "cuda":
        torch.cuda.synchronize()
    return {"dst": [pack(t.cpu().numpy()) for t in dst], "dma": dma}


@dataclass(frozen=True)
class SwapTritonCase:
    case: Any  # a SwapCase (its CPU -> GPU plan)
    bytes_per_chunk: int
    is_src_access_order_any: bool


def triton_inputs(ctx: Context) -> Any:
    from kvsim.properties.kv_offload.mapping_strategies import swap_cases

    cases = st.one_of(swap_cases(max_page=64, align=8), swap_cases(max_page=64, align=8, max_group=12))
    return st.builds(SwapTritonCase, cases, st.sampled_from((8, 16, 32, 64, 128, 256)), st.booleans())


def triton_pinned(ctx: Context) -> list[SwapTritonCase]:
    """Run first: the kernel path (24 triples, past MIN_N) on the largest pages the inputs draw, 64 and 56 bytes
    (8 and 7 words: where a word count computed any other way than bytes // 8 copies a word too many or too
    few), a page in one chunk and in two; then exactly MIN_N triples (the kernel's, not the DMA's) with one word a
    chunk (a loop bound one short leaves each page's last word)."""
    from kvsim.models.kv_offload.mapping import DataRef, SwapGeometry, TransferSpec
    from kvsim.properties.kv_offload.mapping import SwapCase

    def triples(blocks: int) -> Any:  # two pages (64 and 56 bytes) a block: 2 * blocks triples
        geometry = SwapGeometry((64, 56), 2 * blocks + 1, blocks, 1, ((DataRef(0, 64), DataRef(1, 56)),))
        spec = TransferSpec(tuple(range(blocks)), (blocks,), (0,), tuple(range(blocks)))
        return SwapCase(geometry, spec, tuple(range(blocks, 2 * blocks)), 0)

    return [SwapTritonCase(triples(12), chunk, False) for chunk in (64, 32)] + \
        [SwapTritonCase(triples(ctx.up.MIN_N // 2), 8, False)]


def triton_plan(ctx: Context, sc: SwapTritonCase) -> tuple[Any, list[np.ndarray], list[np.ndarray]]:
    return plan_swap(sc.case.geometry, sc.case.spec, False), sc.case.buffers(False, 1), sc.case.buffers(True, 2)


def triton_model(ctx: Context, sc: SwapTritonCase) -> dict[str, Any]:
    """`apply_swap`'s bytes; the DMA path (with the call's `is_src_access_order_any`) below `MIN_N` triples."""
    plan, src, dst = triton_plan(ctx, sc)
    return {"dst": apply_swap(plan, src, dst),
            "dma": [sc.is_src_access_order_any] if len(plan.ops) < ctx.up.MIN_N else []}


def triton_upstream(ctx: Context, sc: SwapTritonCase) -> dict[str, Any]:
    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    plan, src, dst = triton_plan(ctx, sc)
    result = call_kernel(ctx, TRITON_RUNNER, {
        "src": [pack(b) for b in src], "dst": [pack(b) for b in dst],
        "ops": [[o.tensor_idx, o.src, o.dst, o.size] for o in plan.ops],
        "bytes_per_chunk": sc.bytes_per_chunk, "is_src_access_order_any": sc.is_src_access_order_any})
    return {"dst": [unpack(d) for d in result["dst"]], "dma": result["dma"]}


def describe_triton(ctx: Context, sc: SwapTritonCase) -> dict[str, Any]:
    return {**describe_transfer(ctx, TransferCase(sc.case, False)), "bytes_per_chunk": sc.bytes_per_chunk,
            "is_src_access_order_any": sc.is_src_access_order_any}


SWAP_TRITON = Differential(
    kernel=True, examples=kernel_examples, inputs=triton_inputs, pinned=triton_pinned, model=triton_model,
    upstream=triton_upstream, describe=describe_triton,
    note=lambda ctx: f"the model's CPU->GPU triples through swap_blocks_batch; DMA below MIN_N={ctx.up.MIN_N}")
