"""The variants of pd-staging: one flag per upstream change, read where it was made.

`fixed` is 05c7ebf (PR #30545) with every change that commit made;
`pre_05c7ebf` has none of them; `sglang_0_5_23` is `fixed` plus the later
upstream changes modelled so far (the release a user of SGLang runs today).
Each flag is read at exactly the line the change touched:

- send planner (`plan.floor_non_last_end`, `plan.send_batch`): the grid
  flooring of a non-last send's end, and the split of a send at grid lines;
- `plan.early_send`: the early send of the cached prefix under staging;
- `plan.staging_prefix_accepted`: `register_decode_req` fails a room whose
  decode prefix is not page-aligned;
- `plan.scatter_token_range`: the decode prefix added to the scatter's rows;
- `plan.prefill_write_accepted`: the decode-size check against the slot
  rather than the rest of the ring;
- `system.PdStaging` (its `prefill` and `decode` sides): the last chunk's CHUNK_READY (instead of the blind tail
  scatter of the last allocated slot on all-ranks Success), the
  `_staging_outstanding` count (worker skip path, teardown and `sender.poll()`),
  and the staging completion deadline;
- `ring.StagingAllocator.free` (after 05c7ebf): SGLang #37166, in releases
  0.5.19 and later, starts a fresh round when a free empties the ring
  (round + 1, head 0, watermark (round + 1, 0)) instead of keeping the stale
  head; `fixed` stays 05c7ebf here;
- `decode.DecodeSide._conclude` / `_release` (after 05c7ebf): the deferred decode
  KV release (#35049 Mooncake, #35360 NIXL; on by default since 0.5.21,
  `SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`, the config's
  `deferred_release`): a failed room keeps its staging slots until every
  prefill writer sent ABORT_ACK (sent once the room's chunks drained,
  `_maybe_ack_drained_abort`) or its 30 s release timeout passes;
- `decode.DecodeSide._on_decode` and `data.writers_are_stages` (after 05c7ebf): PP
  prefill writers, `num_writers_for = tp_writers * pp_writers`: several PP
  stages write one room while each prefill rank has several destinations
  (prefill TP < decode TP), and STAGING_RSP goes only to the requester's
  pp_rank (`handle_staging_req`);
- `prefill.PrefillSide._work` (05c7ebf and every release since): the Mooncake
  transfer worker re-enqueues the *whole* chunk when one destination defers
  (`_do_staging_transfer` -> `queue.put(kv_chunk)`; `break`), so destinations
  already written are written again and get a second CHUNK_READY.
  `proposed_per_dst_retry` is `sglang_0_5_23` with per-destination progress
  instead: the fix the findings propose, not an upstream release.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    # after 05c7ebf (the flags named in AFTER_05C7EBF)
    fresh_round_when_empty: bool  # SGLang #37166, 0.5.19+: a free emptying the ring starts round + 1 at head 0
    deferred_decode_kv_release: bool  # #35049/#35360, default on 0.5.21+: failed rooms hold slots until ABORT_ACKs
    pp_prefill_writers: bool  # PP staging: W = tp_writers * pp_writers; STAGING_RSP to the requester's pp_rank only
    # in 05c7ebf and every release since; False only in the proposed fix
    whole_chunk_reenqueue: bool = True  # one deferred destination re-enqueues the whole chunk (mooncake transfer_worker)


# the flags of upstream changes made after 05c7ebf
AFTER_05C7EBF = ("fresh_round_when_empty", "deferred_decode_kv_release", "pp_prefill_writers")
# behaviour of every release (before and after 05c7ebf) that only a proposed fix changes
IN_EVERY_RELEASE = ("whole_chunk_reenqueue",)


_FIXED = StagingVariant("fixed", grid_floored_sends=True, grid_segmented_sends=True, early_send_under_staging=True,
                        aligned_prefix_check=True, scatter_adds_decode_prefix=True, slot_size_write_check=True,
                        last_chunk_ready=True, staging_outstanding=True, completion_deadline=True,
                        fresh_round_when_empty=False, deferred_decode_kv_release=False, pp_prefill_writers=False)
_SGLANG_0_5_23 = replace(_FIXED, name="sglang_0_5_23", **dict.fromkeys(AFTER_05C7EBF, True))

VARIANTS = VariantTable(  # each variant states only its differences from `fixed` (or from the release it patches)
    _FIXED,
    replace(_FIXED, name="pre_05c7ebf", grid_floored_sends=False, grid_segmented_sends=False,
            early_send_under_staging=False, aligned_prefix_check=False, scatter_adds_decode_prefix=False,
            slot_size_write_check=False, last_chunk_ready=False, staging_outstanding=False, completion_deadline=False),
    _SGLANG_0_5_23,
    # not a release: 0.5.23 with the findings' proposed fix (a retry re-sends only the deferred destinations)
    replace(_SGLANG_0_5_23, name="proposed_per_dst_retry", whole_chunk_reenqueue=False),
)
FIXED = VARIANTS.fixed
