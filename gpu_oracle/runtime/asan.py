"""Run kernels under AddressSanitizer in a child Python, and read its report.

libasan has to be the first library a process loads, so it cannot be added
to a running interpreter: the parent starts `python -m gpu_oracle.asan_run`
with `LD_PRELOAD=<libasan.so>`, the child loads the ASan build of the shim and
runs either one case or a whole oracle check, and prints one JSON line. When
a kernel stores out of bounds, ASan stops the child with exit code
`ASAN_EXIT_CODE` and a report on stderr naming the access and the kernel's
source line; `parse_report` turns that into an `AsanReport`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kvsim.engine.canon import to_jsonable
from kvsim.engine.errors import ConfigError
from kvsim.models.kv_zeroing.zeroer import SegmentTable
from kvsim.models.kv_zeroing.geometry import Arena

from . import build

ASAN_EXIT_CODE = 86


@dataclass(frozen=True)
class AsanReport:
    """The first error ASan reported: what kind, which access, and where in the source."""

    kind: str       # e.g. "heap-buffer-overflow"
    access: str     # "WRITE" or "READ"
    size: int       # bytes accessed
    file: str       # source file of the faulting frame
    line: int
    function: str
    text: str       # the whole report, for a human
    region: str = ""  # e.g. "0 bytes to the right of 192-byte region"

    def __str__(self) -> str:
        where = f" ({self.region})" if self.region else ""
        return (f"{self.kind}: {self.access} of size {self.size} in {self.function} at "
                f"{Path(self.file).name}:{self.line}{where}")


_ERROR = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)")
_ACCESS = re.compile(r"\b(READ|WRITE) of size (\d+)")
_SUMMARY = re.compile(r"SUMMARY: AddressSanitizer: [\w-]+ (\S+?):(\d+)(?::\d+)? in (.+)")
_REGION = re.compile(r"located (\d+ bytes (?:to the right|to the left|inside) of \d+-byte region)")
_FRAME = re.compile(r"#\d+ 0x[0-9a-f]+ in (.+?) (\S+?):(\d+)(?::\d+)?$", re.M)


def parse_report(stderr: str) -> AsanReport | None:
    """The report in a sanitized process's stderr, or None when ASan reported nothing."""
    error = _ERROR.search(stderr)
    if error is None:
        return None
    text = stderr[error.start():]
    access = _ACCESS.search(text)
    summary = _SUMMARY.search(text)
    if summary:
        file, line, function = summary.group(1), int(summary.group(2)), summary.group(3).strip()
    elif frame := _FRAME.search(text):
        function, file, line = frame.group(1), frame.group(2), int(frame.group(3))
    else:
        file, line, function = "?", 0, "?"
    region = _REGION.search(text)
    return AsanReport(kind=error.group(1), access=access.group(1) if access else "?",
                      size=int(access.group(2)) if access else 0, file=file, line=line, function=function,
                      text=text.strip(), region=region.group(1) if region else "")


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    report: AsanReport | None
    output: dict[str, Any] | None  # the child's JSON line, when it finished

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and self.report is None and self.output is not None

    def explain(self) -> str:
        if self.report is not None:
            return f"AddressSanitizer: {self.report}"
        if self.output is None:
            tail = "\n".join(self.stderr.strip().splitlines()[-5:])
            return f"the ASan child exited {self.returncode} without a result: {tail}"
        return json.dumps(self.output)


def child_env() -> dict[str, str]:
    cxx = build.find_compiler()
    runtime = build.asan_runtime(cxx) if cxx else None
    if runtime is None:
        raise ConfigError("cpu-shim-asan", "a C++ compiler with libasan.so", cxx)
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (runtime, env.get("LD_PRELOAD", "")) if p)
    # Leak checking would flag the interpreter itself; the exit code tells the parent ASan fired.
    env["ASAN_OPTIONS"] = f"detect_leaks=0:halt_on_error=1:exitcode={ASAN_EXIT_CODE}:symbolize=1"
    return env


