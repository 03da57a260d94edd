"""kv-offload, worker side: the GPU block <-> CPU chunk mapping, its properties (3.3.7, 3.3.8, in-order jobs), each
shown failing on a planted mutation. Its conform targets against vLLM's own worker handler and Triton swap kernel
are tests/conform/vllm/test_conform_offload_mapping.py."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import Phase, given, settings

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.registry import Registry
from kvsim.models.kv_offload import DESCRIPTOR, mapping, mapping_jobs
from kvsim.models.kv_offload.mapping import (DataRef, SwapGeometry, TransferSpec, apply_swap,
                                             compute_sub_block_offsets, plan_swap)
from kvsim.models.kv_offload.mapping_jobs import TransferQueue
from kvsim.properties.kv_offload import mapping as props
from kvsim.properties.kv_offload import mapping_strategies as strategies

PROFILE_DEV = os.environ.get("KVSIM_PROFILE") == "dev"
EXAMPLES = 500 if PROFILE_DEV else 80

# one tensor of 8-byte pages, 4 blocks per chunk, four 32-byte chunk slots; one group, one data ref of 6 bytes
GEOMETRY = SwapGeometry((8,), 10, 4, 4, ((DataRef(0, 6),),))
SPEC = TransferSpec(block_ids=(3, 4, 5, 6, 7), group_sizes=(5,), block_indices=(6,), chunk_ids=(2, 0))


def _ops(plan):  # type: ignore[no-untyped-def]
    return [(o.tensor_idx, o.src, o.dst, o.size) for o in plan.ops]


# --- the model, pinned -------------------------------------------------------------------------------------

def test_partial_first_chunk_store_and_load_triples() -> None:
    """Logical blocks 6..10 with 4 blocks per chunk: skip_count 2, so blocks 6, 7 fill sub-blocks 2, 3 of chunk 2
    (bytes 64 + 16, 64 + 24) and blocks 8..10 sub-blocks 0..2 of chunk 0; 6 bytes each."""
    assert mapping.skip_count(6, 4) == 2 and mapping.chunks_spanned(6, 5, 4) == 2
    store = plan_swap(GEOMETRY, SPEC, True)
    assert _ops(store) == [(0, 24, 80, 6), (0, 32, 88, 6), (0, 40, 0, 6), (0, 48, 8, 6), (0, 56, 16, 6)]
    assert store.num_bytes == 30
    load = plan_swap(GEOMETRY, SPEC, False)
    assert _ops(load) == [(0, d, s, n) for _, s, d, n in _ops(store)]
    (segment,) = store.segments
    assert (segment.src_blocks_per_chunk, segment.dst_blocks_per_chunk) == (1, 4)
    assert (segment.src_skip, segment.dst_skip) == (0, 2)


def test_sub_block_offsets_follow_the_row_stride_not_the_row() -> None:
    """A padded CPU row (stride 40 for a 32-byte row): sub-block j of chunk c at c * 40 + j * 8."""
    assert compute_sub_block_offsets((3, 1), 4, 40, 8, 5, 3).tolist() == [144, 40, 48, 56, 64]
    assert compute_sub_block_offsets((5, 2, 9), 1, 16, 16, 3, 0).tolist() == [80, 32, 144]
    padded = replace(GEOMETRY, cpu_row_padding=8)
    assert padded.cpu_bytes(0) == 3 * 40 + 32
    assert _ops(plan_swap(padded, SPEC, True))[:3] == [(0, 24, 96, 6), (0, 32, 104, 6), (0, 40, 0, 6)]


def test_groups_share_a_tensor_and_the_batch_is_in_group_order() -> None:
    g = SwapGeometry((4, 6), 8, 6, 2, ((DataRef(0, 4), DataRef(1, 5)), (DataRef(0, 3),)))
    spec = TransferSpec((1, 2, 3, 5), (3, 1), (1, 4), (4, 0, 1))
    plan = plan_swap(g, spec, True)
    assert [(s.group, s.tensor_idx, s.dst_ids, s.dst_skip, s.count) for s in plan.segments] == [
        (0, 0, (4, 0), 1, 3), (0, 1, (4, 0), 1, 3), (1, 0, (1,), 0, 1)]
    assert _ops(plan) == [(0, 4, 36, 4), (0, 8, 0, 4), (0, 12, 4, 4), (1, 6, 54, 5), (1, 12, 0, 5),
                          (1, 18, 6, 5), (0, 20, 8, 3)]
    assert plan.num_bytes == 3 * (4 + 5) + 1 * 3


def test_apply_swap_copies_exactly_the_triples() -> None:
    gpu = [np.arange(80, dtype=np.uint8)]
    cpu = [np.full(GEOMETRY.cpu_bytes(0), 0xEE, dtype=np.uint8)]
    out = apply_swap(plan_swap(GEOMETRY, SPEC, True), gpu, cpu)
    assert out[0][80:86].tolist() == list(range(24, 30)) and out[0][86:88].tolist() == [0xEE, 0xEE]
    assert cpu[0][80] == 0xEE  # inputs untouched


@pytest.mark.parametrize("spec, field", [
    (replace(SPEC, chunk_ids=(2,)), "chunk_ids"),           # the group spans two chunks
    (replace(SPEC, chunk_ids=(2, 0, 1)), "chunk_ids"),      # one id no group uses
    (replace(SPEC, chunk_ids=(2, 4)), "chunk_ids"),         # slot 4 of 4
    (replace(SPEC, block_ids=(3, 4, 5, 6, 10)), "block_ids"),
    (replace(SPEC, group_sizes=(4,)), "group_sizes"),
    (replace(SPEC, block_indices=(6, 0)), "group_sizes/block_indices"),
])
def test_inconsistent_transfers_are_refused_with_the_field(spec: TransferSpec, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_swap(GEOMETRY, spec, True)
    assert info.value.field == field


def test_geometry_refuses_a_ref_larger_than_its_page() -> None:
    with pytest.raises(ConfigError, match="page_size_bytes: expected 1..8"):
        SwapGeometry((8,), 4, 2, 2, ((DataRef(0, 9),),))
    with pytest.raises(ConfigError, match="blocks_per_chunk"):
        SwapGeometry((8,), 4, 2, 0, ((DataRef(0, 8),),))


def test_transfer_queue_reports_in_submission_order() -> None:
    queue = TransferQueue()
    for job_id, size in ((7, 10), (3, 20), (9, 30)):
        queue.transfer_async(job_id, size)
    queue.complete(3)
    queue.complete(9)
    assert queue.get_finished() == []  # job 7 is the head and has not finished
    queue.complete(7)
    assert [(r.job_id, r.transfer_size) for r in queue.get_finished()] == [(7, 10), (3, 20), (9, 30)]
    assert queue.in_flight == () and queue.get_finished() == []
    with pytest.raises(ConfigError, match="job_id"):
        queue.complete(7)


def test_job_offsets_are_chunk_strides_and_upstream_bounds_refuse_the_end() -> None:
    assert mapping_jobs.job_offsets((3, 0, 2), 4096) == [12288, 0, 8192]
    mapping_jobs.validate_offsets(4 * 4096, [12288], 4096)
    with pytest.raises(ConfigError, match="offset"):
        mapping_jobs.validate_offsets(4 * 4096, [12289], 4096)


# --- the properties, and a planted mutation each ------------------------------------------------------------

def _holds(prop, strategy, examples: int = EXAMPLES, shrink: bool = True) -> int:  # type: ignore[no-untyped-def]
    count = [0]
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
              phases=phases)
    @given(strategy)
    def run(case):  # type: ignore[no-untyped-def]
        count[0] += 1
        prop(case, DESCRIPTOR.variant("fixed"))

    run()
    return count[0]


def _fails(prop, strategy, match: str, examples: int = 300) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(PropertyViolation, match=match) as info:
        _holds(prop, strategy, examples, shrink=False)  # the first failing example is enough here
    return str(info.value)


PROPERTIES = [
    (props.transfer_job_offsets_disjoint_inside_primary_view, strategies.TRANSFER_JOBS),
    (props.worker_mapping_is_a_bijection_with_page_bytes, strategies.SWAP_CASES),
    (props.worker_mapping_is_a_bijection_with_page_bytes, strategies.PARTIAL_FIRST_CASES),
    (props.round_trip_gpu_cpu_gpu_is_identity, strategies.SWAP_CASES),
    (props.round_trip_gpu_cpu_gpu_is_identity, strategies.PARTIAL_FIRST_CASES),
    (props.transfer_jobs_finish_in_submission_order, strategies.QUEUE_CASES),
]


def test_properties_register_in_a_local_registry() -> None:
    registry = Registry()
    registry.add_model(DESCRIPTOR)
    registry.add_from(props)
    assert [p.name for p in registry.properties_of("kv-offload")] == [
        "transfer_job_offsets_disjoint_inside_primary_view", "worker_mapping_is_a_bijection_with_page_bytes",
        "round_trip_gpu_cpu_gpu_is_identity", "transfer_jobs_finish_in_submission_order"]
    for prop in registry.properties_of("kv-offload"):  # the sibling strategies module resolves every name
        assert prop.build_strategy({}) is not None


@pytest.mark.parametrize("prop, strategy", PROPERTIES, ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(PROPERTIES)])
def test_property_holds_on_the_model(prop, strategy) -> None:  # type: ignore[no-untyped-def]
    assert _holds(prop, strategy) == EXAMPLES


def test_bijection_catches_skip_count_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """skip_count one too high (wrapping, so every plan still consumes its ids): a partial first chunk lands one
    sub-block off."""
    monkeypatch.setattr(mapping, "skip_count", lambda index, bpc: (index + 1) % bpc)
    message = _fails(props.worker_mapping_is_a_bijection_with_page_bytes, strategies.PARTIAL_FIRST_CASES,
                     "copy 0 of")
    assert "expected (tensor, src, dst, size)" in message


def test_bijection_catches_an_unwrapped_skip_count_as_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapping, "skip_count", lambda index, bpc: index % bpc + 1 if bpc > 1 else 0)
    _fails(props.worker_mapping_is_a_bijection_with_page_bytes, strategies.SWAP_CASES,
           "expected a plan for a consistent transfer|expected \\(tensor")


def test_bijection_catches_bytes_counted_by_the_padded_page(monkeypatch: pytest.MonkeyPatch) -> None:
    real = mapping.plan_swap

    def padded_bytes(geometry, spec, gpu_to_cpu):  # type: ignore[no-untyped-def]
        plan = real(geometry, spec, gpu_to_cpu)
        return replace(plan, num_bytes=sum(geometry.gpu_page_bytes[o.tensor_idx] for o in plan.ops))

    monkeypatch.setattr(props, "plan_swap", padded_bytes)
    _fails(props.worker_mapping_is_a_bijection_with_page_bytes, strategies.SWAP_CASES,
           "bytes: expected .* per data reference")


def test_round_trip_catches_a_load_with_skip_count_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store right, the load one sub-block off (an asymmetric skip_count): other bytes come back."""
    real = mapping.plan_swap

    def load_off_by_one(geometry, spec, gpu_to_cpu):  # type: ignore[no-untyped-def]
        if gpu_to_cpu:
            return real(geometry, spec, gpu_to_cpu)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(mapping, "skip_count", lambda index, bpc: (index + 1) % bpc)
            return real(geometry, spec, gpu_to_cpu)

    monkeypatch.setattr(props, "plan_swap", load_off_by_one)
    _fails(props.round_trip_gpu_cpu_gpu_is_identity, strategies.PARTIAL_FIRST_CASES, "after the round trip")


