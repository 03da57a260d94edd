"""kv-offload, worker side: properties 3.3.7 and 3.3.8 of the research note (vllm.md), and in-order completion.

* `transfer_job_offsets_disjoint_inside_primary_view` (3.3.7): a `TransferJob`'s file-system offsets
  `chunk_id * chunk_bytes` are co-indexed with its keys, pairwise disjoint and inside the primary view.
* `worker_mapping_is_a_bijection_with_page_bytes` (3.3.8): every GPU block of a transfer maps to exactly one
  CPU sub-block, the one its logical index names (partial first chunk included), and back; the transfer's bytes
  are `group_size x page_size_bytes` per data reference.
* `round_trip_gpu_cpu_gpu_is_identity` (3.3.8): a store then a load into other GPU blocks gives back the
  transferred pages byte for byte, and neither copy touches a byte outside the mapped pages.
* `transfer_jobs_finish_in_submission_order`: whatever order the device fires the end events in, a
  direction's `get_finished` reports its jobs in submission order, each once, none before its event.

The cases are here (no Hypothesis); `mapping_strategies` draws them. The properties hold on every variant of
the model (the mapping is not part of #52615's rename); the tests show each failing on a planted mutation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.kv_offload import mapping_jobs
from kvsim.models.kv_offload.mapping import SwapGeometry, TransferSpec, apply_swap, plan_swap, side_bytes

MODEL = "kv-offload"


@dataclass(frozen=True)
class SwapCase:
    """A consistent transfer: geometry, the store's spec, the GPU blocks a load puts the chunks back into, and
    the seed of every buffer's initial bytes."""

    geometry: SwapGeometry
    spec: TransferSpec
    load_block_ids: tuple[int, ...]  # distinct, co-indexed with spec.block_ids
    seed: int

    def buffers(self, gpu: bool, salt: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, salt])
        return [rng.integers(0, 256, n, dtype=np.uint8) for n in side_bytes(self.geometry, gpu)]

    @property
    def load_spec(self) -> TransferSpec:
        s = self.spec
        return TransferSpec(self.load_block_ids, s.group_sizes, s.block_indices, s.chunk_ids)

    def group_lists(self) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
        """(block index, size, GPU block ids, CPU chunk ids) per group, cut from the spec independently of the
        model: a group spans ceil((index % bpc + size) / bpc) chunks."""
        bpc, out, b, c = self.geometry.blocks_per_chunk, [], 0, 0
        for index, size in zip(self.spec.block_indices, self.spec.group_sizes):
            chunks = 0 if size == 0 else (index % bpc + size + bpc - 1) // bpc
            out.append((index, size, self.spec.block_ids[b:b + size], self.spec.chunk_ids[c:c + chunks]))
            b, c = b + size, c + chunks
        return out


@dataclass(frozen=True)
class JobsCase:
    """A transfer job of the tiering layer: the primary view's slots and chunk bytes, the job's keys and slots."""

    num_chunks: int
    chunk_bytes: int
    keys: tuple[int, ...]
    chunk_ids: tuple[int, ...]  # distinct slots (the manager's pinned primary slots), co-indexed with keys


@dataclass(frozen=True)
class QueueCase:
    """Jobs submitted to one direction, then steps: ("fire", job) or ("poll",), ending with a poll per job."""

    jobs: tuple[tuple[int, int], ...]  # (job_id, num_bytes) in submission order
    steps: tuple[tuple[Any, ...], ...]


def _plan(geometry: SwapGeometry, spec: TransferSpec, gpu_to_cpu: bool, what: str):  # type: ignore[no-untyped-def]
    try:
        return plan_swap(geometry, spec, gpu_to_cpu)
    except ConfigError as exc:
        raise PropertyViolation(f"{what}: expected a plan for a consistent transfer, got a refusal ({exc})") from None


def _ranges_disjoint(what: str, ranges: list[tuple[int, int]]) -> None:
    ordered = sorted(ranges)
    for (a, a_end), (b, _) in zip(ordered, ordered[1:]):
        if b < a_end:
            raise PropertyViolation(f"{what}: expected pairwise disjoint byte ranges, got [{a}, {a_end}) and "
                                    f"[{b}, ...) overlapping")


