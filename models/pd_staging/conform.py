"""The engines' code `pd-staging` is checked against (`kvsim conform sglang`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.sglang`, imported only when the target runs). `releases`: the variant each release follows.
"""

from __future__ import annotations

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Unreached, Upstream

STAGING_BUFFER = "sglang/srt/disaggregation/common/staging_buffer.py"
STAGING_HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
# the equivalent mutants of the head slice and the layout on every configuration a TP setup builds (the model's
# HeadReshard: each TP size a divisor or a multiple of the head count and of the other TP size)
HEAD_QUOTIENTS = (("total_kv_heads", "src_attn_tp_size"), ("total_kv_heads", "dst_attn_tp_size"),
                  ("src_attn_tp_size", "total_kv_heads"), ("dst_attn_tp_size", "total_kv_heads"))
MAX_IS_SYMMETRIC = "max's two arguments swapped: the same maximum"
WHOLE_QUOTIENT = ("floor made ceiling division: in every TP setup one of the two divides the other, so the quotient "
                  "is whole or its max(1, ...) is 1 either way (the model refuses the other configurations)")
EQUAL_TP = ("the P_tp > D_tp branch taken at P_tp == D_tp too: there both branches give (0, heads per rank, 0, heads "
            "per rank), one writer")
KERNEL_SYMBOLS = {
    "gather": ("gather_all_layers_to_staging", "_gather_all_layers_triton", "_gather_all_layers_torch",
               "_fused_gather_to_staging_kernel"),
    "scatter": ("scatter_staging_to_kv", "_scatter_staging_to_kv_triton", "_scatter_staging_to_kv_torch",
                "_fused_scatter_from_staging_kernel", "compute_head_slice_params")}
KERNEL_CHECKED = {
    ("gather", "triton"): ("gather_all_layers_to_staging", "_gather_all_layers_triton",
                           "_fused_gather_to_staging_kernel"),
    ("gather", "torch"): ("gather_all_layers_to_staging", "_gather_all_layers_torch", "gather_kv_head_slices"),
    ("scatter", "triton"): ("scatter_staging_to_kv", "_scatter_staging_to_kv_triton",
                            "_fused_scatter_from_staging_kernel"),
    ("scatter", "torch"): ("scatter_staging_to_kv", "_scatter_staging_to_kv_torch", "scatter_kv_head_slices")}
KERNEL_DOCS = {
    ("gather", "triton"): "gather_all_layers_to_staging through the fused Triton kernel (interpreted on the CPU) vs "
                          "gather_head_slice_to_staging, bit for bit over the staging buffer; 1/2/4-byte dtypes "
                          "(probe: 8-byte elements are mis-copied)",
    ("gather", "torch"): "gather_all_layers_to_staging through the torch.gather fallback vs "
                         "gather_head_slice_to_staging, bit for bit (a signalling NaN quieted tolerated), four dtypes",
    ("scatter", "triton"): "scatter_staging_to_kv through the fused Triton kernel vs scatter_staging_to_pages for "
                           "every writer of the decode rank, bit for bit over the decode pool; 1/2/4-byte dtypes",
    ("scatter", "torch"): "scatter_staging_to_kv through the torch fallback vs scatter_staging_to_pages for every "
                          "writer, bit for bit over the decode pool, four dtypes"}


RESIZED = ("the staging view reshaped with two of its sizes swapped: torch.gather(out=) resizes an out tensor of the "
           "wrong shape to the index's (a deprecated behaviour, with a UserWarning), in the same storage from the same "
           "offset, so the same bytes are written (were it to stop resizing, the call would raise)")
RESHAPED = ("the layer's staging view reshaped with two of its sizes swapped: scatter_kv_head_slices reshapes it to "
            "(tokens, heads, head size) again before the copy, and a contiguous view holds the same elements in the "
            "same order either way")
SHORTCUT = ("page_size == 1 -> == 0: no page size is 0, and the general branch at page size 1 makes the same token "
            "indices (page * 1 + arange(1))")
SAME_DEVICE = ("the device check's K and V lists swapped: it asserts both non-empty and the first list's device, and "
               "upstream's pool puts K and V on one device")
WRITERS = "num_writers = prefill_attn_tp_size // max(1, decode_attn_tp_size)"


