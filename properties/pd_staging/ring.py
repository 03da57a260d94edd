"""pd-staging: head slicing (S12), slot layout, and the staging ring (S6, S8, watermark semantics).

Research note: ../shared/research/sglang.md, sections 2.3 and 2.6. These
functions are unchanged by 05c7ebf, so every property here holds on both
variants; the tests show each can fail by planting a mutation.
"""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pd_staging import layout
from kvsim.models.pd_staging import ring as ring_model
from kvsim.models.pd_staging.layout import HeadReshard
from kvsim.models.pd_staging.ring import StagingAllocator
from kvsim.models.pd_staging.variants import StagingVariant

from .cases import LLAMA_31_8B, LLAMA_LAYOUT, OVERCOMMIT, RING_SOMETIMES, STALE_HEAD, LayoutCase, RingCase

MODEL = "pd-staging"


@kv_property(model=MODEL, strategy="HEAD_RESHARDS", examples=(LLAMA_31_8B,))
def head_slices_cover_decode_heads(cfg: HeadReshard, variant: StagingVariant) -> None:
    """S12: the writers of each decode rank fill exactly its heads [0, dst_per) with the right global heads.

    Writer indices are 0..W-1 once each; each writer's slice lands on the
    decode positions that hold the same global heads; without replication
    (P_tp <= H) the slices are pairwise disjoint, so they partition the heads.
    """
    for d in range(cfg.decode_tp):
        want = cfg.decode_heads(d)
        writers = layout.writers_of_decode_rank(cfg, d)
        idx = sorted(p.writer_index for _, p in writers)
        if idx != list(range(cfg.num_writers)) or any(p.num_writers != cfg.num_writers for _, p in writers):
            raise PropertyViolation(f"writer indices of decode rank {d} ({cfg}): expected 0..{cfg.num_writers - 1} "
                                    f"once each, got {idx}")
        covered: list[int] = []
        for r, p in writers:
            src = cfg.prefill_heads(r)[p.src_head_start:p.src_head_start + p.num_heads]
            dst = want[p.dst_head_start:p.dst_head_start + p.num_heads]
            if len(src) != p.num_heads or src != dst:
                raise PropertyViolation(
                    f"global heads prefill rank {r} writes at decode rank {d} heads [{p.dst_head_start}, "
                    f"{p.dst_head_start + p.num_heads}) ({cfg}): expected {dst}, got {src}")
            covered.extend(range(p.dst_head_start, p.dst_head_start + p.num_heads))
        if sorted(set(covered)) != list(range(cfg.dst_per)):
            raise PropertyViolation(f"local heads of decode rank {d} covered by its writers ({cfg}): expected "
                                    f"0..{cfg.dst_per - 1}, got {sorted(set(covered))}")
        if cfg.prefill_tp <= cfg.total_kv_heads and len(covered) != len(set(covered)):
            raise PropertyViolation(f"head slices of decode rank {d}'s writers ({cfg}): expected pairwise disjoint, "
                                    f"got heads {sorted(covered)}")


@kv_property(model=MODEL, strategy="LAYOUT_CASES", examples=(LLAMA_LAYOUT,))
def staging_layout_tiles_slot(case: LayoutCase, variant: StagingVariant) -> None:
    """Slot layout: writer-major, then K before V, then layer; the regions tile [0, total_bytes) exactly."""
    lay = layout.compute_staging_layout(case.cfg, case.decode_rank, case.tokens, case.num_layers, case.head_bytes)
    pos = 0
    for w in range(len(lay.writer_heads)):
        if lay.writer_offsets[w] != pos:
            raise PropertyViolation(f"offset of writer {w}: expected {pos} (sum of earlier writers), "
                                    f"got {lay.writer_offsets[w]}")
        for kv in (0, 1):
            for layer in range(case.num_layers):
                a, b = lay.region(w, kv, layer)
                size = case.tokens * lay.writer_heads[w] * case.head_bytes
                if (a, b) != (pos, pos + size):
                    raise PropertyViolation(f"bytes of writer {w} {'KV'[kv]} layer {layer}: expected "
                                            f"[{pos}, {pos + size}), got [{a}, {b})")
                pos = b
    if lay.total_bytes != pos:
        raise PropertyViolation(f"slot total_bytes: expected {pos} (the regions laid end to end), "
                                f"got {lay.total_bytes}")


