"""vLLM's uniform MLA context-chunk plan (before b38e111d) against the `mla-chunks` model's `pre_b38e111d`.

Before b38e111d (vLLM 0.26.0 and 0.27.1; 0.25.1 has it inline in the builder's `build`) there is no
`plan_mla_context_chunks`: the uniform "batch-column" plan is the top-level
`build_mla_chunked_context_metadata` (vllm/model_executor/layers/attention/mla_attention.py), which
`MLACommonMetadataBuilder.build` calls. The adapter loads that function alone and calls it on CPU tensors;
every line of the plan is upstream's code, and its whole `ChunkedContextMetadata` is compared, field by field
(the chunk starts, seq lens, cu seq lens and token-to-seq tensors, `seq_tot`, `max_seq_lens`,
`chunk_total_token`, `has_empty_context`, `prefill_tokens_with_context`, and under DCP the local starts,
padded local lengths, their cu seq lens and token-to-seq, every rank's local context lengths and the local
chunk size), with the model's `build_uniform_chunked_context_metadata`. A release whose file plans per
request (0.28.0 on) is "not present".

Two targets: `UNIFORM` (`mla_uniform_plan`) is the differential alone; `PROPERTIES`
(`mla_uniform_plan_properties`) the same differential with the model's plan properties run on upstream's
plan: six of them fail there (as on the model's `pre_b38e111d`), among them the b38e111d seed bug's
`chunk_count_within_alignment_slack` (the release table's seed-bug row). Apart, the differential conforms on
the releases that have the uniform plan, so `kvsim conform --mutants` can measure it.

Inputs: the model's `PLAN_CASES` (and the pinned upstream batches first) on the pre-b38e111d workspace
`max(W, max_num_seqs * block)` or on a smaller one (too small for one block per context-ful prefill: upstream's
`max_context_chunk > 0` assertion, and under DCP its `% world` one), block alignment on or off.
Adapter conventions (one line each):
- `pin_memory=True` is dropped (the function's `torch` is the real one but for `empty`/`zeros` without pinning:
  a CPU-only host has no pinned allocator); the workspace tensor is a stand-in (only stored: compared by
  identity).
- `num_prefills` is the number of prefills (`len(context_lens)`), as the builder passes it.
- Under DCP upstream's `starts` are the local starts (the model's `local_starts`) and `seq_tot` the local rows;
  the plan properties read the global starts off upstream's own call on the same batch without DCP.
- `token_to_seq` (and under DCP `padded_local_token_to_seq`) is upstream's 2-D tensor, its rows padded with
  zeros to the longest chunk; the model's rows are padded alike.
Survivors: the arguments of the final `min` (`torch.min`, of the context lengths and the chunk ends) swapped
(symmetric).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, replace
from typing import Any, Callable

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.errors import PropertyViolation
from kvsim.models.mla_chunks.metadata import UniformContextChunk, build_uniform_chunked_context_metadata
from kvsim.models.mla_chunks.planner import chunked_context_workspace_size, mla_chunk_alignment
from kvsim.properties.mla_chunks import plan as props
from kvsim.properties.mla_chunks.cases import PLAN_EXAMPLES, MlaChunkCase
from kvsim.properties.mla_chunks.strategies import PLAN_CASES

from ..loader import check_signature, names_in
from .planner import check_chunk_count

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
SYMBOL = "build_mla_chunked_context_metadata"
BUILDER_PARAMS = ("context_lens_cpu", "prefill_query_start_loc_cpu", "num_prefills", "chunked_prefill_workspace",
                  "chunked_prefill_workspace_size", "block_size", "align_chunk_to_block", "device", "dcp_world_size",
                  "dcp_local_block_size", "dcp_virtual_block_size")


@dataclass(frozen=True)
class UniformCase:
    """A batch and the workspace rows (and block alignment) the builder is called with."""

    batch: MlaChunkCase
    workspace: int
    align_chunk_to_block: bool = True

    @property
    def dcp(self) -> Any:
        return self.batch.dcp


def pre_workspace(batch: MlaChunkCase, variant: Any) -> int:
    """The rows the pre-b38e111d builder runs with: `max(W, max_num_seqs * block)`."""
    return chunked_context_workspace_size(batch.workspace_size, batch.max_num_seqs, batch.block_size, batch.dcp,
                                          variant)


@st.composite
def uniform_cases(draw: st.DrawFn, variant: Any) -> UniformCase:
    """A `PLAN_CASES` batch on its pre-b38e111d workspace, or (one in four) on any smaller one; alignment on or off
    (one in four off)."""
    batch = draw(PLAN_CASES)
    rows = pre_workspace(batch, variant)
    if draw(st.integers(0, 3)) == 0:
        rows = draw(st.integers(1, rows))
    return UniformCase(batch, rows, draw(st.integers(0, 3)) > 0)


def host_torch() -> types.ModuleType:
    """The real torch, with `empty`/`zeros` ignoring `pin_memory` (no pinned allocator without an accelerator)."""
    import torch

    host = types.ModuleType("torch")
    host.__dict__.update({k: v for k, v in vars(torch).items() if not k.startswith("__")})

    def unpinned(fn: Callable) -> Callable:
        def call(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)
        return call

    host.empty, host.zeros = unpinned(torch.empty), unpinned(torch.zeros)
    return host


def call_upstream(fn: Callable, case: UniformCase, dcp: bool, workspace: Any = None) -> Any:
    """Upstream's chunked-context metadata for the case (its DCP layout, or none)."""
    import torch

    batch = case.batch
    world, interleave = (batch.dcp_world_size, batch.dcp_interleave) if dcp else (1, 1)
    return fn(context_lens_cpu=torch.tensor(batch.context_lens), prefill_query_start_loc_cpu=torch.tensor(
        batch.query_start_loc), num_prefills=len(batch.context_lens), chunked_prefill_workspace=workspace,
        chunked_prefill_workspace_size=case.workspace, block_size=batch.block_size,
        align_chunk_to_block=case.align_chunk_to_block, device=torch.device("cpu"), dcp_world_size=world,
        dcp_local_block_size=interleave, dcp_virtual_block_size=world * interleave)