def _torch_path_survivors(kind: str) -> tuple[Survivor, ...]:
    """The equivalent mutants of a torch path (all of its mutants run, `--mutants 0`)."""
    launcher, helper = KERNEL_CHECKED[kind, "torch"][1:]
    view = "staging_view[offset : offset + per_layer_bytes]" if kind == "gather" else \
        "staging_buffer_view[offset : offset + per_layer_bytes]"
    shared = (
        Survivor(launcher if kind == "gather" else helper, "constant", "1", SHORTCUT, replacement="0",
                 line="if page_size == 1:"),
        *(Survivor(launcher, "arguments", original, RESIZED if kind == "gather" else RESHAPED, line=view)
          for original in ("num_tokens, num_heads", "num_heads, head_dim")),
        Survivor(KERNEL_CHECKED[kind, "torch"][0], "arguments", "k_buffers, v_buffers", SAME_DEVICE,
                 line="_check_kv_on_staging_device("))
    return shared if kind == "gather" else shared + _writer_count(launcher)


def _writer_count(launcher: str) -> tuple[Survivor, ...]:
    """The scatter launchers' writer count (`num_writers`), alike on both paths."""
    return (
        Survivor(launcher, "comparison", ">", "the P_tp > D_tp branch taken at P_tp == D_tp too: P_tp // D_tp is one "
                 "writer there, as the other branch says", line="if prefill_attn_tp_size > decode_attn_tp_size:"),
        Survivor(launcher, "division", "prefill_attn_tp_size // max(1, decode_attn_tp_size)", WHOLE_QUOTIENT),
        Survivor(launcher, "constant", "1", "max(1, D_tp) -> max(0, D_tp): every TP size is >= 1", replacement="0",
                 line=WRITERS),
        Survivor(launcher, "arguments", "1, decode_attn_tp_size", "max's two arguments swapped", line=WRITERS))


MASKED_INDEX = ("the page index a masked-off lane loads (other=0 -> 1) only feeds that lane's load and store, both "
                "masked off too")
INT_VIEW = ("the element-size -> integer-dtype map's key 2 made 3: a 2-byte pool then takes the map's default, "
            "torch.int16, the same view")


HEADS = "_, num_heads, _, _ = compute_head_slice_params("
SYMMETRIC_HEADS = ("the writers' head count, the one value read of compute_head_slice_params, is "
                   "max(1, H // max(P_tp, D_tp)): the same with the two TP sizes swapped")
ANY_RANK = "the writers' head count does not depend on the ranks (every writer sends as many heads)"


def _triton_path_survivors(kind: str) -> tuple[Survivor, ...]:
    """The equivalent mutants of a Triton path (all of its mutants run, `--mutants 0`)."""
    dispatcher, launcher, kernel = KERNEL_CHECKED[kind, "triton"]
    scatter = () if kind == "gather" else _writer_count(launcher) + (
        Survivor(launcher, "arguments", "prefill_attn_tp_size,\n        decode_attn_tp_size", SYMMETRIC_HEADS,
                 line=HEADS),
        Survivor(launcher, "constant", "0", ANY_RANK, replacement="1", line=HEADS),
        Survivor(launcher, "arguments", "0,\n        dst_tp_rank", ANY_RANK, line=HEADS),
        Survivor(launcher, "bound", "num_writers", "one writer offset more than the grid's writers: the kernel never "
                 "reads it", replacement="(num_writers) + 1", line="for wr in range(num_writers)"),
        Survivor(launcher, "constant", "2", "the staging view's length halved: the kernel addresses the staging "
                 "storage by pointer and offset, never the view's length", replacement="1",
                 line="num_tokens * elems_per_token * dtype_size * num_layers * 2 * num_writers"))
    return scatter + (
        Survivor(kernel, "constant", "0", MASKED_INDEX, replacement="1",
                 line="page_val = tl.load(page_indices + page_id, mask=mask, other=0)"),
        Survivor(launcher, "constant", "2", INT_VIEW, replacement="3",
                 line="int_dtype_map = {1: torch.int8, 2: torch.int16, 4: torch.int32}"),
        Survivor(dispatcher, "arguments", "k_buffers, v_buffers", SAME_DEVICE, line="_check_kv_on_staging_device("))


