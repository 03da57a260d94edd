"""The engines' code `pd-protocol` is checked against (`kvsim conform sglang`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.sglang`, imported only when the target runs). `releases`: the variant each release follows.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Upstream

MORI = "sglang/srt/disaggregation/mori/conn.py"
CONN = "sglang/srt/disaggregation/common/conn.py"
BASE = "sglang/srt/disaggregation/base/conn.py"
# Mori's V-offset rule: PR #35281 (0.5.19; 0.5.18 still splits in half), layer-id pairing from 0.5.22
MORI_RULE = ((None, "pre_35281"), ("0.5.19", "fixed"), ("0.5.22", "sglang_0_5_23"))
# the common update_status: 0.5.20 creates an absent room only from an opening status and returns early on Failed
EARLY_RETURN = ((None, "fixed"), ("0.5.20", "sglang_0_5_23"))
MORI_METHOD, COMMON_METHOD = "MoriKVManager._get_mha_mem_desc_slices", "CommonKVManager.get_mha_kv_ptrs_with_pp"
HALVES = "floor made ceiling division of the source list's length: a prefill lists K and V of each layer (even)"
IDS_BOTH_OR_NEITHER = ("layer ids published by one peer only: outside the model (its cases publish ids on both "
                       "sides or neither), and upstream's helpers refuse None and [] alike")
LENGTH_GUARD = ("the guard len(dst) < 2 is implied by end_layer > dst_total_layers for a stage of >= 1 layer (a "
                "two-entry list with one layer is the same-PP case, returned before)")
DRAFT_TEST = ("a clause of the draft-layout test dropped or < made <=: where the other clause decides alone, "
              "n * (T // n) is T (T % n == 0), or n > T cannot pass the length guard")
MORI_SURVIVORS = (
    Survivor(MORI_METHOD, "division", "len(src_descs) // 2", HALVES),
    Survivor(MORI_METHOD, "boolean", 'getattr(self.kv_args, "kv_layer_ids", None) or []', IDS_BOTH_OR_NEITHER),
    Survivor(MORI_METHOD, "boolean", "src_layer_ids or dst_kv_layer_ids", IDS_BOTH_OR_NEITHER),
    Survivor(MORI_METHOD, "boolean", "dst_kv_layer_ids or []", IDS_BOTH_OR_NEITHER),
    Survivor(MORI_METHOD, "boolean", "len(dst_mem_descs) < 2 or end_layer > dst_total_layers", LENGTH_GUARD),
    Survivor(MORI_METHOD, "comparison", "<", LENGTH_GUARD + "; or: " + DRAFT_TEST),
    Survivor(MORI_METHOD, "constant", "2", LENGTH_GUARD),
    Survivor(MORI_METHOD, "boolean", "num_local_layers < dst_total_layers\n            and dst_total_layers % "
                                     "num_local_layers != 0", DRAFT_TEST))
COMMON_SURVIVORS = (
    Survivor(COMMON_METHOD, "division", "len(src_kv_ptrs) // 2", HALVES),
    Survivor(COMMON_METHOD, "boolean", "num_kv_layers < dst_num_total_layers\n            and dst_num_total_layers % "
                                       "num_kv_layers != 0", DRAFT_TEST),
    Survivor(COMMON_METHOD, "comparison", "<", DRAFT_TEST))
STATUS_SURVIVORS = (
    Survivor("CommonKVManager.update_status", "arguments", "bootstrap_room, None",
             "the deferred-ACK and staging bookkeeping a new room drops (pop's arguments swapped): outside the model, "
             "which has no deferred ACKs (0.5.20 clears nothing, 0.5.23 the room's)"),
    Survivor("CommonKVManager.update_status", "arguments",
             "bootstrap_room, self.deferred_bootstrap.fail(bootstrap_room)",
             "the deferred bootstrap's notification: outside the model (the stand-in has nothing to notify)"),
    Survivor("CommonKVManager.update_status", "arguments", "current, status", "max's two arguments swapped: the same "
                                                                             "maximum"))

CONFORM = (
    ConformTarget(
        "sglang", "_get_mha_mem_desc_slices",
        upstream=(Upstream(MORI, ("MoriKVManager",), checked=("MoriKVManager._get_mha_mem_desc_slices",)),),
        adapter="kvsim.conform.sglang.layout:MORI_SELECTION", releases=MORI_RULE, survivors=MORI_SURVIVORS,
        doc="Mori's K/V destination descriptors for a PP stage (exhaustive differential, layer-id branch), and the "
            "V-offset property on upstream's selection"),
    ConformTarget(
        "sglang", "get_mha_kv_ptrs_with_pp",
        upstream=(Upstream(CONN, ("CommonKVManager",), checked=("CommonKVManager.get_mha_kv_ptrs_with_pp",)),),
        adapter="kvsim.conform.sglang.layout:COMMON_SELECTION", survivors=COMMON_SURVIVORS,
        doc="the common K/V destination pointers for plain MHA (Mooncake, NIXL): exhaustive differential, the layer-id "
            "pairing Mooncake uses instead, and the V-offset property on upstream's selection"),
    ConformTarget(
        "sglang", "update_status",
        upstream=(Upstream(BASE, ("KVPoll",), checked=()),
                  Upstream(CONN, ("CommonKVManager",), checked=("CommonKVManager.update_status",))),
        adapter="kvsim.conform.sglang.status:STATUS", releases=EARLY_RETURN, survivors=STATUS_SURVIVORS,
        doc="the common room-status rule (Mooncake, NIXL), exhaustive over short traces, and failed_is_sticky on "
            "upstream's trails (the seed bug sglang-pd-common-failed-not-sticky)"),
)