def run_child(args: Sequence[str], *, stdin: str | None = None, timeout: float = 300) -> ChildResult:
    """Run `python -m kvsim.gpu_oracle.runtime.asan_run ARGS...` with libasan preloaded."""
    # Build here, not in the child: the compiler must not run with libasan preloaded.
    for kernel in build.shim_kernels():
        build.build_shim(kernel, asan=True)
    proc = subprocess.run([sys.executable, "-m", "kvsim.gpu_oracle.runtime.asan_run", *args], input=stdin, capture_output=True,
                          text=True, env=child_env(), timeout=timeout)
    output = None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            output = json.loads(lines[-1])
        except json.JSONDecodeError:
            output = None
    return ChildResult(proc.returncode, proc.stdout, proc.stderr, parse_report(proc.stderr), output)


def case_document(arena: Arena, table: SegmentTable, block_ids: Sequence[int], *, fill: int = 0xA5,
                  chunk_width: int | None = None) -> dict[str, Any]:
    return {"arena": to_jsonable(arena), "table": to_jsonable(table), "block_ids": list(block_ids),
            "fill": fill, "chunk_width": chunk_width}


def run_case(arena: Arena, table: SegmentTable, block_ids: Sequence[int], *, fill: int = 0xA5,
             chunk_width: int | None = None) -> ChildResult:
    """Zero `block_ids` by `table` in an ASan child, one malloc per allocation of `arena` filled with `fill`.

    A clean run's output holds the SHA-256 of the resulting arena bytes, to compare with the reference.
    """
    document = case_document(arena, table, block_ids, fill=fill, chunk_width=chunk_width)
    return run_child(["case", "-"], stdin=json.dumps(document))


def gather_case_document(kv_cache: np.ndarray, block_table: np.ndarray, cu_seq_lens: Sequence[int],
                         token_to_seq: Sequence[int], seq_starts: Sequence[int]) -> dict[str, Any]:
    """A gather case as JSON: the cache as hex bytes (bit-exact, NaN payloads included) and the metadata."""
    cache = np.ascontiguousarray(kv_cache)
    return {"kv_cache": cache.tobytes().hex(), "dtype": cache.dtype.str, "shape": list(cache.shape),
            "block_table": np.asarray(block_table).tolist(), "cu_seq_lens": [int(x) for x in cu_seq_lens],
            "token_to_seq": [int(x) for x in token_to_seq], "seq_starts": [int(x) for x in seq_starts]}


def run_gather_case(kv_cache: np.ndarray, block_table: np.ndarray, cu_seq_lens: Sequence[int],
                    token_to_seq: Sequence[int], seq_starts: Sequence[int]) -> ChildResult:
    """Gather in an ASan child with the metadata as given (no bounds check), every array its own malloc.

    A clean run's output holds the SHA-256 of the workspace bytes; wrong metadata ends in an ASan report.
    """
    document = gather_case_document(kv_cache, block_table, cu_seq_lens, token_to_seq, seq_starts)
    return run_child(["gather", "-"], stdin=json.dumps(document))


def staging_case_document(kernel: str, pool: np.ndarray, pages: Sequence[int], params: Any, layout: Any,
                          staging: np.ndarray, offset: int) -> dict[str, Any]:
    """A PD staging copy as JSON: pool and staging buffer as hex bytes, the head slice and the slot layout."""
    pool = np.ascontiguousarray(pool)
    return {"kernel": kernel, "pool": pool.tobytes().hex(), "dtype": pool.dtype.str, "shape": list(pool.shape),
            "pages": [int(p) for p in pages], "params": to_jsonable(params), "layout": to_jsonable(layout),
            "staging": np.ascontiguousarray(staging, dtype=np.uint8).tobytes().hex(), "offset": int(offset)}


def run_staging_case(kernel: str, pool: np.ndarray, pages: Sequence[int], params: Any, layout: Any,
                     staging: np.ndarray, offset: int) -> ChildResult:
    """Gather (`kernel="gather"`) or scatter one writer in an ASan child, unchecked, the staging buffer its own malloc.

    A clean run's output holds the SHA-256 of the result (the staging buffer or the pool); a layout larger
    than the buffer ends in an ASan report.
    """
    document = staging_case_document(kernel, pool, pages, params, layout, staging, offset)
    return run_child(["staging", "-"], stdin=json.dumps(document))
