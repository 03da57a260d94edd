"""vLLM's uniform MLA context-chunk plan (before b38e111d) against the `mla-chunks` model's `pre_b38e111d`.

Target `mla_uniform_plan`: before b38e111d (vLLM 0.27.1 and earlier) there is no `plan_mla_context_chunks`;
the uniform "batch-column" plan is inline in the top-level `build_mla_chunked_context_metadata`
(vllm/model_executor/layers/attention/mla_attention.py), which `MLACommonMetadataBuilder.build` calls. The
adapter loads that function alone and calls it on CPU tensors built from the model's `PLAN_CASES`; every
line of the plan (the chunk size, `num_chunks`, the start/seq-len/cu-seq-len/token-to-seq tensors,
`seq_tot`, `max_seq_lens`, `has_empty_context`, `prefill_tokens_with_context`, and under DCP the local
starts, padded local lengths and chunk size) is upstream's code; only the metadata dataclass it fills is
read back. The result is compared, field by field, with the model's `build_uniform_chunked_context_metadata`
(variant `pre_b38e111d`), and the model's plan checks (the properties that are statements about a plan,
the b38e111d seed bug's `chunk_count_within_alignment_slack` among them) run on upstream's plan; each
verdict is also compared with the model's on the same input.

Adapter conventions (one line each):
- `pin_memory=True` is dropped (the function's `torch` is the real one but for `empty`/`zeros` without pinning:
  a CPU-only host has no pinned allocator); the workspace tensor is `None` (only stored, never read).
- The workspace rows are the model's pre-b38e111d `max(W, max_num_seqs * block)`, the lower bound of
  `MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size` (a method reading a `VllmConfig`).
- `align_chunk_to_block=True`, as `MLACommonMetadataBuilder.build` passes it (sparse MLA passes
  `is_cuda()`: the model's uniform variant has no unaligned path, so False is not compared).
- Upstream's chunks always span every prefill (the tensors' prefill dimension): `request_slice`,
  `token_slice`, `query_start_loc` and `max_query_len` of a chunk come from the inputs, not from upstream.
- Under DCP upstream's `starts` are the local starts (the model's `local_starts`) and `seq_tot` the local
  rows; the global starts are those of upstream's own call on the same batch without DCP (the chunk size
  `round_down(W // n_ctx, block)` does not depend on DCP).
- `token_to_seq` rows are cut at the chunk's total (upstream pads the 2-D tensor with zeros).
"""

from __future__ import annotations

import time
import types
from typing import Any, Callable

from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_chunks.metadata import (UniformChunkedContextMetadata, UniformContextChunk,
                                             build_uniform_chunked_context_metadata)
from kvsim.models.mla_chunks.planner import VARIANTS, chunked_context_workspace_size

from ..loader import check_signature, load_definitions, names_in
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .planner import check_chunk_count

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
NAME = "mla_uniform_plan"
SYMBOL = "build_mla_chunked_context_metadata"
BUILDER_PARAMS = ("context_lens_cpu", "prefill_query_start_loc_cpu", "num_prefills", "chunked_prefill_workspace",
                  "chunked_prefill_workspace_size", "block_size", "align_chunk_to_block", "device", "dcp_world_size",
                  "dcp_local_block_size", "dcp_virtual_block_size")
PRE = VARIANTS["pre_b38e111d"]


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


def load(source: EngineSource) -> Callable:
    path = source.file(RELPATH)
    if "plan_mla_context_chunks" in names_in(path):
        raise LookupError("per-request")
    fn = getattr(load_definitions(path, [SYMBOL], extra_globals={"torch": host_torch()}, where=RELPATH,
                                  version=source.label), SYMBOL)
    check_signature(fn, BUILDER_PARAMS, f"{RELPATH}:{SYMBOL}")
    return fn


def call_upstream(fn: Callable, case: Any, workspace: int, dcp: bool) -> Any:
    """Upstream's chunked-context metadata, None, or the AssertionError upstream raises."""
    import torch

    world, interleave = (case.dcp_world_size, case.dcp_interleave) if dcp else (1, 1)
    try:
        return fn(context_lens_cpu=torch.tensor(case.context_lens), prefill_query_start_loc_cpu=torch.tensor(
            case.query_start_loc), num_prefills=len(case.context_lens), chunked_prefill_workspace=None,
            chunked_prefill_workspace_size=workspace, block_size=case.block_size, align_chunk_to_block=True,
            device=torch.device("cpu"), dcp_world_size=world, dcp_local_block_size=interleave,
            dcp_virtual_block_size=world * interleave)
    except AssertionError as exc:
        return exc


