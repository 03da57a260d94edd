"""JSONL traces: a header line, one line per step, an end line with the digest.

    {"kvsim_trace": 1, "model": ..., "variant": ..., "seed": ..., "params": {...}, "faults": "...", "version": ...}
    {"i": 0, "t": 0.0, "event": "arrive", "data": {...}}
    ...
    {"end": true, "steps": N, "digest": "<sha256>"}

The digest is a SHA-256 over the canonical JSON of the header (less the
kvsim version) and of every step line, so it is the same in any process and
under any PYTHONHASHSEED, and it changes when any recorded step changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .canon import canonical_json, dumps, to_jsonable
from .errors import TraceError

FORMAT = 1
HEADER_KEYS = ("model", "variant", "seed", "params", "faults")
STEP_KEYS = ("i", "t", "event", "data")


class TraceRecorder:
    def __init__(self, header: dict[str, Any]) -> None:
        self.header = {"kvsim_trace": FORMAT, **to_jsonable(header)}
        self.steps: list[dict[str, Any]] = []
        self._hash = hashlib.sha256(canonical_json(_core(self.header)).encode("ascii"))

    def record(self, t: float, event: str, data: Any = None) -> None:
        line = {"i": len(self.steps), "t": t, "event": event, "data": to_jsonable(data)}
        self.steps.append(line)
        self._hash.update(b"\n" + dumps(line).encode("ascii"))

    def digest(self) -> str:
        return self._hash.hexdigest()

    def lines(self) -> list[str]:
        end = {"end": True, "steps": len(self.steps), "digest": self.digest()}
        return [canonical_json(self.header)] + [canonical_json(s) for s in self.steps] + [canonical_json(end)]

    def write(self, path: str) -> None:
        with open(path, "w", encoding="ascii") as fh:
            fh.write("\n".join(self.lines()) + "\n")


def _core(header: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in header.items() if k != "version"}


@dataclass
class Trace:
    path: str
    header: dict[str, Any]
    steps: list[dict[str, Any]]
    digest: str


def read_trace(path: str) -> Trace:
    """Parse and validate a trace file; every problem is a TraceError naming the line."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read the file: {exc.strerror}") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TraceError(path, line, "not ASCII: a kvsim trace is canonical JSON lines") from None
    lines = text.splitlines()
    if not lines:
        raise TraceError(path, 1, "empty file: expected a kvsim trace header")
    rows = [_parse_line(path, n, line) for n, line in enumerate(lines, start=1)]
    header = rows[0]
    if header.get("kvsim_trace") != FORMAT:
        raise TraceError(path, 1, f"not a kvsim trace (expected a header with \"kvsim_trace\": {FORMAT})")
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise TraceError(path, 1, f"header lacks {', '.join(missing)}")
    steps = []
    for n, row in enumerate(rows[1:], start=2):
        if row.get("end") is True:
            if n != len(rows):
                raise TraceError(path, n + 1, "lines after the end line")
            if row.get("steps") != len(steps) or not isinstance(row.get("digest"), str):
                raise TraceError(path, n, f"end line says {row.get('steps')!r} steps, the file has {len(steps)}")
            return Trace(path, header, steps, row["digest"])
        if sorted(row) != sorted(STEP_KEYS):
            raise TraceError(path, n, f"expected a step with keys {', '.join(STEP_KEYS)}, got {', '.join(sorted(row))}")
        if row["i"] != len(steps):
            raise TraceError(path, n, f"step number: expected {len(steps)}, got {row['i']!r}")
        steps.append(row)
    raise TraceError(path, len(rows) + 1, "the trace ends without its end line (truncated?)")


def _parse_line(path: str, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(path, number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise TraceError(path, number, f"expected a JSON object, got {type(row).__name__}")
    return row


@dataclass
class ReplayResult:
    path: str
    steps: int
    digest: str
    matches: bool
    line: int | None = None
    expected: Any = None
    got: Any = None

    def to_json(self) -> dict[str, Any]:
        out = {"trace": self.path, "steps": self.steps, "digest": self.digest, "matches": self.matches}
        if not self.matches:
            out.update({"line": self.line, "expected": self.expected, "got": self.got})
        return out


def compare(trace: Trace, rerun: TraceRecorder) -> ReplayResult:
    """Step-by-step comparison of a stored trace with a fresh run; stops at the first divergence."""
    for n, (stored, fresh) in enumerate(zip(trace.steps, rerun.steps), start=2):
        if canonical_json(stored) != canonical_json(fresh):
            return ReplayResult(trace.path, n - 2, rerun.digest(), False, n, fresh, stored)
    if len(trace.steps) != len(rerun.steps):
        n = min(len(trace.steps), len(rerun.steps)) + 2
        return ReplayResult(trace.path, n - 2, rerun.digest(), False, n,
                            f"{len(rerun.steps)} steps in the re-run", f"{len(trace.steps)} steps in the trace")
    if rerun.digest() != trace.digest:
        return ReplayResult(trace.path, len(trace.steps), rerun.digest(), False, len(trace.steps) + 2,
                            rerun.digest(), trace.digest)
    return ReplayResult(trace.path, len(trace.steps), rerun.digest(), True)
