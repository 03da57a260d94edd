"""The variants of pipelined-transfer: one flag per upstream change (or proposed fix), read where it was made.

`fixed` is TensorRT-LLM #15727 as merged, with its follow-ups (research note
../shared/research/trtllm_flashinfer.md, sections 1.1 and 1.12), plus the
explicit "final slice submitted" flag the #17526 review asked for. Flags:

- `split_slice_ids` (#15519 review): result frames carry a sender and a
  receiver slice id; the single-task receiver resolves by the receiver id
  (`system._on_frame`). Before: one slice id, so `slice_id >= 1` crashed it.
- `final_slice_flag` (#17526 review): completion needs the final slice
  submitted (`status.is_completed`). Before: nothing marks it, and a wait that
  skips a `None` aux task completes mid-prefill.
- `clock_from_first_chunk` (#15727 review 2026-08-14, newer executor): the
  timeout clock runs for a mid-prefill request owning an in-flight session
  (`system._send`). Before: only from the final chunk (E4).
- `retire_needs_quiescence` (#15727 review 2026-08-21): a CANCELLED/ERROR
  session is retired only when every rank has quiesced (`system._poll`).
- `retired_check_first` (section 1.8, rule 3): a retired session is caught
  before `start_transfer` at the final chunk (`system._compute`).
- `drain_deadline` (not upstream; the open review point, E3): a stalled drain
  fences the domain and releases (`system.enabled`).
- `rx_deadline` (not upstream; #17665 open): the receiver gives up on a
  transfer whose notification never came (`system.enabled`).
- `dedupe_results` (not upstream; a model finding): the receiver counts one
  final-slice and one aux result per writer rank (`system._deliver`), so a
  duplicated result cannot push `last_slice_count` past `expected_transfers`.
- `rx_release_after_drain` (not upstream for this path; the open gap that
  `tests/unittest/disaggregated/lifecycle_acceptance.md` records with two
  strict xfails): a generation-side cancel releases the destination pages only
  once every context rank has drained (the cancel-ACK, section 1.6), not at
  once (`system._may_release`).

The chunk rules (`chunks.py`) by the stored upstream commit they follow
(`tensorrt_llm/_torch/disaggregation/transceiver.py`, read in the public code
index: NVIDIA/TensorRT-LLM's own stored versions of the file cannot be listed
by commit there, so these are the forks' copies, the commits named in full in
the catalog):

- revision A, `_build_prefill_extent` (positional lists, -1 for "not in this
  chunk"): patchychen-nv 75f9adba and AlessioNetti c2908f58, identical rules.
  The first chunk starts at block 0, a non-final end floors (`boundary=A`), the
  final one rounds up and its token end is clipped at the prompt; a non-final
  chunk covering no block returns None; a window group shorter than the prompt
  is all -1 in a non-final chunk and whole in the final one
  (`is_pipelined_group`); and a non-final chunk in which no group holds an id
  (>= 0) returns None: no slice, no slice id, no result frame (issue 30,
  `chunks.all_deferred`). The check reads the sender's own ids, so a chunk the
  receiver has cached is still sent.
- revision A, `_build_prefill_chunk` (compact `KVSlice` lists): bo-nv
  e6c88611 has the same coordinates, the same deferral (also for groups with no
  token axis) and the same check, as "no group's list has an entry"; its final
  token end is not clipped (`chunk_end * tpb`).
- revision B, `_build_prefill_chunk` with `ChunkCoords`: athena-nv 01177a95
  rounds every end up (`boundary=B`; unaligned neighbours share a block) and
  honours `py_kv_prefix_sent` (`prefix_sent`). It returns a slice for every
  chunk (no None) and defers no group: each group is projected onto the chunk
  (`project_blocks_to_global_chunk`, resident up to the chunk's end). So
  `boundary=B` takes its coordinates with revision A's deferral and empty-chunk
  rule, a combination no stored revision has.

Every stored revision that defers window groups has the all -1 check, and the
one without the check defers nothing, so no stored revision emits an all -1
non-final slice: the model's earlier slice for such a chunk was a model error,
not an upstream revision, and no variant keeps it. Of the flags above, the
stored transceivers show `retire_needs_quiescence`: 75f9adba and c2908f58
retire a cancelled or failed session only after the consensus over every
rank's `locally_quiesced`, 01177a95 without asking. The other flags follow the
review threads by date; their code was not among the stored versions read.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class PipelinedVariant(Variant):
    split_slice_ids: bool  # #15519 review: sender_slice_id and receiver_slice_id in result frames
    final_slice_flag: bool  # #17526 review: completion requires "final slice submitted"
    clock_from_first_chunk: bool  # #15727 review: timeouts cover mid-prefill requests with an in-flight session
    retire_needs_quiescence: bool  # #15727 review: retire CANCELLED/ERROR only when quiesced on every rank
    retired_check_first: bool  # section 1.8 rule 3: retired session caught before start_transfer
    drain_deadline: bool = False  # proposed (open upstream): a stalled cancel drain is fenced and released
    rx_deadline: bool = False  # proposed (#17665 open): the receiver times out a missing notification
    dedupe_results: bool = False  # proposed (model finding): count one final / aux result per writer rank
    rx_release_after_drain: bool = False  # proposed (lifecycle ledger, open): gen cancel waits for the drain ACK


def _v(name: str, **changes: bool) -> PipelinedVariant:
    flags = dict(split_slice_ids=True, final_slice_flag=True, clock_from_first_chunk=True,
                 retire_needs_quiescence=True, retired_check_first=True)
    flags.update(changes)
    return PipelinedVariant(name, **flags)


VARIANTS = VariantTable(
    _v("fixed"),
    _v("pre_15519", split_slice_ids=False),
    _v("pre_17526", final_slice_flag=False),
    _v("final_chunk_clock", clock_from_first_chunk=False),
    _v("local_quiescence", retire_needs_quiescence=False),
    _v("retired_unchecked", retired_check_first=False),
    _v("proposed_drain_deadline", drain_deadline=True),
    _v("proposed_rx_deadline", rx_deadline=True),
    _v("proposed_dedupe_results", dedupe_results=True),
    _v("proposed_rx_release_after_drain", rx_release_after_drain=True),
)
FIXED = VARIANTS.fixed
