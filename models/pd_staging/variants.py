"""The variants of pd-staging: one flag per change SGLang 05c7ebf (PR #30545) made, read where it made it.

`fixed` has every change; `pre_05c7ebf` none. Each flag is read at exactly
the line the change touched:

- send planner (`plan.floor_non_last_end`, `plan.send_batch`): the grid
  flooring of a non-last send's end, and the split of a send at grid lines;
- `plan.early_send`: the early send of the cached prefix under staging;
- `plan.staging_prefix_accepted`: `register_decode_req` fails a room whose
  decode prefix is not page-aligned;
- `plan.scatter_token_range`: the decode prefix added to the scatter's rows;
- `plan.prefill_write_accepted`: the decode-size check against the slot
  rather than the rest of the ring;
- `system.PdStaging`: the last chunk's CHUNK_READY (instead of the blind tail
  scatter of the last allocated slot on all-ranks Success), the
  `_staging_outstanding` count (worker skip path, teardown and `sender.poll()`),
  and the staging completion deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class StagingVariant(Variant):
    grid_floored_sends: bool  # a non-last send's end is floored to the grid (D + k*G), not only to a page
    grid_segmented_sends: bool  # a send is split at grid lines, one `send` per slot (compute_grid_segments)
    early_send_under_staging: bool  # the cached prefix is early-sent when staging is on
    aligned_prefix_check: bool  # register_decode_req fails a room whose decode prefix is not page-aligned
    scatter_adds_decode_prefix: bool  # the scatter's rows start at D + page_start * page_size
    slot_size_write_check: bool  # the prefill write gate compares with the slot, not total_size - offset
    last_chunk_ready: bool  # the last chunk sends CHUNK_READY; no blind tail scatter on all-ranks Success
    staging_outstanding: bool  # _staging_outstanding: skip-path pop, teardown and poll wait for it
    completion_deadline: bool  # the staging completion deadline after all-ranks Success


VARIANTS = VariantTable(
    StagingVariant("fixed", grid_floored_sends=True, grid_segmented_sends=True, early_send_under_staging=True,
                   aligned_prefix_check=True, scatter_adds_decode_prefix=True, slot_size_write_check=True,
                   last_chunk_ready=True, staging_outstanding=True, completion_deadline=True),
    StagingVariant("pre_05c7ebf", grid_floored_sends=False, grid_segmented_sends=False,
                   early_send_under_staging=False, aligned_prefix_check=False, scatter_adds_decode_prefix=False,
                   slot_size_write_check=False, last_chunk_ready=False, staging_outstanding=False,
                   completion_deadline=False),
)
FIXED = VARIANTS.fixed
