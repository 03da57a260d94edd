"""The engines' code `mla-chunks` is checked against (`kvsim conform vllm`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.vllm`, imported only when the target runs); `survivors`: the mutants a target cannot kill, each
an equivalent mutant (the reasons are the adapters' module docstrings' too).
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Upstream

MLA_ATTENTION = "vllm/model_executor/layers/attention/mla_attention.py"
PLANNER = "plan_mla_context_chunks"
BUILDER = "build_mla_chunked_context_metadata"
ALIGN = "align_mla_chunked_context_workspace_size"

PLANNER_SURVIVORS = (
    Survivor(PLANNER, "arguments", "max_context_chunk,\n            round_down(remaining - 1, split_alignment)",
             "min() of the same two values"),
    Survivor(PLANNER, "constant", "1",
             "equivalent: `remaining - 1` -> `remaining - 0` (and the midpoint's `+ 1` -> `+ 2`): a split is only "
             "looked for when the whole remainder does not fit, so its full length never fits either; any midpoint "
             "in (low, high] finds the same largest fit"),
    Survivor(PLANNER, "division", "max_split // split_alignment",
             "equivalent in the builder's contract: max_context_chunk is a multiple of the alignment, so max_split is "
             "too (the free arguments keep to it: an engine's own planner may refuse a cap off the alignment)"),
    Survivor(PLANNER, "division", "(low + high + 1) // 2",
             "equivalent: the midpoint rounded up stays in (low, high]: the binary search finds the same fit"),
    Survivor(PLANNER, "assignment", "+=",
             "equivalent: `rows += ...` -> `rows = ...` right before the `break` (rows is not read again)"),
)
BUILDER_SURVIVORS = (
    Survivor(BUILDER, "constant", "0",
             "equivalent: the value of the indptr padding (`[0] * padding`, three lists) is never read"),
    Survivor(BUILDER, "boolean",
             "all(length > 0 for length in query_lens)\n            and all(length > 0 for length in plan.seq_lens)",
             "equivalent without its seq_lens clause: the planner makes no empty span"),
    Survivor(BUILDER, "comparison", ">",
             "equivalent: `length > 0` -> `>= 0` over the plan's seq_lens (never 0), and `assert max_context_chunk "
             "> 0` -> `>= 0` (the planner it calls next asserts `max_context_chunk > 0` itself)"),
    Survivor(BUILDER, "arguments", "chunk_alignment, dcp_virtual_block_size", "math.lcm() is symmetric"),
    Survivor(BUILDER, "division", "chunked_prefill_workspace_size // dcp_world_size",
             "equivalent in the builder's contract: the workspace is align_mla_chunked_context_workspace_size's, a "
             "multiple of lcm(block_size, dcp_world_size * interleave) and so of dcp_world_size: the DCP row budget "
             "divides exactly"),
    Survivor(BUILDER, "arguments", "plan.starts, plan.seq_lens",
             "equivalent: the local length `padded_rows(start + length) - local_start` reads start and length "
             "only through their sum"),
    Survivor(BUILDER, "bound", "len(starts_flat)",
             "equivalent: `starts` one element longer (the first context length): chunks read only "
             "`starts[request_slice]`, inside the first len(starts_flat)"),
)
ALIGN_SURVIVORS = (
    Survivor(ALIGN, "arguments", "alignment,\n            parallel_config.decode_context_parallel_size\n"
                                 "            * parallel_config.cp_kv_cache_interleave_size",
             "lcm() is symmetric"),
    Survivor(ALIGN, "arguments", "workspace_size, alignment", "max() is symmetric"),
)

WORKSPACE_SIZE = "MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size"
_CAP_COMMENT = "".join(f"            # {line}\n" for line in (
    "For long-context models try not to over-allocate limiting", "kv-cache space, limiting it to 64k tokens,",
    "which would result in the workspace being:", "  2*(576)*(64*1024) = 144mb",
    "(assuming 576 MLA head dim, and fp16)", "which would result in up-projected context being",
    "  2*(192*128)*(64*1024) = 3gb", "(assuming 192 QK head dim, 128 heads, and fp16)"))
_TERMS = "8 * model_config.max_model_len,\n                4 * scheduler_config.max_num_seqs * cache_config.block_size"
WORKSPACE_SURVIVORS = (  # the mutants match on the changed text, upstream's comment between min's arguments included
    Survivor(WORKSPACE_SIZE, "arguments", f"max(\n                {_TERMS},\n            ),\n{_CAP_COMMENT}"
                                          "            64 * 1024", "min() is symmetric"),
    Survivor(WORKSPACE_SIZE, "arguments", _TERMS, "max() is symmetric"),
    Survivor(WORKSPACE_SIZE, "arguments",
             "chunked_prefill_workspace_size,\n            scheduler_config.max_num_seqs * cache_config.block_size",
             "max() is symmetric (the pre-b38e111d lower bound)"),
)
PER_REQUEST = ((None, "pre_b38e111d"), ("0.28.0", "fixed"))  # b38e111d (with vllm#51733) shipped in 0.28.0

MERGE_KERNEL = "vllm/v1/attention/ops/triton_merge_attn_states.py"
MASKED = ((None, "uniform_unmasked"), ("0.26.0", "pre_b38e111d"))  # #49294's mask_empty_context shipped in 0.26.0
UNIFORM = ((None, "pre_b38e111d"),)  # the uniform plan is present only before b38e111d
UNIFORM_SURVIVORS = (
    Survivor(BUILDER, "arguments", "context_lens_cpu.unsqueeze(0), chunk_starts + max_context_chunk",
             "torch.min() of two tensors is symmetric"),
)

# The merge's mutants that compute the same on every input (all of its mutants run, `--mutants 0`), each with why.
UNUSED_STRIDE = ("output_lse's stride when output_lse is None (else 0 -> 1): the kernel reads it only under "
                 "OUTPUT_LSE, which is False then")
CLAMP = ("tl.clamp's value and lower bound swapped: clamp(x, lo, hi) is min(max(x, lo), hi) and max is symmetric, "
         "so clamp(lo, x, hi) saturates alike")
MERGE_EQUIVALENT = (
    *(Survivor("merge_attn_states", "constant", "0", UNUSED_STRIDE, replacement="1", line=f"output_lse_{axis}_stride")
      for axis in ("head", "token")),
    Survivor("merge_attn_states_kernel", "arguments", "p_lse, s_lse", "tl.maximum's two arguments swapped: it is "
             "symmetric (maxnum drops a NaN on either side)"),
    Survivor("merge_attn_states_kernel", "arguments", "s_out, FP8_MIN", CLAMP),
    Survivor("merge_attn_states_kernel", "arguments", "out, FP8_MIN", CLAMP),
)

CONFORM = (
    ConformTarget(
        "vllm", PLANNER,
        upstream=(Upstream(MLA_ATTENTION, (PLANNER, ALIGN), checked=(PLANNER,)),),
        adapter="kvsim.conform.vllm.planner:PLANNER", survivors=PLANNER_SURVIVORS,
        doc="planner differential on the builder's arguments for the model's PLAN_CASES (on upstream's aligned "
            "workspace) and on free arguments (invalid ones too) + the model's plan checks on upstream's plans"),
    ConformTarget(
        "vllm", "mla_chunk_arguments",
        upstream=(Upstream(MLA_ATTENTION, (BUILDER, PLANNER, "MLACommonPrefillMetadata"), checked=(BUILDER,)),),
        adapter="kvsim.conform.vllm.planner:BUILDER", survivors=BUILDER_SURVIVORS,
        doc="the whole chunked-context metadata build_mla_chunked_context_metadata returns (every ContextChunk "
            "field, DCP and align_indptr included) vs the model's builder"),
    ConformTarget(
        "vllm", ALIGN,
        upstream=(Upstream(MLA_ATTENTION, (ALIGN,)),),
        adapter="kvsim.conform.vllm.planner:WORKSPACE", survivors=ALIGN_SURVIVORS,
        doc="workspace lower bound (model variant fixed) vs upstream, DCP layouts in three inputs of four"),
    ConformTarget(
        "vllm", "mla_workspace_size",
        upstream=(Upstream(MLA_ATTENTION, ("MLACommonMetadataBuilder",), checked=(WORKSPACE_SIZE,)),),
        adapter="kvsim.conform.vllm.workspace:SIZE", releases=PER_REQUEST, survivors=WORKSPACE_SURVIVORS,
        doc="MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size (the released static method, stand-in "
            "VllmConfig) vs the model's core size + the variant's lower bound, exhaustive grid"),
    ConformTarget(
        "vllm", "mla_uniform_plan",
        upstream=(Upstream(MLA_ATTENTION, (BUILDER,)),), releases=UNIFORM, survivors=UNIFORM_SURVIVORS,
        adapter="kvsim.conform.vllm.uniform_plan:UNIFORM",
        doc="the uniform plan of build_mla_chunked_context_metadata (releases before b38e111d), its whole metadata "
            "field by field vs the model's pre_b38e111d; the adapter calls the released top-level function with CPU "
            "tensors (pin_memory dropped)"),
    ConformTarget(
        "vllm", "mla_uniform_plan_properties",
        upstream=(Upstream(MLA_ATTENTION, (BUILDER,)),), releases=UNIFORM, survivors=UNIFORM_SURVIVORS,
        adapter="kvsim.conform.vllm.uniform_plan:PROPERTIES",
        doc="the model's plan properties on the uniform plan of releases before b38e111d (the b38e111d seed bug's "
            "chunk_count_within_alignment_slack among them), with mla_uniform_plan's differential"),
    ConformTarget(
        "vllm", "merge-attn-states-triton",
        upstream=(Upstream(MERGE_KERNEL, ("merge_attn_states", "merge_attn_states_kernel")),),
        adapter="kvsim.conform.vllm.merge_states:MERGE_STATES", survivors=MERGE_EQUIVALENT,
        doc="merge_attn_states (the Triton launcher and kernel, interpreted on the CPU) on fp32 states vs the model's "
            "float64 merge within a tolerance: output_lse, prefill_tokens_with_context, the FP8 output_scale, padded "
            "head strides and strided LSEs; probe: a NaN LSE beside an empty side merges to (0, -inf)"),
    ConformTarget(
        "vllm", "mla-context-accumulation",
        upstream=(Upstream(MERGE_KERNEL, ("merge_attn_states", "merge_attn_states_kernel"),
                           checked=("mask_empty_context", "mask_empty_context_kernel")),),
        adapter="kvsim.conform.vllm.context_merge:ACCUMULATE", releases=MASKED,
        doc="the uniform loop's accumulation of the model backend's chunk partials on the release's own "
            "mask_empty_context and merge_attn_states (releases before b38e111d) vs the model's "
            "compute_prefill_context; probe: the #49294 property (the context partial is attention over the whole "
            "context)"),
)