def test_round_trip_catches_a_copy_one_byte_short(monkeypatch: pytest.MonkeyPatch) -> None:
    real = mapping.plan_swap

    def short(geometry, spec, gpu_to_cpu):  # type: ignore[no-untyped-def]
        plan = real(geometry, spec, gpu_to_cpu)
        return replace(plan, ops=tuple(replace(o, size=o.size - 1) for o in plan.ops))

    monkeypatch.setattr(props, "plan_swap", short)
    _fails(props.round_trip_gpu_cpu_gpu_is_identity, strategies.SWAP_CASES, "after the round trip")


def test_offsets_property_catches_a_stride_shorter_than_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapping_jobs, "chunk_offset", lambda chunk_id, chunk_bytes: chunk_id * (chunk_bytes - 1))
    _fails(props.transfer_job_offsets_disjoint_inside_primary_view, strategies.TRANSFER_JOBS, "overlapping")


def test_offsets_property_catches_an_offset_past_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapping_jobs, "chunk_offset", lambda chunk_id, chunk_bytes: (chunk_id + 1) * chunk_bytes)
    _fails(props.transfer_job_offsets_disjoint_inside_primary_view, strategies.TRANSFER_JOBS,
           "inside the primary view")


def test_order_property_catches_a_queue_that_reports_any_finished_job(monkeypatch: pytest.MonkeyPatch) -> None:
    def any_finished(self):  # type: ignore[no-untyped-def]
        done = [(j, n) for j, n in self._transfers if j in self._fired]
        for item in done:
            self._transfers.remove(item)
        return [mapping_jobs.TransferResult(j, True, n) for j, n in done]

    monkeypatch.setattr(TransferQueue, "get_finished", any_finished)
    _fails(props.transfer_jobs_finish_in_submission_order, strategies.QUEUE_CASES, "finished job")

