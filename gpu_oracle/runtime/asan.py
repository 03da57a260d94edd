"""Run kernels under AddressSanitizer in a child Python, and read its report.

libasan has to be the first library a process loads, so it cannot be added
to a running interpreter: the parent starts `python -m kvsim.gpu_oracle.runtime.asan_run`
with `LD_PRELOAD=<libasan.so>`, the child loads the ASan build of the shim and
runs either one case document of a kernel family (`run_case`) or a whole
kernel property, and prints one JSON line. When
a kernel stores out of bounds, ASan stops the child with exit code
`ASAN_EXIT_CODE` and a report on stderr naming the access and the kernel's
source line; `parse_report` turns that into an `AsanReport`, and
`expect_clean` / `expect_overflow` turn a child's result into a property's
verdict. `pack` / `unpack` carry arrays bit-exact through a case document.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from kvsim.engine.errors import ConfigError, PropertyViolation

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
    proc = subprocess.run([sys.executable, "-m", "kvsim.gpu_oracle.runtime.asan_run", *args], input=stdin,
                          capture_output=True, text=True, env=child_env(), timeout=timeout)
    output = None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            output = json.loads(lines[-1])
        except json.JSONDecodeError:
            output = None
    return ChildResult(proc.returncode, proc.stdout, proc.stderr, parse_report(proc.stderr), output)


def run_case(family: str, document: Mapping[str, Any]) -> ChildResult:
    """Run one case of kernel family `family` in an ASan child (`KernelFamily.run_document` on `document`)."""
    return run_child(["case", family, "-"], stdin=json.dumps(document))


def pack(array: np.ndarray) -> dict[str, Any]:
    """An array as JSON, bit-exact (NaN payloads included): hex bytes, dtype and shape."""
    array = np.ascontiguousarray(array)
    return {"hex": array.tobytes().hex(), "dtype": array.dtype.str, "shape": list(array.shape)}


def unpack(doc: Mapping[str, Any]) -> np.ndarray:
    """A writable array from `pack`'s document."""
    return np.frombuffer(bytes.fromhex(doc["hex"]), dtype=np.dtype(doc["dtype"])).reshape(doc["shape"]).copy()


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def expect_clean(what: str, child: ChildResult, reference: np.ndarray) -> None:
    """The child ran clean and its result bytes are the reference's."""
    if not child.clean or child.output is None or child.output["sha256"] != sha256(reference):
        raise PropertyViolation(f"{what}: expected a clean run with the reference bytes, got {child.explain()}")


def expect_overflow(what: str, child: ChildResult, access: str, source: str) -> AsanReport:
    """ASan stopped the child with a heap-buffer-overflow `access` ("READ" or "WRITE") in `source`."""
    report = child.report
    if report is None or report.kind != "heap-buffer-overflow" or report.access != access \
            or not report.file.endswith(source):
        raise PropertyViolation(f"{what}: expected an ASan heap-buffer-overflow {access} in {source}, "
                                f"got {child.explain()}")
    return report
