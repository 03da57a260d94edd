"""vLLM's MLA chunked-prefill workspace size (`MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size`).

Target `mla_workspace_size`: the static method of the released builder class (loaded with the loader; the
class body runs, its base classes are inert), called with a stand-in `VllmConfig` holding the fields it
reads, against the model's `determine_chunked_prefill_workspace_size` followed by the variant's lower bound
(`chunked_context_workspace_size`), exhaustively over a grid of max_model_len, max_num_seqs, block and DCP
layout. The variant is read from the source, not its version number: a file with `plan_mla_context_chunks`
(b38e111d, 0.28.0 on) is the model's `fixed` (`round_up(max(W, A), A)`, vllm#51733 included), one without is
`pre_b38e111d` (`max(W, max_num_seqs * block)`, DCP not read).
Adapter convention: the stand-in config's `parallel_config` carries `decode_context_parallel_size` and
`cp_kv_cache_interleave_size` (read only by the aligned bound of 0.28.0 on).
"""

from __future__ import annotations

import time
from itertools import product
from types import SimpleNamespace

from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.planner import (VARIANTS, chunked_context_workspace_size,
                                             determine_chunked_prefill_workspace_size)

from ..loader import load_definitions, names_in
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, sweep

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
NAME = "mla_workspace_size"
MAX_MODEL_LENS = (1, 7, 100, 1000, 8191, 8192, 10_000, 131_072)
MAX_NUM_SEQS = (1, 2, 5, 64, 255, 256, 1024)
BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)
DCP_LAYOUTS = ((1, 1), (2, 1), (2, 2), (4, 1), (2, 4), (4, 2), (2, 64))


def grid() -> list[tuple[int, int, int, int, int]]:
    """(max_model_len, max_num_seqs, block, world, interleave): DCP only where the block is a multiple of both."""
    return [(m, s, b, w, i) for m, s, b, (w, i) in product(MAX_MODEL_LENS, MAX_NUM_SEQS, BLOCKS, DCP_LAYOUTS)
            if w == 1 or (b % w == 0 and b % i == 0) or (w, i) == (2, 64)]


def config(max_model_len: int, max_num_seqs: int, block: int, world: int, interleave: int) -> SimpleNamespace:
    return SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                           scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
                           cache_config=SimpleNamespace(block_size=block),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=world,
                                                           cp_kv_cache_interleave_size=interleave))


def run_workspace_size(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    path = source.file(RELPATH)
    variant = VARIANTS["fixed" if "plan_mla_context_chunks" in names_in(path) else "pre_b38e111d"]
    builder = load_definitions(path, ["MLACommonMetadataBuilder"], where=RELPATH,
                               version=source.label).MLACommonMetadataBuilder
    upstream_size = builder.determine_chunked_prefill_workspace_size
    result = TargetResult(NAME, source.version, note=f"model variant {variant.name}")

    def check(point: tuple[int, int, int, int, int]) -> None:
        max_model_len, max_num_seqs, block, world, interleave = point
        dcp = None if world == 1 else DcpConfig(world, interleave)
        model = chunked_context_workspace_size(determine_chunked_prefill_workspace_size(max_model_len, max_num_seqs,
                                                                                         block),
                                               max_num_seqs, block, dcp, variant)
        upstream = upstream_size(config(*point))
        result.compared += 1
        if model != upstream:
            result.diverge({"max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "block": block,
                            "dcp": [world, interleave]}, model, upstream, f"variant {variant.name}")

    sweep(grid(), check)
    return result.finish(started)


TARGETS = (
    Target("vllm", NAME, RELPATH, ("MLACommonMetadataBuilder",), "mla-chunks",
           "MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size (the released static method, stand-in "
           "VllmConfig) vs the model's core size + the variant's lower bound, exhaustive grid", run_workspace_size),
)