def _ints(row: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in (row.tolist() if hasattr(row, "tolist") else row))


def upstream_chunks(md: Any, plain: Any, case: Any) -> tuple[UniformContextChunk, ...]:
    """Upstream's metadata as the model's chunks (the conventions of the module doc)."""
    qsl, n = tuple(case.query_start_loc), len(case.context_lens)
    dcp = case.dcp is not None
    totals = _ints(md.chunk_total_token)
    chunks = []
    for i, lens in enumerate(md.seq_lens.tolist()):
        total = totals[i]
        cu = _ints(md.cu_seq_lens_lst[i]) if dcp else _ints(md.cu_seq_lens[i])
        extra = {}
        if dcp:
            local_total = int(md.seq_tot[i])
            extra = dict(local_starts=_ints(md.starts[i]),
                         padded_local_seq_lens=_ints(md.padded_local_chunk_seq_lens[i]),
                         padded_local_cu_seq_lens=_ints(md.padded_local_cu_seq_lens[i]),
                         padded_local_token_to_seq=_ints(md.padded_local_token_to_seq[i][:local_total]),
                         num_local_context_tokens=local_total,
                         local_context_lens_allranks=tuple(_ints(r) for r in md.local_context_lens_allranks))
        chunks.append(UniformContextChunk(
            index=i, request_slice=slice(0, n), token_slice=slice(0, qsl[n]), query_start_loc=qsl,
            max_query_len=max(b - a for a, b in zip(qsl, qsl[1:])),
            starts=_ints((plain if dcp else md).starts[i]), seq_lens=_ints(lens), cu_seq_lens=cu,
            token_to_seq=_ints(md.token_to_seq[i][:total]),
            num_context_tokens=total if dcp else int(md.seq_tot[i]), max_seq_len=int(md.max_seq_lens[i]),
            has_empty_context=bool(md.has_empty_context[i]), **extra))
    return tuple(chunks)


def plan_summary(chunks: Any, tokens_with_context: int | None, chunk_size: int | None) -> dict[str, Any]:
    return {"num_chunks": len(chunks), "starts": [c.starts[0] for c in chunks],
            "seq_lens": [list(c.seq_lens) for c in chunks], "prefill_tokens_with_context": tokens_with_context,
            "local_chunk_size": chunk_size}


def plan_checks() -> list[tuple[str, Callable[[Any, Any, int], None]]]:
    """The model's plan properties as checks over (case, chunks, workspace); same functions the model runs."""
    from kvsim.properties.mla_chunks import plan as props

    def lower_bound(case: Any, chunks: Any, w: int) -> None:
        bound = props.chunk_count_lower_bound(case.context_lens, w, per_run=False)  # uniform: global bound
        if len(chunks) < bound:
            raise PropertyViolation(f"chunks for {list(case.context_lens)} with W {w}: expected >= {bound}, "
                                    f"got {len(chunks)}")

    def slack(case: Any, chunks: Any, w: int) -> None:  # the b38e111d seed bug's property (the planner target's)
        check_chunk_count(case, chunks, case.split_alignment, 0, None, w)

    return [
        ("chunks_tile_every_context_row_once", lambda c, ch, w: props.check_exact_tiling(c.context_lens, ch)),
        ("chunks_have_no_empty_spans", lambda c, ch, w: props.check_no_empty_spans(ch)),
        ("chunks_fit_the_row_budget",
         lambda c, ch, w: props.check_row_budget(c.context_lens, ch, w, c.split_alignment, c.dcp)),
        ("chunks_follow_request_order", lambda c, ch, w: props.check_request_order(c.context_lens, ch)),
        ("continuation_only_at_first_request", lambda c, ch, w: props.check_continuation(ch)),
        ("chunk_starts_are_aligned", lambda c, ch, w: props.check_alignment(ch, c.split_alignment)),
        ("chunk_count_meets_lower_bound", lower_bound),
        ("chunk_count_within_alignment_slack", slack),
    ]


