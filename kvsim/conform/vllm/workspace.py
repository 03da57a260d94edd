"""vLLM's MLA chunked-prefill workspace size (`MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size`).

`SIZE` (target `mla_workspace_size`): the static method of the released builder class (loaded with the loader;
the class body runs, its base classes are inert), called with a stand-in `VllmConfig` holding the fields it
reads, against the model's `determine_chunked_prefill_workspace_size` followed by the variant's lower bound
(`chunked_context_workspace_size`), exhaustively over a grid of max_model_len, max_num_seqs, block and DCP
layout, smallest sizes first. The variant is the declaration's release table: before 0.28.0 `pre_b38e111d`
(`max(W, max_num_seqs * block)`, DCP not read), from 0.28.0 (b38e111d with vllm#51733) `fixed`
(`round_up(max(W, A), A)`).
Adapter convention: the stand-in config's `parallel_config` carries `decode_context_parallel_size` and
`cp_kv_cache_interleave_size` (read only by the aligned bound of 0.28.0 on); DCP layouts only where the block
is a multiple of the interleave (the config's own check under DCP), plus (2, 64) with small blocks (NIXL P/D
skips that check) and an interleave without DCP (prefill context parallelism).
Survivors (equivalent): the arguments of the method's `min` and `max` swapped.
"""

from __future__ import annotations

from itertools import product
from types import SimpleNamespace
from typing import Any, Iterator

from kvsim.engine.conformance.adapters import Context, Sweep
from kvsim.models.mla_chunks.dcp import DcpConfig
from kvsim.models.mla_chunks.planner import chunked_context_workspace_size, determine_chunked_prefill_workspace_size

from ..loader import check_signature

RELPATH = "vllm/model_executor/layers/attention/mla_attention.py"
MAX_MODEL_LENS = (1, 7, 100, 1000, 8191, 8192, 10_000, 131_072)
MAX_NUM_SEQS = (1, 2, 5, 64, 255, 256, 1024)
BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)
DCP_LAYOUTS = ((1, 1), (2, 1), (2, 2), (4, 1), (2, 4), (4, 2), (2, 64), (1, 4))  # (world, interleave)


def grid() -> Iterator[dict[str, int]]:
    """Every point, the smallest requested workspace first: DCP only where the block is a multiple of the
    interleave (and (2, 64), and the interleave without DCP, everywhere)."""
    points = [(m, s, b, w, i) for m, s, b, (w, i) in product(MAX_MODEL_LENS, MAX_NUM_SEQS, BLOCKS, DCP_LAYOUTS)
              if w == 1 or (b % w == 0 and b % i == 0) or (w, i) == (2, 64)]
    for m, s, b, w, i in sorted(points, key=lambda p: (8 * p[0] + 4 * p[1] * p[2], p)):
        yield {"max_model_len": m, "max_num_seqs": s, "block": b, "dcp": [w, i]}


def config(point: dict[str, int]) -> SimpleNamespace:
    world, interleave = point["dcp"]
    return SimpleNamespace(model_config=SimpleNamespace(max_model_len=point["max_model_len"]),
                           scheduler_config=SimpleNamespace(max_num_seqs=point["max_num_seqs"]),
                           cache_config=SimpleNamespace(block_size=point["block"]),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=world,
                                                           cp_kv_cache_interleave_size=interleave))


def size_model(ctx: Context, point: dict[str, Any]) -> int:
    world, interleave = point["dcp"]
    seqs, block = point["max_num_seqs"], point["block"]
    core = determine_chunked_prefill_workspace_size(point["max_model_len"], seqs, block)
    return chunked_context_workspace_size(core, seqs, block, None if world == 1 else DcpConfig(world, interleave),
                                          ctx.variant)


def size_upstream(ctx: Context, point: dict[str, Any]) -> int:
    return ctx.up.MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size(config(point))


SIZE = Sweep(
    prepare=lambda ctx: check_signature(ctx.up.MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size,
                                        ("vllm_config",),
                                        f"{RELPATH}:MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size"),
    domain=lambda ctx: grid(), model=size_model, upstream=size_upstream,
    note=lambda ctx: f"model variant {ctx.variant.name}")
