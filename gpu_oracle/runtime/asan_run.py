"""Child entry point for AddressSanitizer runs (started by `gpu_oracle.asan` with libasan preloaded).

    python -m gpu_oracle.asan_run case FILE|-                       one zeroing case from JSON
    python -m gpu_oracle.asan_run gather FILE|-                     one MLA context gather from JSON, unchecked
    python -m gpu_oracle.asan_run staging FILE|-                    one PD staging gather/scatter from JSON, unchecked
    python -m gpu_oracle.asan_run check NAME --max-examples N [--seed S]   a whole oracle check

Prints one JSON line on success. An out-of-bounds store never gets that far:
ASan prints its report and exits with `gpu_oracle.asan.ASAN_EXIT_CODE`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

import numpy as np


def run_case(document: dict[str, Any]) -> dict[str, Any]:
    from kvsim.models.kv_zeroing.zeroer import Segment, SegmentTable
    from kvsim.models.kv_zeroing.geometry import Arena

    from ..kernels.zero_kv_blocks.backends import zero_kv_blocks

    arena = Arena(tuple(document["arena"]["bases"]), tuple(document["arena"]["sizes"]), document["arena"]["size"])
    raw = document["table"]
    table = SegmentTable(tuple(Segment(s["addr"], s["block_stride"], s["page"], tuple(s.get("layers", ())))
                               for s in raw["segments"]), raw["num_blocks"], raw["variant"])
    memory = np.full(arena.size, document["fill"], dtype=np.uint8)
    # The arena only carries the bytes in and out; the kernel runs on one malloc per allocation.
    out = zero_kv_blocks("cpu-shim-asan", memory, table, document["block_ids"],
                         chunk_width=document.get("chunk_width"), arena=arena)
    return {"sha256": hashlib.sha256(out.tobytes()).hexdigest(), "zero_bytes": int((out == 0).sum())}


def run_gather(document: dict[str, Any]) -> dict[str, Any]:
    from ..kernels.mla_context.backends import gather_mla_context

    cache = np.frombuffer(bytes.fromhex(document["kv_cache"]), dtype=np.dtype(document["dtype"]))
    cache = cache.reshape(document["shape"])
    # No bounds check: the point is to let wrong metadata reach the kernel and see ASan stop it.
    rows = gather_mla_context("cpu-shim-asan", cache, np.array(document["block_table"], dtype=np.int64),
                              document["cu_seq_lens"], document["token_to_seq"], document["seq_starts"],
                              check_bounds=False)
    return {"sha256": hashlib.sha256(rows.tobytes()).hexdigest(), "shape": list(rows.shape)}


def run_staging(document: dict[str, Any]) -> dict[str, Any]:
    from kvsim.models.pd_staging.layout import HeadSliceParams, StagingLayout

    from ..kernels.staging.backends import gather_head_slice, scatter_staging

    pool = np.frombuffer(bytes.fromhex(document["pool"]), dtype=np.dtype(document["dtype"]))
    pool = pool.reshape(document["shape"]).copy()
    staging = np.frombuffer(bytes.fromhex(document["staging"]), dtype=np.uint8).copy()
    params = HeadSliceParams(**document["params"])
    raw = document["layout"]
    lay = StagingLayout(raw["tokens"], raw["num_layers"], raw["head_bytes"], tuple(raw["writer_heads"]))
    # No bounds check: a layout larger than the slot must reach the kernel, so ASan can stop it.
    if document["kernel"] == "gather":
        out = gather_head_slice("cpu-shim-asan", pool, document["pages"], params, lay, staging, document["offset"],
                                check_bounds=False)
    else:
        out = scatter_staging("cpu-shim-asan", pool, staging, document["pages"], params, lay, document["offset"],
                              check_bounds=False)
    return {"sha256": hashlib.sha256(out.tobytes()).hexdigest(), "nbytes": int(out.nbytes)}


def run_check(name: str, max_examples: int, seed: int | None) -> dict[str, Any]:
    from .checks import CHECKS

    outcome = CHECKS[name].fn("cpu-shim-asan", max_examples, seed)
    return {"examples": outcome.examples, "status": outcome.status, "message": outcome.message}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_oracle.asan_run")
    sub = parser.add_subparsers(dest="command", required=True)
    case = sub.add_parser("case")
    case.add_argument("file", help="JSON case document, or - for stdin")
    gather = sub.add_parser("gather")
    gather.add_argument("file", help="JSON gather document (gpu_oracle.asan.gather_case_document), or - for stdin")
    staging = sub.add_parser("staging")
    staging.add_argument("file", help="JSON staging document (gpu_oracle.asan.staging_case_document), or - for stdin")
    check = sub.add_parser("check")
    check.add_argument("name")
    check.add_argument("--max-examples", type=int, default=50)
    check.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    from ..kernels.zero_kv_blocks.backends import asan_loaded

    if not asan_loaded():
        print("gpu_oracle.asan_run: libasan is not preloaded; start it through gpu_oracle.asan", file=sys.stderr)
        return 2
    if args.command in ("case", "gather", "staging"):
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
        result = {"case": run_case, "gather": run_gather, "staging": run_staging}[args.command](json.loads(text))
    else:
        result = run_check(args.name, args.max_examples, args.seed)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
