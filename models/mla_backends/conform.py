"""The engines' code `mla-backends` is checked against (`kvsim conform flashinfer`, `kvsim conform vllm`):
declarations only.

Each target names the upstream files and definitions it loads and the adapter that drives them (in
`kvsim.conform.flashinfer` and `kvsim.conform.vllm`, imported only when the target runs); `releases`: the variant
each release follows; `survivors`: the mutants a target cannot kill, each with its reason (the adapters' module
docstrings say the same).
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Unreached, Upstream

CASCADE_TEMPLATES = "flashinfer/trace/templates/cascade.py"
MERGE_REFERENCES = ("_merge_state_reference", "_merge_state_in_place_reference", "_merge_states_reference")
NO_GUARD = ((None, "merge_nan_4051"),)  # FlashInfer #4051 (open): the Python and Triton merges have no guard
MLA = "flashinfer/mla/_batch_mla"
CONTRACTS = f"{MLA}/_contracts.py"
CAPS = f"{MLA}/_backends/_capabilities.py"
POLICY = f"{MLA}/_auto_policy.py"
BACKEND_FILES = tuple(f"{MLA}/_backends/{name}_backend.py" for name in (
    "fa2", "fa3", "cutlass", "cutile", "trtllm_gen", "xqa", "cute_dsl_monolithic", "cute_dsl_modular",
    "cute_dsl_rubin_mtp"))  # read for their `_plan_capabilities` literals (their code needs CUDA builds)
PLANNING = f"{MLA}/_planning.py"
METADATA = ("_validate_csr_metadata", "_validate_dense_metadata", "_derive_csr_from_dense", "_derive_dense_from_csr",
            "_MLAPlanMetadataResolver")
WRAPPER = f"{MLA}/_wrapper.py"
AUTO, FAMILY = "_BatchMLAPagedAttentionAutoBackend", "_BatchMLAPagedAttentionCuteDslBackend"
TRITON_LAUNCHERS, TRITON_KERNELS = "flashinfer/triton/cascade.py", "flashinfer/triton/kernels/cascade.py"
# variable_length_merge_states runs with --device cuda only (the interpreter cannot run its kernel): not counted
TRITON_MERGES = ("merge_state", "merge_state_in_place", "merge_states", "variable_length_merge_states")
TRITON_STATE = ("state_merge", "state_normalize", "state_get_lse")
VLLM_DECODE = "vllm/v1/attention/ops/triton_decode_attention.py"
DECODE_CHECKED = ("decode_attention_fwd", "decode_attention_fwd_normal", "decode_attention_fwd_grouped",
                  "_decode_att_m_fwd", "_decode_grouped_att_m_fwd", "_decode_softmax_reducev_fwd", "_fwd_kernel_stage1",
                  "_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2", "_page_stride", "tanh")
REJECTION = ("plan_capability_rejection_reason", "structural_eligibility_rejection_reason")
ORDERS = ("ordered_sm80_backends", "ordered_sm90_backends", "ordered_sm100_backends", "_ordered_sm107_backends",
          "ordered_sm12x_backends", "_prefer")
MAXIMUM_IS_SYMMETRIC = "torch.maximum's two arguments swapped: the same maximum"
RESOLVER = "_MLAPlanMetadataResolver"
EQUAL_IS_SYMMETRIC = "torch.equal's two tensors swapped (directly or through _equal_tensor_values): the same test"
MAX_IS_SYMMETRIC = "max's two arguments swapped: the same maximum"
METADATA_SURVIVORS = (
    Survivor("_validate_csr_metadata", "boolean", "strict or has_canonical_batch_shape",
             "strict without a canonical batch has raised just before (the batch dimensions), so the clause is "
             "has_canonical_batch_shape wherever it is read"),
    Survivor("_validate_csr_metadata", "arguments", "expected_pages, actual_pages", EQUAL_IS_SYMMETRIC),
    Survivor("_derive_dense_from_csr", "constant", "0",
             "an empty batch's max page count 1 instead of 0: the width is max(1, ...) or the alignment's smallest "
             "positive multiple either way, and the table has no rows"),
    Survivor("_derive_dense_from_csr", "arguments", "1, max_pages", MAX_IS_SYMMETRIC),
    Survivor("_derive_dense_from_csr", "arguments", "table_width_alignment,\n            ((max_pages + "
             "table_width_alignment - 1) // table_width_alignment)\n            * table_width_alignment",
             MAX_IS_SYMMETRIC),
    Survivor("_derive_dense_from_csr", "comparison", ">", "a request with no page copies an empty slice either way"),
    Survivor(RESOLVER, "arguments", 'left.to(device="cpu"), right.to(device="cpu")', EQUAL_IS_SYMMETRIC),
    *(Survivor(RESOLVER, "arguments", pair, EQUAL_IS_SYMMETRIC) for pair in (
        "csr.qo_indptr, dense_as_csr.qo_indptr", "csr.kv_indptr, dense_as_csr.kv_indptr",
        "csr.kv_indices[:csr_live_end], dense_as_csr.kv_indices", "csr.kv_len_arr, dense_as_csr.kv_len_arr")),
    *(Survivor(RESOLVER, "boolean", clause, "the form passed in is the cached validated one, which the call returns")
      for clause in ("csr or self._validate_csr()", "dense or self._validate_dense(None)")),
    Survivor(RESOLVER, "constant", "0",
             "resolve_dense's `width > 1`: a width-1 table at alignment 1 is padded to width max(1, 1) = 1, a copy "
             "with the same values"),
    Survivor(RESOLVER, "arguments", "table_width_alignment,\n                    ((width + table_width_alignment - "
             "1) // table_width_alignment)\n                    * table_width_alignment", MAX_IS_SYMMETRIC),
    Survivor(RESOLVER, "constant", "1",
             "resolve_dense's padded width (w + a - 0) // a: reached only when w is 0 or not a multiple of a, where "
             "it equals (w + a - 1) // a"),
)
SM100, SM107 = "ordered_sm100_backends", "_ordered_sm107_backends"
FLAT = "a flat CSR (batch arrays of other lengths) is not drawn: the model's auto order resolves a strict CSR"
SM107_EVEN = ("total_q is even (2 or 4 queries a request) and the capacity a multiple of 128 (rounded up), so a "
              "limit moved by one decides the same")
MTP_GATE = "\n        or ".join((  # _ordered_sm107_backends' eligibility test, clause by clause
    "args.q_data_type != torch.float8_e4m3fn", "args.kv_data_type != torch.float8_e4m3fn",
    "args.output_dtype != torch.float8_e4m3fn", "args.num_heads != 128", "args.head_dim_ckv != 512",
    "args.head_dim_kpe != 64", "args.page_size not in (64, 128)", "not args.causal", 'args.query_layout != "packed"',
    'args.kv_cache_layout != "packed"', 'args.scale_mode != "default"', "args.sm_scale <= 0",
    'args.output_scale != "none"', "args.use_sinks", "args.use_profiler", "args.skip_softmax",
    "args.enable_pdl is True"))
MTP_BATCH = "\n        or ".join(("not 32 <= batch <= 128", "len(q_lens) != batch", "q_lens[0] not in (2, 4)",
                                 "any(q != q_lens[0] for q in q_lens)", "min(lengths) < q_lens[0]"))
AUTO_ORDER_SURVIVORS = (
    Survivor(SM100, "boolean", "not q_lens or len(q_lens) != len(kv_lens)",
             f"without `not q_lens`, an empty batch returns the same order at the total_q test; without the length "
             f"test: {FLAT}"),
    Survivor(SM100, "arguments", "q_lens, kv_lens", "zip's two lists swapped: the same products q * kv"),
    Survivor(SM100, "comparison", "<=",
             "rule 3's `output_work <= 2048` at 2048: heads * queries = 2048 needs a power-of-two head count; from 128 "
             "heads the within-eager-limit rule has already returned FA2 wherever rule 3 would, below 128 it needs "
             "32 or more decode requests, past rule 3's batch limit of 31"),
    Survivor(SM100, "constant", "2048", "rule 3's `output_work <= 2047`: differs only at 2048 (see `<=`)"),
    Survivor(SM100, "boolean", "max_q == 1 and (\n            min_kv >= 8192\n            or (output_work > 384 and "
             "max_kv > 512)\n            or (16 < heads < 32 and min_kv > 512 and max_kv <= 2048)\n        )",
             "without `max_q == 1`: a multi-query graph workload reaching it gets the CuTe-first order either way"),
    *(Survivor(SM100, operator, original,
               "the graph rule's `max_kv > 512`: with work up to 2^20 and max_kv <= 512 the query-tile rule has "
               "returned before, so max_kv > 512 holds here; with more work both outcomes are the CuTe-first order")
      for operator, original in (("boolean", "output_work > 384 and max_kv > 512"), ("comparison", ">"),
                                 ("constant", "512"))),
    Survivor(SM107, "boolean", MTP_GATE,
             "one FP8 dtype test dropped: the model's request has one fp8 flag, so the query, KV and output dtypes "
             "are FP8 together and the other two tests decide"),
    Survivor(SM107, "boolean", MTP_BATCH,
             f"without `len(q_lens) != batch`: {FLAT}"),
    Survivor(SM107, "constant", "32", "a batch of 31 has at most 124 queries (2 or 4 a request): below both "
                                      "regimes' floors (128 eager, 256 under a graph)"),
    Survivor(SM107, "constant", "0", "q_lens[1] for q_lens[0]: the batch has 32 or more requests, all with the same "
                                     "query length by then (or the test that compares them returns either way)"),
    Survivor(SM107, "constant", "127", "the capacity rounding's 127 made 126: the capacity is a multiple of 64 (page "
                                       "64 or 128), so it rounds to the same multiple of 128"),
    *(Survivor(SM107, "constant", limit, SM107_EVEN) for limit in ("256", "128", "2048", "65536")),
)
METADATA_UNREACHED = (
    Unreached(f"{RESOLVER}._validate_dense", "elif table_width_alignment is not None:",
              "every caller in the resolver passes None (resolve_dense checks and pads the alignment itself)"),
)

CHECK_SHAPE_IS_SYMMETRIC = "check_shape's two tensors swapped: the same test of equal shapes"
TRITON_SYMMETRIC = (  # the Triton merges' equivalent mutants: a symmetric call's two arguments swapped
    *(Survivor(launcher, "arguments", pair, CHECK_SHAPE_IS_SYMMETRIC) for launcher, pair in (
        ("merge_state", "v_a, v_b"), ("merge_state", "s_a, s_b"), ("merge_state_in_place", "v, v_other"),
        ("merge_state_in_place", "s, s_other"))),
    Survivor("merge_state_in_place_kernel", "arguments", "s_val, s_other_val", "tl.maximum's two arguments swapped"),
    Survivor("state_merge", "arguments", "m, other_m", "tl.maximum's two arguments swapped"),
)
DECODE_SYMMETRIC = tuple(  # tl.maximum's and tl.minimum's two arguments swapped: the same value
    Survivor(kernel, "arguments", pair, "a symmetric tl.maximum / tl.minimum's arguments swapped")
    for kernel, first in (("_fwd_kernel_stage1", "tl.max(qk, 0)"), ("_fwd_grouped_kernel_stage1", "tl.max(qk, 1)"),
                          ("_fwd_kernel_stage2", "tlogic"))
    for pair in (f"{first}, e_max", "split_kv_start + kv_len_per_split, cur_batch_seq_len"))
HIP = "a ROCm (is_hip) branch: the interpreter and CUDA run the other"
FP8 = "an FP8 KV cache's dequantization: the model's paged cache holds floats"
ONE_KV_HEAD = ("MLA's latent cache has one KV head, so a buffer's head stride (-2) and its token stride (-3) are the "
               "same number")
BOTH_KERNELS = ("which kernel a launch takes (`kv_group_num` from the rows, or `== 0`): the ungrouped and the grouped "
                "kernel compute the same attention for any group size (the ungrouped one reads KV head "
                "`cur_head // kv_group_num`), in other tiles")
POWER_OF_TWO_LV = ("the value mask one lane wider (`offs_dv <= Lv`): Lv is a power of two (MLA's 512; 256, 128), so "
                   "BLOCK_DV is Lv and no lane is added (with another Lv the extra lane's store lands on the LSE slot "
                   "at offset Lv, written right after)")
EMPTY_SPLIT = ("a split with no key (start == end) run as well: its loop is empty, and the NaN and -inf it stores are "
               "never read, as _fwd_kernel_stage2 skips the splits with `split_kv_end > split_kv_start` false")
MASKED_BLOCK = ("the key loop's end one more: the extra block (only when the split's length is a multiple of BLOCK_N) "
                "has every lane past split_kv_end, so its logits are -inf, its weights 0 and the running max and sum "
                "unchanged")
MASKED_PAGE = "a masked-off lane's page number (other=0 -> 1): the KV loads at it are masked too"
KV_LANE = ("the {} load one lane wider: the lane at split_kv_end reads page 0's slot (its page number is the masked "
           "load's `other`), and its logit is -inf (`tl.where(offs_n < split_kv_end, ...)`), so its weight is 0")
LAUNCH_HINT = "num_warps / num_stages, launch hints of the compiled kernel: they change its speed, not its values"
V_IS_K = ("the K and V buffers swapped in the launch: MLA's V is the first Lv columns of the latent cache (a view), so "
          "both are the same address, and the strides are passed apart")
HEAD_STRIDE = ("a KV head stride (-2) read from another dimension: MLA's one KV head is head 0, so "
               "`cur_kv_head * stride_buf_kh` is 0 whatever the stride")
UNGROUPED_GROUP = ("the ungrouped launcher's group (another dimension of q, or a ceiling): it runs with one query head "
                   "over MLA's one KV head, where the KV head `cur_head // kv_group_num` is 0 whatever the group (and "
                   "the group's num_warps a launch hint); `k_buffer.shape[-1]` or `[-3]` makes the group 1 // Lk or "
                   "1 // page = 0, and the interpreter's 0 // 0 is 0 (on a GPU that division is undefined)")
ONE_QUERY_HEAD = ("q's or att_out's strides in the ungrouped launch: it runs with one query head (q [rows, 1, Lk]), "
                  "so a row stride and a head stride are the same number, and a head offset `cur_head * stride` is 0")
SAME_TILES = ("the MLA tiles for Lk 576 (288) taken by the general branch instead: next_power_of_2(Lv) and of the "
              "rope width are the same 512 and 64 (256 and 32)")
PAGE_LANE = ("the page-number load one lane wider: the lane at split_kv_end reads one more table entry, and every "
             "load and logit of that lane is masked by `offs_n < split_kv_end`")
# (definition, operator, original, replacement, line, why) of equivalent mutants narrowed to one replacement and line
NARROWED = (
    ("_decode_grouped_att_m_fwd", "constant", "0", "1", "BLOCK_DPE = triton.next_power_of_2(Lk - Lv) if Lk > Lv else 0",
     "the rope tile of an MLA cache without a rope part (Lk == Lv, the `else 0`): MLA's latent cache always carries "
     "the rope key, so Lk > Lv"),
    ("_decode_grouped_att_m_fwd", "constant", "0", "1", "BLOCK_DPE = 0",
     "the non-MLA launch's rope tile made 1: its one lane is at BLOCK_DMODEL = next_power_of_2(Lk) >= Lk, masked by "
     "`offs_dpe < Lk`, so it adds 0 (a GPU would not compile a tl.dot of width 1)"),
    ("_fwd_grouped_kernel_stage1", "comparison", ">", ">=",
     "VALID_BLOCK_H: tl.constexpr = BLOCK_H if kv_group_num > BLOCK_H else kv_group_num",
     "VALID_BLOCK_H at kv_group_num == BLOCK_H: both arms are 16"),
    ("_fwd_grouped_kernel_stage1", "constant", "1", "2", "mask_h = cur_head < (cur_head_id + 1) * VALID_BLOCK_H",
     "the head block's mask made two blocks wide: with MLA's one KV head the group is every head, so the heads past "
     "the block are past the head count too, and `cur_head < q_head_num` masks them"),
)
DECODE_EQUIVALENT = (  # the survivors of all the mutants (2026-12-05), each equivalent for the reason given
    Survivor("_fwd_kernel_stage1", "division", "cur_head // kv_group_num",
             "the ungrouped kernel's KV head rounded up: it runs only where kv_group_num is 1 (decode_attention_fwd "
             "sends grouped heads to the grouped kernel), and cur_head / 1 has no fraction to round"),
    *(Survivor(kernel, "comparison", "<", POWER_OF_TWO_LV, replacement="<=", line="mask_dv = offs_dv < Lv")
      for kernel in ("_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1")),
    *(Survivor(kernel, "comparison", ">", EMPTY_SPLIT, replacement=">=", line="if split_kv_end > split_kv_start:")
      for kernel in ("_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1")),
    *(Survivor(definition, operator, original, why, replacement=replacement, line=line)
      for definition, operator, original, replacement, line, why in NARROWED),
    Survivor("_fwd_kernel_stage2", "comparison", "<",
             "stage 2's value mask one lane wider (`offs_d <= Lv`): Lv is a power of two (MLA's 512; 256, 128), so "
             "BLOCK_DV is Lv and no lane is added", replacement="<=", line="mask_d = offs_d < Lv"),
    Survivor("_decode_grouped_att_m_fwd", "comparison", ">",
             "the rope tile at Lk == Lv (`Lk >= Lv`): triton.next_power_of_2(0) is 0, the tile the `else` gives",
             replacement=">=", line="BLOCK_DPE = triton.next_power_of_2(Lk - Lv) if Lk > Lv else 0"),
    *(Survivor(kernel, "bound", "split_kv_end", MASKED_BLOCK, replacement="(split_kv_end) + 1",
               line=f"for start_n in {loop}(split_kv_start, split_kv_end, BLOCK_N):")
      for kernel, loop in (("_fwd_kernel_stage1", "range"), ("_fwd_grouped_kernel_stage1", "tl.range"))),
    *(Survivor(kernel, "comparison", "<", PAGE_LANE, replacement="<=", line="mask=offs_n < split_kv_end,")
      for kernel in ("_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1")),
    *(Survivor("_fwd_grouped_kernel_stage1", "comparison", "<", KV_LANE.format(what), replacement="<=",
               line=f"mask=(offs_n[None, :] < split_kv_end) & ({mask}[:, None]),")
      for what, mask in (("K", "mask_d"), ("rope K", "mask_dpe"))),
    Survivor("_fwd_kernel_stage1", "constant", "0", MASKED_PAGE, replacement="1", line="kv_page_number = tl.load("),
    Survivor("_fwd_kernel_stage1", "comparison", "<", KV_LANE.format("K"), replacement="<=",
             line="mask=(offs_n[:, None] < split_kv_end) & (mask_d[None, :]),"),
    *(Survivor(kernel, "comparison", "<", KV_LANE.format("V"), replacement="<=",
               line="mask=(offs_n[:, None] < split_kv_end) & (mask_dv[None, :]),")
      for kernel in ("_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1")),
    Survivor("_decode_att_m_fwd", "constant", "8", HIP, line="BLOCK = 64 if not is_hip_ else 8"),
    *(Survivor("_decode_att_m_fwd", operator, original, UNGROUPED_GROUP,
               line="kv_group_num = q.shape[1] // k_buffer.shape[-2]")
      for operator, original in (("division", "q.shape[1] // k_buffer.shape[-2]"), ("constant", "1"),
                                 ("constant", "2"))),
    *(Survivor(launcher, "constant", value, LAUNCH_HINT, line=line) for launcher, value, line in (
        ("_decode_att_m_fwd", "4", "num_warps = 4"), ("_decode_att_m_fwd", "2", "num_stages=2"),
        ("_decode_grouped_att_m_fwd", "2", "num_stages = 2"), ("_decode_grouped_att_m_fwd", "4", "num_warps=4"),
        ("_decode_softmax_reducev_fwd", "4", "num_warps=4"), ("_decode_softmax_reducev_fwd", "2", "num_stages=2"))),
    *(Survivor(launcher, "arguments", "k_buffer,\n        v_buffer", V_IS_K)
      for launcher in ("_decode_att_m_fwd", "_decode_grouped_att_m_fwd")),
    Survivor("_decode_grouped_att_m_fwd", "constant", "1",
             "kv_group_num from q.shape[2] (the head dim, 144 or more) for the head count: with MLA's one KV head "
             "both pick KV head 0, and a head block of min(16, group) heads masked against the head count gives the "
             "same heads", replacement="2", line="kv_group_num = q.shape[1] // k_buffer.shape[-2]"),
    *(Survivor(launcher, "arguments",
               f"{buffer}.stride(-3),  # Assume (..., PAGE_SIZE, NUM_HEADS, HEAD_DIM)\n        {buffer}.stride(-2)",
               ONE_KV_HEAD) for launcher in ("_decode_att_m_fwd", "_decode_grouped_att_m_fwd")
      for buffer in ("k_buffer", "v_buffer")),
    *(Survivor(launcher, "constant", old, why, replacement=new, line=f"{buffer}.stride(-{old}),")
      for launcher in ("_decode_att_m_fwd", "_decode_grouped_att_m_fwd") for buffer in ("k_buffer", "v_buffer")
      for old, new, why in (("3", "2", ONE_KV_HEAD), ("2", "3", HEAD_STRIDE), ("2", "1", HEAD_STRIDE))),
    Survivor("_fwd_grouped_kernel_stage1", "comparison", "<",
             "the head mask one head wider: the extra head is the next head block's first, computed here against the "
             "same (the one latent) KV head, so the same value is written twice", replacement="<=",
             line="mask_h = cur_head < (cur_head_id + 1) * VALID_BLOCK_H"),
    # its sibling on the next line, `cur_head < q_head_num` made `<=`, is killed by the pinned 20-head case
    Survivor("_fwd_grouped_kernel_stage1", "constant", "0", MASKED_PAGE, replacement="1",
             line="kv_page_number = tl.load("),
    Survivor("_decode_grouped_att_m_fwd", "division", "q.shape[1] // k_buffer.shape[-2]",
             "the grouped launcher's group as a ceiling: over MLA's one KV head it is the query head count, a whole "
             "number either way"),
    *(Survivor("_decode_grouped_att_m_fwd", "boolean", f"not is_hip_ and Lk == {lk}", HIP,
               replacement=f"((Lk == {lk}))") for lk in (576, 288)),
    *(Survivor("_decode_grouped_att_m_fwd", "constant", lk, SAME_TILES, line=f"if not is_hip_ and Lk == {lk}:")
      for lk in ("576", "288")),
    Survivor("_decode_grouped_att_m_fwd", "arguments", "BLOCK_H, kv_group_num", "min() is symmetric"),
    Survivor("_fwd_kernel_stage2", "bound", "NUM_KV_SPLITS",
             "one split more: its range starts at or past the sequence's end, so `split_kv_end > split_kv_start` "
             "skips it", replacement="(NUM_KV_SPLITS) + 1", line="for split_kv_id in range(0, NUM_KV_SPLITS):"),
    *(Survivor(caller, "arguments", "k_scale,\n        v_scale",
               "the scales swapped: only the FP8 dequantization reads them (declared unreached: " + FP8 + ")")
      for caller in ("decode_attention_fwd_normal", "decode_attention_fwd_grouped", "_decode_att_m_fwd",
                     "_decode_grouped_att_m_fwd")),
    Survivor("decode_attention_fwd", "arguments", "k_scale,\n            v_scale",
             "the scales swapped: only the FP8 dequantization reads them (declared unreached: " + FP8 + ")"),
    Survivor("_fwd_grouped_kernel_stage1", "constant", "0",
             "`BLOCK_DPE > 1` for `> 0`: BLOCK_DPE is 0 or the rope width's next power of two, 1 only for a rope width "
             "of 1, which no GPU compiles (tl.dot needs a dimension of 16 or more)", replacement="1",
             line="if BLOCK_DPE > 0:"),
    Survivor("decode_attention_fwd", "constant", "1", BOTH_KERNELS, replacement="0", line="if kv_group_num == 1:"),
    *(Survivor("decode_attention_fwd", operator, original, BOTH_KERNELS,
               line="kv_group_num = q.shape[1] // v_buffer.shape[-2]")
      for operator, original in (("division", "q.shape[1] // v_buffer.shape[-2]"), ("constant", "1"),
                                 ("constant", "2"))),
    *(Survivor("_decode_att_m_fwd", "arguments", f"{tensor}.stride(0),\n        {tensor}.stride(1)", ONE_QUERY_HEAD)
      for tensor in ("q", "att_out")),
    *(Survivor("_decode_att_m_fwd", "constant", original, ONE_QUERY_HEAD, line=f"{tensor}.stride({original}),")
      for tensor in ("q", "att_out") for original in ("0", "1")),
)
DECODE_UNREACHED = (
    Unreached("_fwd_kernel_stage1", "if k.dtype.is_fp8():", FP8),
    Unreached("_fwd_kernel_stage1", "if v.dtype.is_fp8():", FP8),
    Unreached("_fwd_grouped_kernel_stage1", "if k.dtype.is_fp8():", FP8),
    Unreached("_fwd_grouped_kernel_stage1", "if kpe.dtype.is_fp8():", FP8),
    Unreached("_fwd_grouped_kernel_stage1", "if v.dtype.is_fp8():", FP8),
    Unreached("_decode_att_m_fwd", "if kv_group_num != 1:",
              "the ungrouped kernel with grouped heads: decode_attention_fwd sends grouped heads to the grouped one"),
    Unreached("_decode_grouped_att_m_fwd", "if is_hip_:", HIP),
    Unreached("_decode_grouped_att_m_fwd", "elif not is_hip_ and BLOCK_DMODEL >= 1024:",
              "a head dim of 1024 or more (MLA's is 576: BLOCK_DMODEL 512)"),
    Unreached("_decode_softmax_reducev_fwd", "if is_hip_:", HIP),
    Unreached("_fwd_kernel_stage2", "if OUTPUT_FP16:", "an fp16 output: the adapter's outputs are float32"),
)

CONFORM = (
    ConformTarget(
        "flashinfer", "merge-references",
        upstream=(Upstream(CASCADE_TEMPLATES, MERGE_REFERENCES),),
        adapter="kvsim.conform.flashinfer.merge:REFERENCES", releases=NO_GUARD,
        doc="the trace templates' Python merge references (every parameter: mask, state count, dtypes) vs the "
            "model's base-2 merge; the merge properties on their answers",
        survivors=tuple(Survivor(name, "arguments", "s_a, s_b", MAXIMUM_IS_SYMMETRIC) for name in MERGE_REFERENCES[:2])),
    ConformTarget(
        "flashinfer", "run-contract",
        upstream=(Upstream(CONTRACTS, ("MLAInputContract",), checked=("MLAInputContract.validate_run_options",)),),
        adapter="kvsim.conform.flashinfer.contract:RUN_CONTRACT",
        survivors=(Survivor("MLAInputContract.validate_run_options", "boolean",
                            "bmm1_scale is not None and bmm2_scale is not None",
                            "equivalent with either clause alone: the check before it raises unless both scales or "
                            "neither are given"),),
        doc="run() arguments (every one) against the planned input contract: accepted, or refused naming the rule "
            "and the planned and given values"),
    ConformTarget(
        "flashinfer", "run-inputs",
        upstream=(Upstream(CONTRACTS, ("_resolve_structural_mla_input", "_structural_mla_input_facts")),),
        adapter="kvsim.conform.flashinfer.inputs:RUN_INPUTS",
        doc="structural run inputs: classification and pass-through / zero-copy / refused resolution over every "
            "parameter (planned widths, desired and accepted layouts, expected dtype), exhaustive"),
    ConformTarget(
        "flashinfer", "capabilities",
        upstream=(Upstream(CAPS, ("MLAPlanCapabilities",) + REJECTION, checked=REJECTION),
                  *(Upstream(f, (), checked=()) for f in BACKEND_FILES)),
        adapter="kvsim.conform.flashinfer.selection:CAPABILITIES",
        doc="every backend's capability matrix, and the rejection rule on random contracts for the release's and "
            "random capability records"),
    ConformTarget(
        "flashinfer", "auto-order",
        upstream=(Upstream(POLICY, ORDERS + ("_AUTO_BACKEND_CANDIDATES",), checked=ORDERS),),
        adapter="kvsim.conform.flashinfer.selection:AUTO_ORDER", survivors=AUTO_ORDER_SURVIVORS,
        doc="the auto candidate order per compute capability on random and regime-boundary workloads (Rubin MTP's "
            "included)"),
    ConformTarget(
        "flashinfer", "metadata",
        upstream=(Upstream(CONTRACTS, ("MLAPlanMetadata",), checked=()),
                  Upstream(CAPS, ("_BackendPlanUnsupportedError",), checked=()),
                  Upstream(PLANNING, METADATA + ("_CSRPlanMetadata", "_DensePlanMetadata"),
                           checked=METADATA + ("_indptr_values", "_max_q_len", "_check_table_width_alignment"))),
        adapter="kvsim.conform.flashinfer.metadata:METADATA", survivors=METADATA_SURVIVORS,
        unreached=METADATA_UNREACHED,
        doc="validation (strict or not), CSR <-> dense conversions at any alignment, and the resolver's methods on "
            "every form (partial ones and dual ones that differ), the rule a refusal names"),
    ConformTarget(
        "flashinfer", "selection-loops",
        upstream=(Upstream(CAPS, ("MLAPlanCapabilities", "_BackendPlanUnsupportedError") + REJECTION, checked=()),
                  Upstream(POLICY, (AUTO,), checked=(f"{AUTO}.plan_from_wrapper",)),
                  Upstream(WRAPPER, (FAMILY,), checked=(f"{FAMILY}.plan_from_wrapper",)),
                  *(Upstream(f, (), checked=()) for f in BACKEND_FILES)),
        adapter="kvsim.conform.flashinfer.fallback:SELECTION_LOOPS",
        survivors=tuple(Survivor(f"{AUTO}.plan_from_wrapper", "constant", digit,
                                 "the SM80 test `== (8, 0)` changed: ordered_sm80_backends is _prefer('fa2'), the "
                                 "default candidate order itself (it begins with fa2), so SM80 taking the default "
                                 "branch gets the same candidates") for digit in ("8", "0")),
        doc="auto and cute-dsl selection loops over stand-in backends: typed fallback only, single-candidate "
            "re-raise, all-rejected error, the probes in order"),
    ConformTarget(
        "flashinfer", "triton-merges",
        upstream=(Upstream(TRITON_KERNELS, tuple(f"{n}_kernel" for n in TRITON_MERGES),
                           checked=tuple(f"{n}_kernel" for n in TRITON_MERGES[:3]) + TRITON_STATE),
                  Upstream("flashinfer/triton/utils.py", ("check_dim", "check_shape"), checked=()),
                  Upstream(TRITON_LAUNCHERS, TRITON_MERGES, checked=TRITON_MERGES[:3])),
        adapter="kvsim.conform.flashinfer.triton_merge:TRITON_MERGES", releases=NO_GUARD,
        survivors=TRITON_SYMMETRIC,
        doc="the Triton merge_state / merge_state_in_place / merge_states / variable_length_merge_states launchers "
            "and kernels (interpreted, in a kernel child) vs the model's merge; the merge properties on them"),
    ConformTarget(
        "vllm", "mla-paged-decode",
        upstream=(Upstream(VLLM_DECODE, ("decode_attention_fwd",), checked=DECODE_CHECKED),),
        adapter="kvsim.conform.vllm.mla_decode:MLA_PAGED_DECODE", unreached=DECODE_UNREACHED,
        survivors=DECODE_SYMMETRIC + DECODE_EQUIVALENT,
        doc="vLLM's Triton MLA decode (decode_attention_fwd: every parameter) over a paged cache through both "
            "metadata forms vs the model's paged absorbed MLA; empty rows probed"),
)
