"""The variants of pd-protocol: one flag per separate change of SGLang PR #35281, and the later releases.

Each flag is read at exactly the line its change touched. The backend
(Mooncake, NIXL, Mori) is a parameter, not a variant: a change made in one
backend only is read as `backend == "nixl" and not variant.<flag>`.

`fixed` is the code right after PR #35281 (SGLang 0.5.19); `sglang_0_5_23` adds what the
releases after it changed in the modelled code: `CommonKVManager.update_status` (0.5.20: an
absent room is created only by an opening status; a Failed room returns early) and Mori's
pairing by layer id when the pools publish ids (0.5.22). `pre_35281` is 0.5.13-0.5.17.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class ProtocolVariant(Variant):
    # area 3, `bootstrap_thread` (wire.handle_bootstrap)
    bootstrap_loop_catches: bool  # Mooncake and NIXL: a try around the loop body logs and drops a bad frame
    nixl_guard_validated: bool  # NIXL: `assert msg[0] == GUARD` became a validation that drops the frame
    mori_abort_before_guard: bool  # Mori: the unguarded ABORT is dispatched before guard validation
    # area 3, the decode thread (wire.handle_decode)
    mooncake_decode_loop_catches: bool  # Mooncake: a try around the decode thread's loop body
    nixl_decode_checks_empty: bool  # NIXL: the decode thread no longer indexes msg[0] of an empty message
    # area 2, the transfer worker (rooms.worker_step)
    nixl_stale_work_checked: bool  # NIXL: `transfer_infos.get(room)` and a status check replace the assert
    # area 1, peer death (rooms.has_heartbeat_checker)
    mori_heartbeat_checker: bool  # Mori: the decode side starts a heartbeat checker
    # area 5, start-up (rooms.init_sequence)
    mooncake_fields_before_thread: bool  # Mooncake: session fields are created before the bootstrap thread starts
    # area 4, Mori's destination descriptors (mori_layout.select_dst_descriptors)
    mori_hybrid_mla_sliced: bool  # hybrid MLA is sliced as MLA, not split as MHA
    mori_same_pp_local_start: bool  # same-PP peers: no global start-layer offset into stage-local lists
    mori_common_v_offset: bool  # V offset by the common get_mha_kv_ptrs_with_pp rule, not half the list
    # after the PR (pd_common.status.update_status, called through wire.status_update)
    common_opening_only: bool  # 0.5.20: common update_status creates an absent room only from an opening status
    common_failed_terminal: bool  # 0.5.20: common update_status returns early on a Failed room
    # after the PR (mori_layout.select_dst_descriptors)
    mori_layer_id_pairing: bool  # 0.5.22: Mori pairs descriptors by layer id when either peer publishes ids


_FIXED = ProtocolVariant("fixed", bootstrap_loop_catches=True, nixl_guard_validated=True,
                         mori_abort_before_guard=True, mooncake_decode_loop_catches=True, nixl_decode_checks_empty=True,
                         nixl_stale_work_checked=True, mori_heartbeat_checker=True, mooncake_fields_before_thread=True,
                         mori_hybrid_mla_sliced=True, mori_same_pp_local_start=True, mori_common_v_offset=True,
                         common_opening_only=False, common_failed_terminal=False, mori_layer_id_pairing=False)

VARIANTS = VariantTable(  # each variant states only its differences from `fixed`
    _FIXED,
    replace(_FIXED, name="pre_35281", bootstrap_loop_catches=False, nixl_guard_validated=False,
            mori_abort_before_guard=False, mooncake_decode_loop_catches=False, nixl_decode_checks_empty=False,
            nixl_stale_work_checked=False, mori_heartbeat_checker=False, mooncake_fields_before_thread=False,
            mori_hybrid_mla_sliced=False, mori_same_pp_local_start=False, mori_common_v_offset=False),
    replace(_FIXED, name="sglang_0_5_23", common_opening_only=True, common_failed_terminal=True,
            mori_layer_id_pairing=True),
)
FIXED = VARIANTS.fixed