@kv_property(model=MODEL, strategy="TRANSFER_JOBS")
def transfer_job_offsets_disjoint_inside_primary_view(case: JobsCase, variant: Any) -> None:
    """For any transfer job (distinct primary slots co-indexed with its keys), the file-system tier's offsets
    chunk_id * chunk_bytes are one per key, pairwise disjoint as chunk_bytes ranges and inside the primary view
    of num_chunks * chunk_bytes bytes (upstream's _validate_offsets accepts them)."""
    offsets = mapping_jobs.job_offsets(case.chunk_ids, case.chunk_bytes)
    if not len(offsets) == len(case.chunk_ids) == len(case.keys):
        raise PropertyViolation(f"offsets per key: expected {len(case.keys)}, got {len(offsets)}")
    view = case.num_chunks * case.chunk_bytes
    for offset in offsets:
        if offset < 0 or offset + case.chunk_bytes > view:
            raise PropertyViolation(f"chunk range [{offset}, {offset + case.chunk_bytes}): expected inside the "
                                    f"primary view of {view} bytes, got outside")
    _ranges_disjoint("chunk ranges of one job", [(o, o + case.chunk_bytes) for o in offsets])
    mapping_jobs.validate_offsets(view, offsets, case.chunk_bytes)


@kv_property(model=MODEL, strategy="SWAP_CASES")
def worker_mapping_is_a_bijection_with_page_bytes(case: SwapCase, variant: Any) -> None:
    """For random geometries (1-3 tensors, padded pages and CPU rows, 1-3 KV cache groups sharing tensors,
    blocks_per_chunk 1-8, partial first and last chunks), in both directions, block k of group g (logical index
    block_indices[g] + k) is copied to or from exactly sub-block (index % bpc) of the chunk its index names, at
    byte chunk * row_stride + sub * gpu_page; no two copies share a GPU page or a CPU sub-block; every chunk id
    is used; and the transfer's bytes are group_size x page_size_bytes summed over the data references."""
    g = case.geometry
    bpc = g.blocks_per_chunk
    for gpu_to_cpu in (True, False):
        where = "store" if gpu_to_cpu else "load"
        plan = _plan(g, case.spec, gpu_to_cpu, where)
        want = []
        for group, (index, size, blocks, chunks) in enumerate(case.group_lists()):
            for ref in g.group_data_refs[group]:
                t = ref.tensor_idx
                for k, block in enumerate(blocks):
                    logical = index + k
                    chunk = chunks[logical // bpc - index // bpc]
                    gpu = block * g.gpu_page_bytes[t]
                    cpu = chunk * g.cpu_row_stride(t) + (logical % bpc) * g.gpu_page_bytes[t]
                    src, dst = (gpu, cpu) if gpu_to_cpu else (cpu, gpu)
                    want.append((t, src, dst, ref.page_size_bytes))
        got = [(op.tensor_idx, op.src, op.dst, op.size) for op in plan.ops]
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise PropertyViolation(f"{where} copy {first} of {len(want)}: expected (tensor, src, dst, size) "
                                    f"{want[first] if first < len(want) else None}, got "
                                    f"{got[first] if first < len(got) else None}")
        for side, pick in (("source", 1), ("destination", 2)):
            seen = {(op[0], op[pick]) for op in got}
            if len(seen) != len(got):
                raise PropertyViolation(f"{where}: expected {len(got)} distinct {side} pages, got {len(seen)}")
        expected = sum(size * sum(r.page_size_bytes for r in g.group_data_refs[group])
                       for group, size in enumerate(case.spec.group_sizes))
        copied = sum(op.size for op in plan.ops)
        if plan.num_bytes != expected or copied != expected:
            raise PropertyViolation(f"{where} bytes: expected {expected} (group_size x page_size_bytes per data "
                                    f"reference), got {plan.num_bytes} reported, {copied} copied")


@kv_property(model=MODEL, strategy="SWAP_CASES")
def round_trip_gpu_cpu_gpu_is_identity(case: SwapCase, variant: Any) -> None:
    """For the same geometries, storing random GPU pages into random-filled CPU chunks and loading the chunks
    into other GPU blocks gives each load block the first page_size_bytes of its store block, byte for byte,
    and leaves every other byte of the CPU and the second GPU buffers as it was."""
    g = case.geometry
    store = _plan(g, case.spec, True, "store")
    load = _plan(g, case.load_spec, False, "load")
    gpu, cpu, gpu_after = case.buffers(True, 1), case.buffers(False, 2), case.buffers(True, 3)
    cpu_stored = apply_swap(store, gpu, cpu)
    gpu_loaded = apply_swap(load, cpu_stored, gpu_after)
    written: list[np.ndarray] = [np.zeros(n, dtype=bool) for n in side_bytes(g, True)]
    for group, (_, _, blocks, _) in enumerate(case.group_lists()):
        load_blocks = case.load_block_ids[sum(case.spec.group_sizes[:group]):][:len(blocks)]
        for ref in g.group_data_refs[group]:
            t, page = ref.tensor_idx, g.gpu_page_bytes[ref.tensor_idx]
            for src, dst in zip(blocks, load_blocks):
                n = ref.page_size_bytes
                a, b = gpu[t][src * page:src * page + n], gpu_loaded[t][dst * page:dst * page + n]
                if not np.array_equal(a, b):
                    bad = int(np.flatnonzero(a != b)[0])
                    raise PropertyViolation(f"group {group}, tensor {t}: GPU block {dst} byte {bad} after the round "
                                            f"trip: expected block {src}'s {a[bad]}, got {b[bad]}")
                written[t][dst * page:dst * page + ref.page_size_bytes] = True
    for t in range(len(g.gpu_page_bytes)):
        stray = np.flatnonzero(~written[t] & (gpu_loaded[t] != gpu_after[t]))
        if stray.size:
            raise PropertyViolation(f"tensor {t}: GPU bytes outside the loaded pages changed: expected 0, got "
                                    f"{stray.size} (first at byte {int(stray[0])})")
        mapped = np.zeros(len(cpu[t]), dtype=bool)
        for op in store.ops:
            if op.tensor_idx == t:
                mapped[op.dst:op.dst + op.size] = True
        if mapped.sum() != sum(op.size for op in store.ops if op.tensor_idx == t):
            raise PropertyViolation(f"tensor {t}: CPU sub-blocks written by the store: expected disjoint, got overlaps")
        stray = np.flatnonzero(~mapped & (cpu_stored[t] != cpu[t]))
        if stray.size:
            raise PropertyViolation(f"tensor {t}: CPU bytes outside the stored sub-blocks changed: expected 0, "
                                    f"got {stray.size}")


@kv_property(model=MODEL, strategy="QUEUE_CASES")
def transfer_jobs_finish_in_submission_order(case: QueueCase, variant: Any) -> None:
    """For any order in which the device fires the end events of a direction's jobs, interleaved with polls,
    get_finished reports the jobs in submission order, each exactly once with its bytes, never before its own
    event and every earlier job's have fired, and all of them once every event has fired."""
    queue = mapping_jobs.TransferQueue()
    for job_id, num_bytes in case.jobs:
        queue.transfer_async(job_id, num_bytes)
    order = [j for j, _ in case.jobs]
    size = dict(case.jobs)
    fired: set[int] = set()
    reported: list[int] = []
    for step in case.steps:
        if step[0] == "fire":
            queue.complete(step[1])
            fired.add(step[1])
            continue
        for result in queue.get_finished():
            position = len(reported)
            if position >= len(order) or result.job_id != order[position]:
                raise PropertyViolation(f"finished job {len(reported)}: expected job "
                                        f"{order[position] if position < len(order) else None}, got {result.job_id}")
            if not set(order[:position + 1]) <= fired:
                raise PropertyViolation(f"job {result.job_id} reported: expected after its and every earlier "
                                        f"job's event, got it with {sorted(set(order[:position + 1]) - fired)} unfired")
            if result.transfer_size != size[result.job_id]:
                raise PropertyViolation(f"job {result.job_id} bytes: expected {size[result.job_id]}, "
                                        f"got {result.transfer_size}")
            reported.append(result.job_id)
    if fired == set(order) and reported != order:
        raise PropertyViolation(f"jobs reported once every event fired: expected {order}, got {reported}")
