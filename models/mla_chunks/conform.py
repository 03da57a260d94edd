"""The engines' code `mla-chunks` is checked against (`kvsim conform vllm`): declarations only.

Each target names the upstream file and definitions it loads and the adapter that drives them (in
`kvsim.conform.vllm`, imported only when the target runs).
"""

from kvsim.engine.conformance.declare import ConformTarget, Upstream

MLA_ATTENTION = "vllm/model_executor/layers/attention/mla_attention.py"

CONFORM = (
    ConformTarget(
        "vllm", "plan_mla_context_chunks",
        upstream=(Upstream(MLA_ATTENTION, ("plan_mla_context_chunks", "align_mla_chunked_context_workspace_size"),
                           checked=("plan_mla_context_chunks",)),),
        adapter="kvsim.conform.vllm.planner:PLANNER",
        doc="planner differential on the model's PLAN_CASES and DCP_CASES (the builder's arguments on upstream's "
            "aligned workspace, both sides) + the model's plan checks on upstream's plans"),
    ConformTarget(
        "vllm", "mla_chunk_arguments",
        upstream=(Upstream(MLA_ATTENTION, ("build_mla_chunked_context_metadata", "plan_mla_context_chunks"),
                           checked=("build_mla_chunked_context_metadata",)),),
        adapter="kvsim.conform.vllm.planner:ARGUMENTS",
        doc="alignment, row budget, max_context_chunk and padded_rows the builder passes the planner"),
    ConformTarget(
        "vllm", "align_mla_chunked_context_workspace_size",
        upstream=(Upstream(MLA_ATTENTION, ("align_mla_chunked_context_workspace_size",)),),
        adapter="kvsim.conform.vllm.planner:WORKSPACE",
        doc="workspace lower bound (model variant fixed) vs upstream"),
)
