"""pd-staging end to end: the decode KV after a staged transfer equals, bit for bit, a single server's KV.

Research note: ../shared/research/sglang.md, sections 2.3 (head slicing, slot
layout, decode scatter), 2.5 and 2.9 (SGLang 05c7ebf, PR #30545). This is the
model's counterpart of upstream's PD accuracy test (Llama-3.1-8B, H = 8,
prefill TP 4 -> decode TP 2, chunked prefill 256, a ~900-token shared prefix).

The composition, per decode rank: the committed send plan
(`kvsim.models.pd_staging.plan.plan_room_sends`), one staging slot per prefetched
grid cell allocated back to back in a ring exactly their size
(`models.pd_staging_ring.StagingAllocator`), and for each send every writer
of the decode rank (`writers_of_decode_rank`) gathering its head slice from
its prefill pool (`models.pd_staging_copy.gather_head_slice_to_staging`),
passing the prefill worker's gate (`prefill_write_accepted`), landing at its
writer offset of slot `chunk_idx`, and the decode scattering the slot at the
rows `scatter_token_range` names (`decode_scatter_pages`, then
`scatter_staging_to_pages` per writer: `scatter_staging_to_paged` unrolled so
`Copies` can swap in a kernel backend for either copy). The decode
scatters either as soon as a send's writers have all landed, or only after
every write has landed (`deferred_scatter`: the side stream lagging the RDMA
writes, which the ring allows while the slots are live).

On `pre_05c7ebf` the property fails two ways: a decode radix hit (D > 0)
makes the scatter write the suffix over the cached prefix rows (2.5 item 3,
scenario B), and a prefill radix hit makes a multi-slot send that either
fails the room at the prefill buffer (P_tp > D_tp since #31217) or overruns
the following slots; with deferred scatter the overrun is then overwritten
by the later send before it is scattered (2.5 item 1, scenario A).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging import plan
from kvsim.models.pd_staging.copy import decode_scatter_pages, gather_head_slice_to_staging, scatter_staging_to_pages
from kvsim.models.pd_staging.ring import StagingAllocator
from kvsim.models.pd_staging.variants import StagingVariant

from .cases import LLAMA_CASES, TransferCase

MODEL = "pd-staging"


def _random_bits(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Arbitrary bit patterns (NaN payloads included): the transfer must move bytes, not values."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return rng.integers(0, 256, nbytes, dtype=np.uint8).view(dtype).reshape(shape)


def single_server_kv(case: TransferCase) -> np.ndarray:
    """`[num_layers, 2, L, H, head_dim]`: the KV one non-disaggregated server holds for the prompt."""
    rng = np.random.default_rng([case.seed, 1])
    shape = (case.num_layers, 2, case.room.prompt_len, case.reshard.total_kv_heads, case.head_dim)
    return _random_bits(rng, shape, case.dtype)


def _pool(case: TransferCase, heads: tuple[int, ...], reference: np.ndarray, rows: int, salt: int,
          ) -> tuple[np.ndarray, np.ndarray]:
    """A garbage-filled pool with the request's pages in random order; tokens `[0, rows)` hold `heads`' KV."""
    ps = case.room.page_size
    rng = np.random.default_rng([case.seed, salt])
    num_pages = case.request_pages + case.spare_pages
    pool = _random_bits(rng, (case.num_layers, 2, num_pages, ps, len(heads), case.head_dim), case.dtype)
    pages = rng.permutation(num_pages)[:case.request_pages]
    req_to_token = (pages[:, None] * ps + np.arange(ps)[None, :]).reshape(-1)  # one slot per token row
    t = np.arange(rows)
    pool[:, :, req_to_token[t] // ps, req_to_token[t] % ps] = reference[:, :, t][:, :, :, list(heads)]
    return pool, req_to_token


@dataclass(frozen=True)
class Copies:
    """The two copies the transfer is built from; the numpy references by default, a kernel backend in the oracle.

    `gather(pool, pages, params, layout, staging, offset) -> staging` and
    `scatter(pool, staging, pages, params, layout, offset) -> pool`, with the
    signatures of `models.pd_staging_copy` (a backend may return new arrays).
    """

    gather: Callable[..., np.ndarray] = gather_head_slice_to_staging
    scatter: Callable[..., np.ndarray] = scatter_staging_to_pages


REFERENCE_COPIES = Copies()


@dataclass(frozen=True, eq=False)
class DecodeOutcome:
    """One decode rank after the transfer: its pool, and why the room failed (None when it completed)."""

    pool: np.ndarray
    failure: str | None


def transfer_to_decode_rank(case: TransferCase, decode_rank: int, variant: StagingVariant,
                            copies: Copies = REFERENCE_COPIES) -> DecodeOutcome:
    """Run the room's sends through the staging path of `decode_rank` (see the module docstring)."""
    room, res = case.room, case.reshard
    cfg, ps, nl, hb = room.cfg, room.page_size, case.num_layers, case.head_bytes
    d = cfg.decode_prefix_len
    reference = single_server_kv(case)
    decode_pool, dec_rows = _pool(case, res.decode_heads(decode_rank), reference, d, 100 + decode_rank)
    if not plan.staging_prefix_accepted(d, ps, variant):
        return DecodeOutcome(decode_pool, f"decode prefix {d} is not page-aligned: _staging_failed")
    writers = layout.writers_of_decode_rank(res, decode_rank)
    prefill = {r: _pool(case, res.prefill_heads(r), reference, room.prompt_len, 200 + r) for r, _ in writers}
    room_plan = room.plan(variant)
    slots = [layout.compute_staging_layout(res, decode_rank, r.chunk_pages * ps, nl, hb) for r in room_plan.prefetch]
    ring = StagingAllocator(sum(s.total_bytes for s in slots))
    offsets = []
    for slot in slots:
        alloc, ring = ring.assign(slot.total_bytes)
        assert alloc is not None  # the ring is exactly as large as the slots
        offsets.append(alloc.offset)
    ring_bytes = np.random.default_rng([case.seed, 3]).integers(0, 256, ring.total, dtype=np.uint8)
    buffer = layout.prefill_buffer_bytes(res, cfg.full_chunk_pages, ps, nl, hb)
    pending = []

    def scatter(send: plan.SendCall, sent: layout.StagingLayout, starts: list[int]) -> None:
        # models.pd_staging_copy.scatter_staging_to_paged, one writer at a time so a backend can do each copy
        nonlocal decode_pool
        pages = decode_scatter_pages(dec_rows, send.page_start, send.num_pages, d, ps, variant)
        for (_, params), start in zip(writers, starts):
            decode_pool = copies.scatter(decode_pool, ring_bytes, pages, params, sent, start)

    for i, send in enumerate(room_plan.sends):
        if send.num_pages == 0:
            continue
        k = send.chunk_idx
        if k >= len(slots):
            return DecodeOutcome(decode_pool, f"send {i} names chunk {k}, which was never prefetched")
        sent = layout.compute_staging_layout(res, decode_rank, send.num_pages * ps, nl, hb)
        rows = slice(d + send.page_start * ps, d + send.page_end * ps)
        starts = []
        for rank, params in writers:
            w = params.writer_index
            nbytes, start = sent.writer_size(w), offsets[k] + slots[k].writer_offsets[w]
            end_in_slot = slots[k].writer_offsets[w] + nbytes
            if not plan.prefill_write_accepted(end_in_slot, nbytes, slots[k].total_bytes, offsets[k], ring.total,
                                               buffer, variant):
                return DecodeOutcome(decode_pool, f"prefill rank {rank}'s write of send {i} ({nbytes} bytes into "
                                     f"slot {k} of {slots[k].total_bytes}) refused: the room fails")
            pool, pf_rows = prefill[rank]
            local = copies.gather(pool, pf_rows[rows][::ps] // ps, params, sent, np.zeros(nbytes, dtype=np.uint8), 0)
            ring_bytes[start:start + nbytes] = local  # the one bulk RDMA write
            starts.append(start)
        if case.deferred_scatter:
            pending.append((send, sent, starts))
        else:
            scatter(send, sent, starts)
    for args in pending:
        scatter(*args)
    return DecodeOutcome(decode_pool, None)


def expected_decode_pool(case: TransferCase, decode_rank: int) -> np.ndarray:
    """The decode rank's pool as a single server would leave it: every prompt row holds its heads' KV."""
    reference = single_server_kv(case)
    pool, _ = _pool(case, case.reshard.decode_heads(decode_rank), reference, case.room.prompt_len,
                    100 + decode_rank)
    return pool


def first_difference(case: TransferCase, decode_rank: int, got: np.ndarray, want: np.ndarray) -> str | None:
    """Where the pools differ, ignoring the rows past L in the last page (no server defines them)."""
    ps, length, d = case.room.page_size, case.room.prompt_len, case.room.decode_prefix_len
    _, rows = _pool(case, case.reshard.decode_heads(decode_rank), single_server_kv(case), 0, 100 + decode_rank)
    free = np.zeros(got.shape[2:4], dtype=bool)
    free[rows[length:] // ps, rows[length:] % ps] = True
    a, b = got.view(np.uint8).reshape(*got.shape[:5], -1), want.view(np.uint8).reshape(*want.shape[:5], -1)
    differ = (a != b).any(axis=-1) & ~free[None, None, :, :, None]  # [layer, kv, page, row in page, head]
    if not differ.any():
        return None
    by_slot = differ.any(axis=(0, 1, 4)).reshape(-1)  # pool slot page * ps + row
    prompt = by_slot[rows[:length]]
    tokens = np.flatnonzero(prompt)
    foreign = int(by_slot.sum()) - len(tokens)
    if not len(tokens):
        return f"{foreign} rows of other requests' pages overwritten, no prompt row wrong"
    t = int(tokens[0])
    layer, kv, head = (int(x) for x in np.argwhere(differ[:, :, rows[t] // ps, rows[t] % ps])[0])
    region = "cached prefix" if t < d else "suffix"
    return (f"{len(tokens)} prompt rows differ ({int((tokens < d).sum())} in the cached prefix [0, {d})) and "
            f"{foreign} rows of other pages; first: token {t} ({region} row), layer {layer} {'KV'[kv]}, "
            f"local head {head}")


def check_transfer(case: TransferCase, variant: StagingVariant, copies: Copies = REFERENCE_COPIES) -> None:
    """Raise PropertyViolation naming the first decode rank whose KV is not the single server's."""
    for rank in range(case.reshard.decode_tp):
        outcome = transfer_to_decode_rank(case, rank, variant, copies)
        if outcome.failure is not None:
            raise PropertyViolation(f"room on decode rank {rank}: expected the transfer to complete with the "
                                    f"single server's KV, got a failed room: {outcome.failure}")
        diff = first_difference(case, rank, outcome.pool, expected_decode_pool(case, rank))
        if diff is not None:
            raise PropertyViolation(f"paged KV of decode rank {rank} after the transfer: expected the single "
                                    f"server's KV bit for bit, got {diff}")


@kv_property(model=MODEL, strategy="TRANSFER_CASES", examples=LLAMA_CASES)
def decode_kv_matches_single_server(case: TransferCase, variant: StagingVariant) -> None:
    """For any prompt length, page size, chunked-prefill size, decode prefix D, prefill radix hit, total KV heads H,
    prefill TP and decode TP, every decode rank's paged KV after the staged transfer (send plan, head-slice gather,
    staging ring, scatter) equals, bit for bit, the KV a single non-disaggregated server holds, and pages of
    other requests are untouched."""
    try:
        check_transfer(case, variant)
    except ConfigError as exc:  # a copy refused its own arguments: the composition itself is inconsistent
        raise PropertyViolation(f"staged copy of the room: expected consistent arguments, got {exc}") from exc
