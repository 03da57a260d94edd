"""Hypothesis strategies of the worker-side mapping properties (GPU blocks into CPU chunk slots).

`swap_cases(...)` is public: the oracle kernel family (`gpu_oracle/kernels/offload_swap`) draws the same
geometries. Chunk lists are cut per group as upstream's scheduler side hands them to the worker:
ceil((block_index % blocks_per_chunk + group_size) / blocks_per_chunk) distinct slots per group.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.models.kv_offload.mapping import DataRef, SwapGeometry, TransferSpec

from .mapping import JobsCase, QueueCase, SwapCase

BLOCKS_PER_CHUNK = (1, 2, 3, 4, 8)


@st.composite
def swap_cases(draw: st.DrawFn, max_page: int = 24, max_group: int = 6, max_groups: int = 3,
               partial_first: bool = False, align: int = 1) -> SwapCase:
    """1-3 tensors with pages of 1..max_page bytes, padded CPU rows or not, 1..max_groups KV cache groups whose
    data references use distinct tensors (groups may share one), group sizes 0..max_group from any logical
    block index, distinct GPU blocks and CPU slots with spare ones; `partial_first`: every non-empty group
    starts inside a chunk; `align`: pages, data reference sizes and row padding multiples of it (the 8-byte
    words upstream's Triton swap kernel copies)."""
    bpc = draw(st.sampled_from(BLOCKS_PER_CHUNK if not partial_first else BLOCKS_PER_CHUNK[1:]))
    pages = tuple(align * p for p in draw(st.lists(st.integers(1, max_page // align), min_size=1, max_size=3)))
    groups = []
    for _ in range(draw(st.integers(1, max_groups))):
        tensors = draw(st.lists(st.sampled_from(range(len(pages))), min_size=1, max_size=len(pages), unique=True))
        groups.append(tuple(DataRef(t, align * draw(st.integers(1, pages[t] // align))) for t in tensors))
    sizes, indices, chunks = [], [], 0
    for _ in groups:
        size = draw(st.integers(0 if not partial_first else 1, max_group))
        index = draw(st.integers(0, 4 * bpc))
        if partial_first and index % bpc == 0:
            index += 1
        sizes.append(size)
        indices.append(index)
        chunks += 0 if size == 0 else (index % bpc + size + bpc - 1) // bpc
    blocks = sum(sizes)
    num_gpu = 2 * blocks + draw(st.integers(1, 3))
    num_cpu = chunks + draw(st.integers(0, 2)) or 1
    gpu_ids = draw(st.permutations(range(num_gpu)))
    cpu_ids = draw(st.permutations(range(num_cpu)))
    geometry = SwapGeometry(pages, num_gpu, num_cpu, bpc, tuple(groups),
                            align * draw(st.sampled_from((0, 0, 1, 8, 13))))
    spec = TransferSpec(tuple(gpu_ids[:blocks]), tuple(sizes), tuple(indices), tuple(cpu_ids[:chunks]))
    return SwapCase(geometry, spec, tuple(gpu_ids[blocks:2 * blocks]), draw(st.integers(0, 2**32 - 1)))


@st.composite
def transfer_jobs(draw: st.DrawFn) -> JobsCase:
    num_chunks = draw(st.integers(1, 64))
    chunk_bytes = draw(st.integers(1, 4096))
    slots = draw(st.permutations(range(num_chunks)))
    n = draw(st.integers(0, num_chunks))
    return JobsCase(num_chunks, chunk_bytes, tuple(range(100, 100 + n)), tuple(slots[:n]))


@st.composite
def queue_cases(draw: st.DrawFn) -> QueueCase:
    n = draw(st.integers(1, 8))
    jobs = tuple((job_id, draw(st.integers(0, 1 << 20))) for job_id in draw(
        st.lists(st.integers(0, 1000), min_size=n, max_size=n, unique=True)))
    fire_order = draw(st.permutations([j for j, _ in jobs]))
    steps: list[tuple] = []
    for job_id in fire_order:
        steps.extend(("poll",) for _ in range(draw(st.integers(0, 2))))
        steps.append(("fire", job_id))
    steps.append(("poll",))
    return QueueCase(jobs, tuple(steps))


SWAP_CASES = swap_cases()
PARTIAL_FIRST_CASES = swap_cases(partial_first=True)
TRANSFER_JOBS = transfer_jobs()
QUEUE_CASES = queue_cases()