KERNEL_SURVIVORS = {**{(kind, "torch"): _torch_path_survivors(kind) for kind in ("gather", "scatter")},
                    **{(kind, "triton"): _triton_path_survivors(kind) for kind in ("gather", "scatter")}}


def other_path(kind: str, path: str) -> tuple[Unreached, ...]:
    """The dispatcher's call of the other path: that path's target checks it (this one never takes it)."""
    other = "torch" if path == "triton" else "triton"
    dispatcher, launcher = KERNEL_CHECKED[kind, other][:2]
    return (Unreached(dispatcher, f"return {launcher}(", f"the {other} path's call: staging-{kind}-{other} checks it"),)


PREFILL = "sglang/srt/disaggregation/prefill.py"
CONN = "sglang/srt/disaggregation/common/conn.py"
MEM_COMMON = "sglang/srt/mem_cache/common.py"
MIXIN = "SchedulerDisaggregationPrefillMixin"
# 05c7ebf's grid-floored, grid-split sends: in 0.5.18 (compute_grid_segments), then the ring's #37166
GRID_SENDS = ((None, "pre_05c7ebf"), ("0.5.18", "fixed"), ("0.5.19", "sglang_0_5_23"))
ENTRY_FIELDS = ("an entry without an allocation (alloc id < 0) is read for its id, and for its offset only as "
                "ALLOC_OVERSIZED: its round, end and pages are never read, and -1, -0 or -2 as its id (-1 or 0 as its "
                "offset) read alike")
SAME_TEST = "the entry's offset is >= 0 exactly when its alloc id is (both negative without an allocation)"
REQ = "handle_staging_req"
DEDUPE_SURVIVORS = (
    Survivor(REQ, "constant", "0", f"{SAME_TEST}; kv_item_lens[1] for [0]: every item of the pool has one size; "
                                   f"{ENTRY_FIELDS}"),
    Survivor(REQ, "constant", "1", "max(1, attn_tp_size) with 0 or 2 where the TP size is >= 1 and only names the "
                                   "decode rank (a slot's size depends on no rank), or max(0, ...) of the heads per "
                                   f"rank where they are >= 1; {ENTRY_FIELDS}"),
    Survivor(REQ, "division", "len(kv_item_lens) // 2", "the pool lists K and V of each layer: an even count"),
    Survivor(REQ, "division", "kv_item_lens[0] // page_size",
             "an item is whole tokens of a page: page_size divides it"),
    Survivor(REQ, "division", "total_kv_heads // max(1, attn_tp_size)",
             "the TP size divides the head count or exceeds it (max(1, 0) and max(1, 1) alike)"),
    Survivor(REQ, "division", "decode_bytes_per_token // dst_heads_per_rank",
             "a token's bytes are whole heads of this rank"),
    Survivor(REQ, "arguments", "1, total_kv_heads // max(1, attn_tp_size)", "max's two arguments swapped"),
    Survivor(REQ, "arguments", "1, attn_tp_size", "max's two arguments swapped"),
    Survivor(REQ, "arguments", "chunk_tokens,\n            bytes_per_head_per_token",
             "tokens and head bytes swapped: the layout multiplies them"),
    Survivor(REQ, "arguments", "bytes_per_head_per_token,\n            num_kv_layers",
             "head bytes and layers swapped: the layout multiplies them"),
)
WRITERS = "DecodeStagingHandler.num_writers_for"
FAN_IN_SURVIVORS = (
    Survivor(WRITERS, "comparison", ">", "prefill_tp > decode_tp made >=: both give one writer at equal TP sizes"),
    Survivor(WRITERS, "division", "prefill_tp // max(1, self.decode_tp)",
             "a decode TP size divides a larger prefill TP size"),
    Survivor(WRITERS, "constant", "1", "max(1, decode_tp) with 0: every TP size is >= 1"),
    Survivor(WRITERS, "arguments", "1, self.decode_tp", "max's two arguments swapped"),
    Survivor(WRITERS, "division", "prefill_info.pp_size // self.kv_manager.pp_size",
             "a decode PP size divides the prefill's (the model's W counts whole prefill stages per decode stage)"),
)
SCATTER, ADVANCE = "DecodeStagingHandler.submit_chunk_scatter", "DecodeStagingHandler.advance_scatter"
COMPLETION_SURVIVORS = (
    Survivor(SCATTER, "boolean", "staging_offset < 0 or alloc_id < 0", SAME_TEST),
    Survivor(SCATTER, "constant", "1", ENTRY_FIELDS),
    Survivor(SCATTER, "constant", "0", ENTRY_FIELDS),
    Survivor(ADVANCE, "constant", "0", SAME_TEST + " (info[1] for info[0])"),
    Survivor(ADVANCE, "comparison", ">", "the deadline's boundary: an elapsed time equal to the timeout to the "
                                         "clock's resolution is not an input (cases are well before or well past it)"),
)
HANDLER_HELPERS = ("StagingAllocator", "compute_staging_layout", "resolve_total_kv_heads")