def _steps(case: RingCase, variant: StagingVariant) -> list[ring_model.RingStep]:
    return ring_model.apply_ring_ops(StagingAllocator(case.total), case.ops, variant)


@kv_property(model=MODEL, strategy="RING_CASES", examples=(OVERCOMMIT,), sometimes=RING_SOMETIMES)
def ring_assign_in_bounds(case: RingCase, variant: StagingVariant) -> None:
    """`assign(n)` succeeds iff n <= total, inside [0, total); live allocations of one round never overlap."""
    for n, step in enumerate(_steps(case, variant)):
        if step.op != "assign":
            continue
        a = step.alloc
        if (a is None) != (step.arg > case.total):
            raise PropertyViolation(f"assign({step.arg}) at op {n} on a ring of {case.total}: expected "
                                    f"{'None' if step.arg > case.total else 'an allocation'}, got {a}")
        if a is not None and not (0 <= a.offset and a.end <= case.total and a.size == step.arg):
            raise PropertyViolation(f"allocation at op {n}: expected {step.arg} bytes in [0, {case.total}), got {a}")
        bad = ring_model.same_round_overlaps(step.ring.allocations)
        if bad:
            raise PropertyViolation(f"live allocations of one round after op {n}: expected disjoint, got {bad[0]}")


@kv_property(model=MODEL, strategy="RING_CASES", examples=(OVERCOMMIT, STALE_HEAD), sometimes=RING_SOMETIMES)
def ready_allocations_never_overlap_older_rounds(case: RingCase, variant: StagingVariant) -> None:
    """S6: an allocation the watermark lets prefill write overlaps no live allocation of an earlier round."""
    for n, step in enumerate(_steps(case, variant)):
        bad = ring_model.unsafe_ready_pairs(step.ring)
        if bad:
            a, b = bad[0]
            raise PropertyViolation(f"live data under a writable allocation after op {n} (watermark "
                                    f"{step.ring.watermark}): expected no overlap, got {a} over {b}")


@kv_property(model=MODEL, strategy="RING_CASES", examples=(OVERCOMMIT,), sometimes=RING_SOMETIMES)
def watermark_never_decreases(case: RingCase, variant: StagingVariant) -> None:
    """S8: the WATERMARK broadcast after each free never moves backwards (lexicographic (round, tail))."""
    prev = StagingAllocator(case.total).watermark
    for n, step in enumerate(_steps(case, variant)):
        wm = step.ring.watermark
        if wm < prev:
            raise PropertyViolation(f"watermark after op {n} ({step.op} {step.arg}): expected >= {prev}, got {wm}")
        prev = wm


@kv_property(model=MODEL, strategy="RING_CASES", examples=(OVERCOMMIT, STALE_HEAD), sometimes=RING_SOMETIMES)
def watermark_tracks_oldest_live(case: RingCase, variant: StagingVariant) -> None:
    """After a free the watermark is (round, offset) of the oldest live allocation, or (round, head) if none."""
    for n, step in enumerate(_steps(case, variant)):
        if step.op != "free":
            continue
        r = step.ring
        want = (r.allocations[0].round, r.allocations[0].offset) if r.allocations else (r.round, r.head)
        if r.watermark != want:
            raise PropertyViolation(f"watermark after freeing id {step.arg} (op {n}): expected {want}, "
                                    f"got {r.watermark}")


@kv_property(model=MODEL, strategy="RING_CASES", examples=(OVERCOMMIT, STALE_HEAD), sometimes=RING_SOMETIMES)
def freed_predecessors_make_ready(case: RingCase, variant: StagingVariant) -> None:
    """Once every older allocation is freed, and a free happened after it was assigned, an allocation is writable.

    The second condition is the #37166 hazard at 05c7ebf: with the ring empty
    when it was assigned, a wrapping allocation waits on the stale head.
    """
    assigned_at: dict[int, int] = {}
    last_free = -1
    steps = _steps(case, variant)
    for n, step in enumerate(steps):
        if step.op == "assign" and step.alloc is not None:
            assigned_at[step.alloc.alloc_id] = n
        elif step.op == "free":
            last_free = n
    r = steps[-1].ring if steps else StagingAllocator(case.total)
    if r.allocations:
        oldest = r.allocations[0]
        if last_free > assigned_at[oldest.alloc_id] and not r.ready(oldest):
            raise PropertyViolation(f"oldest live allocation {oldest} with watermark {r.watermark}: expected "
                                    f"writable (nothing older is live), got not ready")
