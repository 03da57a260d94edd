"""JSONL traces: a header line, one line per step, an end line with the digest.

    {"kvsim_trace": 1, "model": ..., "variant": ..., "seed": ..., "params": {...}, "faults": "...", "version": ...}
    {"i": 0, "t": 0.0, "event": "arrive", "data": {...}}
    ...
    {"end": true, "steps": N, "digest": "<sha256>"}

The digest is a SHA-256 over the canonical JSON of the header (less the
kvsim version) and of every step line, so it is the same in any process and
under any PYTHONHASHSEED, and it changes when any recorded step changes. A run
that a work budget stopped says so on its end line (`"incomplete": "max-events"`
and the `"events"` it ran), which the digest does not cover.

A trace file is untrusted input: `TraceReader` streams it a line at a time
(each line at most `MAX_LINE` bytes, nesting refused as an error, not a
`RecursionError`) and checks the header against its schema before anything
runs.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator

from .canon import PLAIN, RECORDS, canonical_json, dumps, encode as _encode, to_jsonable
from .errors import TraceError



FORMAT = 1
HEADER_KEYS = ("model", "variant", "seed", "params", "faults")
STEP_KEYS = ("i", "t", "event", "data")
MAX_LINE = 1 << 20  # bytes: the longest line a trace may hold (real step lines are a few hundred bytes)


class TraceRecorder:
    """Records the steps of one run and their digest.

    Each step is turned into its canonical text once, when it is recorded: that text is what the digest
    covers, what `lines` and `write` give, and what `steps` parses back on first use. The digest hashes
    the kept texts in one pass when it is asked for (the same bytes as hashing each as it comes); a run
    keeping no step (`keep=False`: a replay compares each step as it comes and needs none of them) hashes
    each step as it is recorded and holds none in memory. `on_step(line)` is called with each step line
    as it is recorded.
    """

    def __init__(self, header: dict[str, Any], *, keep: bool = True,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.header = {"kvsim_trace": FORMAT, **to_jsonable(header)}
        self.count = 0
        self.keep = keep
        self.on_step = on_step
        self.end_extra: dict[str, Any] = {}  # what the end line adds (a budget that stopped the run)
        self._texts: list[str] = []  # the canonical text of every kept step, in order
        self._hashed = 0  # how many of `_texts` the digest covers so far
        self._parsed: list[dict[str, Any]] = []  # `steps`: the kept texts parsed so far
        self._t: float | None = None  # the time of the last step `record` wrote, and its line's tail after the step
        self._t_tail = ""  # number: `,"t":<repr>}` (a float's repr costs as much as encoding a step's fields)
        self._hash = hashlib.sha256(canonical_json(_core(self.header)).encode("ascii"))
        if not keep or on_step is not None:
            self.record = self._record_each  # type: ignore[method-assign]

    @staticmethod
    def _text(i: int, t: float, event: str, jsonable: Any) -> str:
        """Step `i`'s canonical line: `dumps({"i": i, "t": t, "event": event, "data": jsonable})`."""
        head = _EVENT_HEADS.get(event)
        if head is not None and type(t) is float and t - t == 0.0:  # t finite
            # the line's canonical text written directly: its keys in sorted order (data, event, i, t), each
            # value as the encoder writes it (a finite float is its repr), so the same text as `dumps(line)`
            return f'{{"data":{_encode(jsonable)}{head}{i},"t":{t!r}}}'
        if type(event) is str and len(_EVENT_HEADS) < _MAX_EVENT_HEADS:
            _EVENT_HEADS[event] = f',"event":{dumps(event)},"i":'
        return dumps({"i": i, "t": t, "event": event, "data": jsonable})

    def record(self, t: float, event: str, data: Any = None) -> None:
        """Record the next step (kept; hashed when the digest is asked for).

        The common step (an event seen before, a finite time, the fields of an action as a tuple, each a plain
        value or a record of plain values) is written here, `_text`'s line without its calls (this runs once an
        event): the encoder writes such a tuple, and a record in it, as the very list `_step_data` makes of it.
        Steps come in runs of one time (the events of an instant, the steps one event applies), so the line's
        tail after the step number is written once per time (a zero time each step: 0.0 and -0.0 are equal, their
        texts are not)."""
        i = self.count
        self.count = i + 1
        head = _EVENT_HEADS.get(event)
        if head is not None and type(data) is tuple and type(t) is float and t - t == 0.0:
            for v in data:
                kind = type(v)
                if kind not in PLAIN and (kind not in RECORDS or not PLAIN.issuperset(map(type, v))):
                    data = _step_data(data)
                    break
            if t != self._t or not t:
                self._t = t
                self._t_tail = f',"t":{t!r}}}'
            self._texts.append(f'{{"data":{_encode(data)}{head}{i}{self._t_tail}')
            return
        self._texts.append(self._text(i, t, event, _step_data(data)))

    def _record_each(self, t: float, event: str, data: Any = None) -> None:
        """`record` where each step is hashed as it comes: nothing kept, or `on_step` to call."""
        i = self.count
        jsonable = _step_data(data)
        text = self._text(i, t, event, jsonable)
        self.count = i + 1
        if self.keep:
            self._texts.append(text)
            self._hashed += 1
        self._hash.update(("\n" + text).encode("ascii"))
        if self.on_step is not None:
            self.on_step({"i": i, "t": t, "event": event, "data": jsonable})

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The kept step lines as data (what a trace file's lines parse to)."""
        if len(self._parsed) < len(self._texts):
            self._parsed.extend(json.loads(text) for text in self._texts[len(self._parsed):])
        return self._parsed

    def digest(self) -> str:
        if self._hashed < len(self._texts):  # the kept steps not hashed yet, in one update
            self._hash_rest("\n".join(self._texts[self._hashed:]))
        return self._hash.hexdigest()

    def _hash_rest(self, joined: str) -> None:
        """Hash the kept steps not hashed yet, given joined by newlines (each step line follows a newline)."""
        self._hash.update(b"\n")
        self._hash.update(joined.encode("ascii"))
        self._hashed = len(self._texts)

    def _end_line(self) -> str:
        return canonical_json({"end": True, "steps": len(self._texts), "digest": self.digest(), **self.end_extra})

    def lines(self) -> list[str]:
        return [canonical_json(self.header)] + self._texts + [self._end_line()]

    def write(self, path: str) -> None:
        """The file of `lines`, a line each. The step lines are joined once, for the file and, where none is hashed
        yet (a run written before its digest is asked for), for the digest: the same bytes `digest` hashes."""
        body = "\n".join(self._texts)
        if self._texts and not self._hashed:
            self._hash_rest(body)
        with open(path, "w", encoding="ascii") as fh:
            fh.write(canonical_json(self.header) + "\n")
            if body:
                fh.write(body)
                fh.write("\n")
            fh.write(self._end_line() + "\n")


# A step line's text between its data and its step number, by event name: built on an event's first record
# (that line goes through `dumps`), so a step line is one format of texts already canonical. Bounded: a model
# that named events without end would only fall back to `dumps`.
_EVENT_HEADS: dict[str, str] = {}
_MAX_EVENT_HEADS = 4096


def _step_data(data: Any) -> Any:
    """A step's data as plain JSON values: mostly a tuple of fields (an action's), converted field by field."""
    return [v if type(v) in PLAIN else to_jsonable(v) for v in data] if type(data) is tuple else to_jsonable(data)


def _core(header: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in header.items() if k != "version"}


@dataclass
class Trace:
    path: str
    header: dict[str, Any]
    steps: list[dict[str, Any]]
    digest: str
    end: dict[str, Any] | None = None


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


# the header's schema: field -> (accepts, what it must be)
HEADER_SCHEMA: dict[str, tuple[Callable[[Any], bool], str]] = {
    "kvsim_trace": (lambda v: v == FORMAT and type(v) is int, f"the format number {FORMAT}"),
    "model": (lambda v: isinstance(v, str) and v != "", "a model name (a string)"),
    "variant": (lambda v: isinstance(v, str) and v != "", "a variant name (a string)"),
    "seed": (lambda v: type(v) is int, "an integer (not a boolean)"),
    "params": (lambda v: isinstance(v, dict), "an object of the model's simulate parameters"),
    "faults": (lambda v: v is None or isinstance(v, str), "a fault spec (a string) or null"),
    "version": (lambda v: isinstance(v, str), "the kvsim version that wrote it (a string)"),
}


def check_header(path: str, header: dict[str, Any]) -> dict[str, Any]:
    """The header's shape (types only; the model checks names and values): a TraceError naming the field."""
    if "kvsim_trace" not in header:
        raise TraceError(path, 1, f"not a kvsim trace (expected a header with \"kvsim_trace\": {FORMAT})")
    fmt = header["kvsim_trace"]
    if type(fmt) is int and fmt != FORMAT:
        version = header.get("version")
        by = f" by kvsim {version}" if isinstance(version, str) else ""
        raise TraceError(path, 1, f"written in trace format {fmt}{by}; this kvsim reads format {FORMAT} "
                                  "(re-record it with this version)")
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise TraceError(path, 1, f"header lacks {', '.join(missing)}")
    unknown = sorted(k for k in header if k not in HEADER_SCHEMA)
    if unknown:
        raise TraceError(path, 1, f"header field {_short(unknown[0])}: not a field of trace format {FORMAT} "
                                  f"(expected {', '.join(HEADER_SCHEMA)})")
    for key, (accepts, expected) in HEADER_SCHEMA.items():
        if key in header and not accepts(header[key]):
            raise TraceError(path, 1, f"header field {key}: expected {expected}, got {_type_name(header[key])} "
                                      f"{_short(header[key])}")
    return header


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(type(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TraceReader:
    """A trace file read a line at a time: `header` (checked) on opening, then `steps()`, then `end`.

    Memory is bounded by one line (`MAX_LINE`), whatever the file's size; every problem is a
    TraceError naming the line.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.line = 0  # the number of the last line read
        self.end: dict[str, Any] | None = None
        self.end_line = 0
        try:
            self._fh: BinaryIO = open(path, "rb")
        except OSError as exc:
            raise TraceError(path, 0, f"cannot read the file: {exc.strerror or exc}") from None
        try:
            first = self._next()
            if first is None:
                raise TraceError(path, 1, "empty file: expected a kvsim trace header")
            self.header = check_header(path, self._parse(first))
        except BaseException:
            self.close()
            raise
        self._count = 0
        self._pending: tuple[str, dict[str, Any]] | None = None  # a line read ahead by `at_end`

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _next(self) -> str | None:
        """The next line's text (without its newline), or None at the end of the file."""
        try:
            data = self._fh.readline(MAX_LINE + 1)
        except OSError as exc:
            raise TraceError(self.path, self.line + 1, f"cannot read the file: {exc.strerror or exc}") from None
        if not data:
            return None
        self.line += 1
        if len(data) > MAX_LINE and not data.endswith(b"\n"):
            raise TraceError(self.path, self.line, f"line longer than {MAX_LINE} bytes: not a kvsim trace line")
        try:
            return data.decode("ascii").rstrip("\n").rstrip("\r")
        except UnicodeDecodeError:
            raise TraceError(self.path, self.line, "not ASCII: a kvsim trace is canonical JSON lines") from None

    def _parse(self, text: str) -> dict[str, Any]:
        return parse_line(self.path, self.line, text)

    def next_step(self) -> tuple[str, dict[str, Any]] | None:
        """The next step as (its text, its object), or None once the end line has been read (then `end`)."""
        if self.end is not None:
            return None
        if self._pending is not None:
            (text, row), self._pending = self._pending, None
        else:
            read = self._next()
            if read is None:
                raise TraceError(self.path, self.line + 1, "the trace ends without its end line (truncated?)")
            text, row = read, self._parse(read)
        if row.get("end") is True:
            self._finish(row)
            return None
        if sorted(row) != sorted(STEP_KEYS):
            raise TraceError(self.path, self.line, f"expected a step with keys {', '.join(STEP_KEYS)}, "
                                                   f"got {_short(', '.join(sorted(row)))}")
        if type(row["i"]) is not int or row["i"] != self._count:
            raise TraceError(self.path, self.line, f"step number: expected {self._count}, got {_short(row['i'])}")
        self._count += 1
        return text, row

    def _finish(self, row: dict[str, Any]) -> None:
        self.end_line = self.line
        steps, digest = row.get("steps"), row.get("digest")
        if type(steps) is not int or steps != self._count or not isinstance(digest, str):
            raise TraceError(self.path, self.line, f"end line says {_short(steps)} steps, the file has {self._count}")
        incomplete, events = row.get("incomplete"), row.get("events")
        if incomplete is not None and (not isinstance(incomplete, str) or type(events) is not int or events < 0):
            raise TraceError(self.path, self.line, "end line: \"incomplete\" names a bound and comes with "
                                                   "\"events\", the number of events run")
        if self._next() is not None:
            raise TraceError(self.path, self.line, "lines after the end line")
        self.end = row

    def at_end(self) -> bool:
        """Whether the next line is the end line (read ahead: then `end` is set)."""
        if self.end is None and self._pending is None:
            text = self._next()
            if text is None:
                raise TraceError(self.path, self.line + 1, "the trace ends without its end line (truncated?)")
            row = self._parse(text)
            if row.get("end") is True:
                self._finish(row)
            else:
                self._pending = (text, row)
        return self.end is not None

    def steps(self) -> Iterator[dict[str, Any]]:
        while (step := self.next_step()) is not None:
            yield step[1]


def read_trace(path: str) -> Trace:
    """Parse and validate a whole trace file (tests and small files; `kvsim replay` streams it instead)."""
    with TraceReader(path) as reader:
        steps = list(reader.steps())
        assert reader.end is not None
        return Trace(path, reader.header, steps, reader.end["digest"], reader.end)


def parse_line(path: str, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(path, number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise TraceError(path, number, "nested too deeply: not a kvsim trace line") from None
    except ValueError as exc:  # e.g. an integer longer than Python converts
        raise TraceError(path, number, f"not usable JSON ({_short(str(exc))})") from None
    if not isinstance(row, dict):
        raise TraceError(path, number, f"expected a JSON object, got {_type_name(row)}")
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
    complete: bool = True  # False: a work budget stopped the re-run before the trace's end (nothing proved)
    stopped_by: str | None = None
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {"trace": self.path, "steps": self.steps, "digest": self.digest, "matches": self.matches,
               "complete": self.complete, "stopped_by": self.stopped_by, "warnings": list(self.warnings)}
        if not self.matches:
            out.update({"line": self.line, "expected": self.expected, "got": self.got})
        return out


class Diverged(BaseException):
    """Ends a re-run at its first difference from the stored trace (a BaseException: no model code catches it)."""

    def __init__(self, line: int, expected: Any, got: Any) -> None:
        super().__init__(line)
        self.line, self.expected, self.got = line, expected, got


class StreamComparer:
    """A recorder's `on_step` that compares each fresh step with the next line of a `TraceReader`.

    The stored line is compared as text first (a trace holds canonical JSON), then as data; the first
    difference raises `Diverged`, so a wrong line 3 of a huge file is reported as soon as the re-run
    records its step 1, and memory holds one line. `on_end(end_line)` is called as soon as the line
    after a step is the end line (a replay then bounds the re-run by the events the trace says it ran).
    """

    def __init__(self, reader: TraceReader, on_end: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.reader = reader
        self.on_end = on_end or (lambda end: None)
        self.matched = 0
        self.extra_step: dict[str, Any] | None = None  # a fresh step past the end of the trace

    def __call__(self, fresh: dict[str, Any]) -> None:
        step = self.reader.next_step()
        if step is None:
            self.extra_step = fresh
            raise Diverged(self.reader.end_line, fresh, f"the trace ends after {self.matched} steps")
        text, stored = step
        line = self.reader.line
        if text != dumps(fresh):
            try:
                same = dumps(stored) == dumps(fresh)
            except (RecursionError, ValueError):
                raise TraceError(self.reader.path, line, "nested too deeply: not a kvsim trace line") from None
            if not same:
                raise Diverged(line, fresh, stored)
        self.matched += 1
        if self.reader.at_end():
            self.on_end(self.reader.end or {})


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