def handler_target(name: str, adapter: str, checked: tuple[str, ...], survivors: tuple[Survivor, ...],
                   doc: str) -> ConformTarget:
    """A decode staging handler decision (`kvsim.conform.sglang.findings`): the handler class and
    `handle_staging_req`, upstream's ring class and layout helpers beside them."""
    return ConformTarget(
        "sglang", name,
        upstream=(Upstream(STAGING_BUFFER, HANDLER_HELPERS, checked=()),
                  Upstream(STAGING_HANDLER, ("DecodeStagingHandler", "handle_staging_req"), checked=checked)),
        adapter=f"kvsim.conform.sglang.findings:{adapter}", releases=FRESH_ROUND, survivors=survivors, doc=doc)
FRESH_ROUND = ((None, "fixed"), ("0.5.19", "sglang_0_5_23"))  # SGLang #37166: an emptied ring starts a fresh round

# What the send plan's checked methods hold beyond pd-staging (a room of one full-attention model, staging on):
# the last chunk's KV checksum, hybrid models' state payloads, NPU hooks, host-tensor page indices, the overlap
# event of an early send, DCP/CP shard filtering, a send not allowed yet, and staging off (one segment)
HYBRID_STATE = "the state payload of a hybrid model (Mamba, SWA, DSA, ...): pd-staging's request has no state types"
SEND_PLAN_UNREACHED = (
    Unreached(f"{MIXIN}.send_kv_chunk", "if last_chunk and computer is not None:",
              "the last chunk's KV checksum: no checksum computer in pd-staging"),
    *(Unreached(f"{MIXIN}._send_kv_chunk", f"def {payload}(", HYBRID_STATE) for payload in (
        "_mamba_payload", "_swa_payload", "_full_kv_pages_payload", "_minimax_payload", "_dsa_pages_payload",
        "_dsa_tail_payload", "_qsa_pending_payload", "_swa_ring_payload", "_request_state_payload",
        "_request_row_payload")),
    Unreached(f"{MIXIN}._send_kv_chunk", "if _is_npu and isinstance(", "an Ascend NPU's state hooks"),
    Unreached(f"{MIXIN}._send_kv_chunk", "state_indices = [", HYBRID_STATE + " (the list over them is empty)"),
    Unreached(f"{MIXIN}._send_kv_chunk", "segments = [(start_idx, end_idx)]",
              "staging off and no transfer limit: one segment (pd-staging plans the staging path)"),
    Unreached(f"{MIXIN}._send_kv_chunk", 'if getattr(sender, "supports_host_tensor_indices", False)',
              "a sender taking host-tensor page indices (the RDMA backends'; the adapter's sender records sends)"),
    Unreached(f"{MIXIN}._send_kv_chunk", "if indices_event is not None:",
              "the host-tensor indices' copy event (as above)"),
    Unreached(f"{MIXIN}.maybe_send_cached_prefix_chunk", "if self.enable_overlap:",
              "overlap scheduling's CUDA event before an early send"),
    Unreached(f"{MIXIN}.maybe_send_cached_prefix_chunk", "if req.pending_bootstrap or not allow_send:",
              "a room still bootstrapping or a HiCache load-back in flight: pd-staging sends after bootstrap"),
    Unreached("CommonKVSender._prepare_send_indices", "if self.kv_mgr.kv_shard_size > 1:",
              "DCP shard filtering: pd-staging's prefill has no decode context parallelism"),
    Unreached("CommonKVSender._prepare_send_indices", "elif (", "CP-rank filtering (all CP ranks transfer)"),
    Unreached("CommonKVSender._prepare_send_indices", "elif self.kv_mgr.is_dummy_cp_rank:",
              "a dummy CP rank's sends"),
)
NO_PAGE_SENT = ("the only difference: the room's entry in disagg_prefill_pending_chunk_rids (the compaction gate), "
                "outside pd-staging")