def _array(rows: Any) -> Any:
    """A 2-D int32 array of the given rows, each padded with zeros to the longest (upstream's tensor layout)."""
    import numpy as np

    rows = [list(r) for r in rows]
    width = max((len(r) for r in rows), default=0)
    out = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def _ints(values: Any) -> list[int]:
    return [int(x) for x in (values.tolist() if hasattr(values, "tolist") else values)]


def _tensor(values: Any) -> Any:
    import numpy as np

    return values.numpy().astype(np.int32) if hasattr(values, "numpy") else np.asarray(values, dtype=np.int32)


def uniform_model(ctx: Context, case: UniformCase) -> Any:
    batch = case.batch
    md = build_uniform_chunked_context_metadata(batch.context_lens, batch.query_start_loc, case.workspace,
                                                batch.block_size, dcp=batch.dcp,
                                                align_chunk_to_block=case.align_chunk_to_block)
    if md is None:
        return None
    chunks, dcp = md.chunks, batch.dcp is not None
    answer = {"cu_seq_lens": _array(c.cu_seq_lens for c in chunks),
              "starts": _array((c.local_starts if dcp else c.starts) for c in chunks),
              "seq_tot": [c.num_local_context_tokens if dcp else c.num_context_tokens for c in chunks],
              "max_seq_lens": [c.max_seq_len for c in chunks], "seq_lens": _array(c.seq_lens for c in chunks),
              "context_lens": _tensor(md.context_lens), "token_to_seq": _array(c.token_to_seq for c in chunks),
              "chunk_total_token": [c.num_context_tokens for c in chunks], "workspace_is_the_given_one": True,
              "has_empty_context": [c.has_empty_context for c in chunks],
              "prefill_tokens_with_context": md.prefill_tokens_with_context}
    if dcp:
        answer.update({"padded_local_chunk_seq_lens": [list(c.padded_local_seq_lens) for c in chunks],
                       "local_context_lens_allranks": [list(r) for r in chunks[0].local_context_lens_allranks],
                       "padded_local_cu_seq_lens": _array(c.padded_local_cu_seq_lens for c in chunks),
                       "padded_local_token_to_seq": _array(c.padded_local_token_to_seq for c in chunks),
                       "cu_seq_lens_lst": [list(c.cu_seq_lens) for c in chunks], "chunk_size": md.local_chunk_size})
    return answer