def verdict(fn: Callable, *args: Any) -> str | None:
    try:
        fn(*args)
    except PropertyViolation as exc:
        return str(exc)
    return None


def run_uniform_plan(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.properties.mla_chunks.cases import PLAN_EXAMPLES
    from kvsim.properties.mla_chunks.strategies import PLAN_CASES
    started = time.perf_counter()
    result = TargetResult(NAME, source.version)
    try:
        fn = load(source)
    except LookupError:
        result.status = "not present"
        result.note = (f"{RELPATH}: {source.label} plans per request (plan_mla_context_chunks, b38e111d); the "
                       "uniform plan is gone")
        return result.finish(started)
    checks = plan_checks()
    failures: dict[str, str] = {}
    disagree: set[str] = set()

    def check(case: Any) -> None:
        workspace = chunked_context_workspace_size(case.workspace_size, case.max_num_seqs, case.block_size, case.dcp,
                                                   PRE)
        try:
            model = build_uniform_chunked_context_metadata(case.context_lens, case.query_start_loc, workspace,
                                                           case.block_size, dcp=case.dcp)
        except ConfigError as exc:
            model = exc
        md = call_upstream(fn, case, workspace, dcp=case.dcp is not None)
        doc = {"context_lens": list(case.context_lens), "query_lens": list(case.query_lens), "workspace": workspace,
               "block": case.block_size, "dcp": [case.dcp_world_size, case.dcp_interleave]}
        result.compared += 1
        if isinstance(model, BaseException) or isinstance(md, BaseException) or model is None or md is None:
            shown = ["refuses" if isinstance(x, BaseException) else None if x is None else "a plan"
                     for x in (model, md)]
            if shown[0] != shown[1]:
                result.diverge(doc, shown[0], shown[1], str(md) if isinstance(md, BaseException) else "")
            return
        plain = call_upstream(fn, case, workspace, dcp=False) if case.dcp is not None else md
        chunks = upstream_chunks(md, plain, case)
        assert isinstance(model, UniformChunkedContextMetadata)
        if chunks != model.chunks or md.prefill_tokens_with_context != model.prefill_tokens_with_context or \
                getattr(md, "chunk_size", None) != model.local_chunk_size:
            first = next((i for i, (a, b) in enumerate(zip(model.chunks, chunks)) if a != b), None)
            result.diverge(doc, plan_summary(model.chunks, model.prefill_tokens_with_context, model.local_chunk_size),
                           plan_summary(chunks, md.prefill_tokens_with_context, getattr(md, "chunk_size", None)),
                           f"first differing chunk {first}" if first is not None else "chunk count or metadata")
        for name, fn_check in checks:
            upstream_verdict = verdict(fn_check, case, chunks, workspace)
            model_verdict = verdict(fn_check, case, model.chunks, workspace)
            if upstream_verdict and name not in failures:
                failures[name] = f"{upstream_verdict} (context_lens {list(case.context_lens)}, W {workspace})"
            if (upstream_verdict is None) != (model_verdict is None) and name not in disagree:
                disagree.add(name)
                result.diverge(doc, {name: model_verdict or "holds"}, {name: upstream_verdict or "holds"},
                               "the property's verdict differs between the model's pre_b38e111d and upstream")

    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the plan's tensors are tiny: intra-op threads cost 100x on small repeat_interleave
    try:
        for example in PLAN_EXAMPLES:  # the pinned upstream batches first ([960] + [16] * 7: 8 chunks for 2)
            check(example)
        drive(PLAN_CASES, check, options)
    finally:
        torch.set_num_threads(threads)
    for name, _ in checks:
        result.prop(name, "fails" if name in failures else "holds", failures.get(name, ""))
    if failures and not disagree:
        result.note = (f"{len(failures)} plan properties fail on {source.label}'s uniform plan, as on the model's "
                       "pre_b38e111d: their verdicts agree on every input compared")
    return result.finish(started)


TARGETS = (
    Target("vllm", NAME, RELPATH, (SYMBOL,), "mla-chunks",
           "the uniform plan inline in build_mla_chunked_context_metadata (pre-b38e111d releases), field by field "
           "vs the model's pre_b38e111d metadata, + the model's plan properties on upstream's plan (verdicts "
           "compared); "
           "the adapter calls the released top-level function with CPU tensors (pin_memory dropped)",
           run_uniform_plan),
)