SEND_PLAN_SURVIVORS = (
    Survivor(f"{MIXIN}.maybe_send_cached_prefix_chunk", "arguments", "0, req.prefix_len - req.host_hit_length",
             "max's two arguments swapped"),
    Survivor(f"{MIXIN}._send_kv_chunk", "arguments", "req.extend_end, transfer_input_len",
             "min's two arguments swapped"),
    Survivor(f"{MIXIN}.maybe_send_cached_prefix_chunk", "boolean",
             "self.enable_staging and req.early_send_prefix_end is None",
             "a clause of the snapshot's test dropped: staging is always on here (pd-staging plans the staging path; "
             "staging off is the unreached one-segment path), and a snapshot taken again before each batch is the "
             "first one (the request keeps its prefix: pd-staging has no overlap scheduling, where the prefix grows "
             "past the sent cursor before a batch's send)"),
    Survivor(f"{MIXIN}.maybe_send_cached_prefix_chunk", "comparison", "<=",
             "an early send from the cursor to itself: floored to the grid, it ends at or before the cursor and sends "
             "no page; " + NO_PAGE_SENT),
    Survivor(f"{MIXIN}._send_kv_chunk", "comparison", "<",
             "end_idx == start_idx made a skip: only on a call that is not the last (D <= L - 1 and every earlier send "
             "ends before L), whose one empty segment sends nothing (should_send_kv_chunk(0, False)) and leaves "
             "start_send_idx; " + NO_PAGE_SENT),
    Survivor(f"{MIXIN}._send_kv_chunk", "arguments", "len(page_indices), segment_is_last",
             "should_send_kv_chunk's arguments swapped: `a > 0 or b` holds exactly when one of a page count and a "
             "bool is non-zero, whichever is a"),
    Survivor("CommonKVSender.should_send_kv_chunk", "boolean", "num_pages > 0 or last_chunk",
             "a last send without pages (metadata only) dropped: the last batch always has tokens past "
             "start_send_idx (D <= L - 1, every earlier send ends before L), so its final segment holds a page"),
    Survivor("kv_to_page_indices", "division", "kv_indices[::page_size] // page_size",
             "ceiling division of a page's first slot: every segment starts on a page (D page-aligned since "
             "05c7ebf, grid ends whole pages), and the paged allocator puts a page's first slot at page id x "
             "page_size"),
)

