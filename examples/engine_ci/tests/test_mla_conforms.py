"""kvsim's MLA model against toyengine's planner: the differential and the model's plan properties."""

import toyengine.mla


def test_planner_conforms_to_kvsim(kvsim_conform):
    # the module gives both names the target loads: the planner and the workspace bound it plans in
    result = kvsim_conform("vllm:plan_mla_context_chunks", toyengine.mla)
    assert result.compared > 0


def test_workspace_bound_conforms_to_kvsim(kvsim_conform):
    kvsim_conform("vllm:align_mla_chunked_context_workspace_size",
                  toyengine.mla.align_mla_chunked_context_workspace_size)