def uniform_upstream(ctx: Context, case: UniformCase) -> Any:
    fn = ctx.up.build_mla_chunked_context_metadata
    dcp = case.dcp is not None
    md = call_upstream(fn, case, dcp, ctx.state["workspace"])
    ctx.state["global_starts"] = None
    if md is None:
        return None
    answer = {"cu_seq_lens": _tensor(md.cu_seq_lens), "starts": _tensor(md.starts), "seq_tot": _ints(md.seq_tot),
              "max_seq_lens": _ints(md.max_seq_lens), "seq_lens": _tensor(md.seq_lens),
              "context_lens": _tensor(md.context_lens), "token_to_seq": _tensor(md.token_to_seq),
              "chunk_total_token": _ints(md.chunk_total_token),
              "workspace_is_the_given_one": md.workspace is ctx.state["workspace"],
              "has_empty_context": [bool(x) for x in md.has_empty_context],
              "prefill_tokens_with_context": int(md.prefill_tokens_with_context)}
    if dcp:
        answer.update({"padded_local_chunk_seq_lens": [_ints(r) for r in md.padded_local_chunk_seq_lens],
                       "local_context_lens_allranks": [_ints(r) for r in md.local_context_lens_allranks],
                       "padded_local_cu_seq_lens": _tensor(md.padded_local_cu_seq_lens),
                       "padded_local_token_to_seq": _tensor(md.padded_local_token_to_seq),
                       "cu_seq_lens_lst": [_ints(r) for r in md.cu_seq_lens_lst], "chunk_size": int(md.chunk_size)})
        ctx.state["global_starts"] = _tensor(call_upstream(fn, case, False).starts)  # for the plan properties
    return answer


def describe_uniform(ctx: Context, case: UniformCase) -> dict[str, Any]:
    b = case.batch
    return {"context_lens": list(b.context_lens), "query_lens": list(b.query_lens), "workspace": case.workspace,
            "block": b.block_size, "align_chunk_to_block": case.align_chunk_to_block,
            "dcp": [b.dcp_world_size, b.dcp_interleave]}


def upstream_chunks(ctx: Context, case: UniformCase, answer: dict[str, Any]) -> tuple[UniformContextChunk, ...]:
    """Upstream's answer as the model's chunks, the form the plan properties read (global starts, rows cut at
    each chunk's total)."""
    batch = case.batch
    qsl, n = tuple(batch.query_start_loc), len(batch.context_lens)
    dcp = batch.dcp is not None
    starts = ctx.state["global_starts"] if dcp else answer["starts"]
    chunks = []
    for i, lens in enumerate(answer["seq_lens"]):
        total = answer["chunk_total_token"][i]
        extra = {}
        if dcp:
            local_total = answer["seq_tot"][i]
            extra = dict(local_starts=_ints(answer["starts"][i]),
                         padded_local_seq_lens=tuple(answer["padded_local_chunk_seq_lens"][i]),
                         padded_local_cu_seq_lens=tuple(_ints(answer["padded_local_cu_seq_lens"][i])),
                         padded_local_token_to_seq=tuple(_ints(answer["padded_local_token_to_seq"][i][:local_total])),
                         num_local_context_tokens=local_total,
                         local_context_lens_allranks=tuple(tuple(r) for r in answer["local_context_lens_allranks"]))
        chunks.append(UniformContextChunk(
            index=i, request_slice=slice(0, n), token_slice=slice(0, qsl[n]), query_start_loc=qsl,
            max_query_len=max(b - a for a, b in zip(qsl, qsl[1:])), starts=tuple(_ints(starts[i])),
            seq_lens=tuple(_ints(lens)), cu_seq_lens=tuple(_ints(answer["cu_seq_lens"][i])),
            token_to_seq=tuple(_ints(answer["token_to_seq"][i][:total])), num_context_tokens=total,
            max_seq_len=answer["max_seq_lens"][i], has_empty_context=answer["has_empty_context"][i], **extra))
    return tuple(chunks)