CONFORM = (
    ConformTarget(
        "sglang", "compute_head_slice_params",
        upstream=(Upstream(STAGING_BUFFER, ("compute_head_slice_params",)),),
        adapter="kvsim.conform.sglang.staging:HEAD_SLICE",
        doc="head slice per (prefill rank, decode rank) pairing, exhaustive",
        survivors=(
            *(Survivor("compute_head_slice_params", "arguments", f"1, {a} // {b}", MAX_IS_SYMMETRIC)
              for a, b in HEAD_QUOTIENTS),
            *(Survivor("compute_head_slice_params", "division", f"{a} // {b}", WHOLE_QUOTIENT)
              for a, b in HEAD_QUOTIENTS),
            Survivor("compute_head_slice_params", "comparison", ">", EQUAL_TP),
        )),
    ConformTarget(
        "sglang", "compute_staging_layout",
        upstream=(Upstream(STAGING_BUFFER, ("compute_staging_layout", "compute_head_slice_params"),
                           checked=("compute_staging_layout",)),),
        adapter="kvsim.conform.sglang.staging:LAYOUT",
        doc="writers and bytes of one staging slot, exhaustive",
        survivors=(
            Survivor("compute_staging_layout", "arguments", "1, dst_attn_tp_size", MAX_IS_SYMMETRIC),
            Survivor("compute_staging_layout", "division", "src_attn_tp_size // max(1, dst_attn_tp_size)",
                     WHOLE_QUOTIENT),
            Survivor("compute_staging_layout", "comparison", ">", EQUAL_TP),
            Survivor("compute_staging_layout", "arguments", "src_attn_tp_size,\n            dst_attn_tp_size",
                     "the TP sizes swapped in the head-slice call: a writer then sends max(1, heads // the larger TP) "
                     "heads either way"),
            Survivor("compute_staging_layout", "constant", "1",
                     "max(1, dst_attn_tp_size) -> max(0, ...): every TP size is >= 1 (and 0 raises "
                     "ZeroDivisionError in the head slice either way)"),
            Survivor("compute_staging_layout", "arguments", "wr,\n            dst_tp_rank",
                     "the writer index and the decode rank swapped: the heads a writer sends depend on neither"),
        )),
    *(ConformTarget(
        "sglang", f"staging-{kind}-{path}",
        upstream=(Upstream(STAGING_BUFFER, KERNEL_SYMBOLS[kind], checked=KERNEL_CHECKED[kind, path]),),
        adapter=f"kvsim.conform.sglang.kernels:{kind.upper()}_{path.upper()}", unreached=other_path(kind, path),
        survivors=KERNEL_SURVIVORS.get((kind, path), ()),
        doc=KERNEL_DOCS[kind, path]) for kind in ("gather", "scatter") for path in ("triton", "torch")),
    ConformTarget(
        "sglang", "send_plan",
        upstream=(Upstream(MEM_COMMON, ("kv_to_page_indices", "kv_to_page_num")),
                  Upstream(PREFILL, (MIXIN,), checked=tuple(f"{MIXIN}.{m}" for m in (
                      "send_kv_chunk", "_send_kv_chunk", "maybe_send_cached_prefix_chunk"))),
                  Upstream(CONN, ("CommonKVSender",), checked=("CommonKVSender._prepare_send_indices",
                                                                "CommonKVSender.should_send_kv_chunk",
                                                                "CommonKVSender.init")),
                  Upstream(STAGING_HANDLER, ("PrefillStagingStrategy",), checked=())),
        adapter="kvsim.conform.sglang.send_plan:PLAN", releases=GRID_SENDS, unreached=SEND_PLAN_UNREACHED,
        survivors=SEND_PLAN_SURVIVORS,
        doc="the prefill send plan (token ranges, pages, chunk_idx, is_last, state per send) of upstream's "
            "send_kv_chunk, driven room by room against plan_room_sends; the plan properties on it"),
    handler_target("staging-dedupe", "DEDUPE", ("handle_staging_req",), DEDUPE_SURVIVORS,
                   "handle_staging_req's dedupe test, slot size and STAGING_RSP vs decode_rules.req_allocates; "
                   "late-REQ finding on upstream"),
    handler_target("staging-fan-in", "FAN_IN", ("DecodeStagingHandler.handle_chunk_arrived", WRITERS),
                   FAN_IN_SURVIVORS,
                   "handle_chunk_arrived's fan-in count vs decode_rules.fan_in_complete; dup-ready finding on upstream"),
    handler_target("staging-completion", "COMPLETION", (ADVANCE, SCATTER), COMPLETION_SURVIVORS,
                   "advance_scatter's completion rule vs decode_rules.scatter_complete; lost-REQ finding on upstream"),
    ConformTarget(
        "sglang", "StagingAllocator",
        upstream=(Upstream(STAGING_BUFFER, ("StagingAllocator",)),
                  Upstream(STAGING_HANDLER, ("is_watermark_ready",), checked=())),
        adapter="kvsim.conform.sglang.ring:LOCKSTEP", releases=FRESH_ROUND,
        doc="ring assign/free in lockstep with the model (one Hypothesis state machine), every observable after "
            "every step",
        survivors=(Survivor("StagingAllocator", "arguments", "self.base_ptr, self.buffer.device.type",
                            "_device_ptr_type_str's arguments swapped: only a log line's text changes, and only on "
                            "XPU"),)),
    ConformTarget(
        "sglang", "is_watermark_ready",
        upstream=(Upstream(STAGING_HANDLER, ("is_watermark_ready",)),),
        adapter="kvsim.conform.sglang.ring:GATE",
        doc="prefill write gate, exhaustive over a small domain",
        survivors=(Survivor("is_watermark_ready", "comparison", "<=",
                            "alloc_round <= 0 made < 0: round 0 is then ready through prev_round -1 < wm_round, "
                            "and no watermark round is negative"),)),
)