def _plan_check(name: str, fn: Callable[[MlaChunkCase, Any, int, int], None]) -> Check:
    """A model plan property on upstream's plan: fn(batch, chunks, workspace rows, split alignment)."""
    def check(ctx: Context, case: UniformCase, answer: Any) -> None:
        if answer is not None:
            b = case.batch
            alignment = mla_chunk_alignment(b.block_size if case.align_chunk_to_block else 1, b.dcp)
            fn(b, upstream_chunks(ctx, case, answer), case.workspace, alignment)
    return Check(name, check)


def lower_bound(batch: MlaChunkCase, chunks: Any, w: int, alignment: int) -> None:
    bound = props.chunk_count_lower_bound(batch.context_lens, w, per_run=False)  # uniform: global bound
    if len(chunks) < bound:
        raise PropertyViolation(f"chunks for {list(batch.context_lens)} with W {w}: expected >= {bound}, "
                                f"got {len(chunks)}")


PLAN_CHECKS = (  # the model's plan properties, as the planner target runs them on the per-request plan
    _plan_check("chunks_tile_every_context_row_once", lambda b, ch, w, a: props.check_exact_tiling(b.context_lens, ch)),
    _plan_check("chunks_have_no_empty_spans", lambda b, ch, w, a: props.check_no_empty_spans(ch)),
    _plan_check("chunks_fit_the_row_budget",
                lambda b, ch, w, a: props.check_row_budget(b.context_lens, ch, w, a, b.dcp)),
    _plan_check("chunks_follow_request_order", lambda b, ch, w, a: props.check_request_order(b.context_lens, ch)),
    _plan_check("continuation_only_at_first_request", lambda b, ch, w, a: props.check_continuation(ch)),
    _plan_check("chunk_starts_are_aligned", lambda b, ch, w, a: props.check_alignment(ch, a)),
    _plan_check("chunk_count_meets_lower_bound", lower_bound),
    # the b38e111d seed bug's property (the planner target's)
    _plan_check("chunk_count_within_alignment_slack", lambda b, ch, w, a: check_chunk_count(b, ch, a, 0, None, w)),
)


def prepare(ctx: Context) -> None:
    """The signature, the workspace stand-in, and one intra-op thread (the tensors are tiny: threads cost 100x on
    small `repeat_interleave`s)."""
    import torch

    check_signature(ctx.up.build_mla_chunked_context_metadata, BUILDER_PARAMS, f"{RELPATH}:{SYMBOL}")
    ctx.state["workspace"] = torch.empty(0)
    torch.set_num_threads(1)


def per_request(ctx: Context) -> tuple[str, str] | None:
    if "plan_mla_context_chunks" in names_in(ctx.source.file(RELPATH)):
        return ("not present", f"{RELPATH}: {ctx.source.label} plans per request (plan_mla_context_chunks, "
                               "b38e111d); the uniform plan is gone")
    return None


def _pinned(ctx: Context) -> list[UniformCase]:
    """The upstream batches first ([960] + [16] * 7: 8 chunks for 2), on the pre-b38e111d workspace."""
    return [UniformCase(b, pre_workspace(b, ctx.variant)) for b in PLAN_EXAMPLES]


def properties_note(ctx: Context) -> str:
    return "the model's pre_b38e111d fails the same properties on these batches (tests/models/mla_chunks/test_mla_chunks_properties.py)"


UNIFORM = Differential(
    loading=lambda upstream, up: {"extra_globals": {"torch": host_torch()}}, skip=per_request, prepare=prepare,
    inputs=lambda ctx: uniform_cases(ctx.variant), pinned=_pinned, model=uniform_model, upstream=uniform_upstream,
    compare=Exact(refusals=("AssertionError",)), describe=describe_uniform)

PROPERTIES = replace(UNIFORM, checks=PLAN_CHECKS, note=properties_note)
