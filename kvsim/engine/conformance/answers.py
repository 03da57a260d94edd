"""What a call of the code under test can give besides a value: a raise, or no return at all.

`capture(fn, *args, seconds=...)` calls `fn` under the per-call deadline and returns its value, a `Raised`
(the exception's type and message, and where it was raised: the upstream file and line when the raise was in
the code under test, else the adapter line that read its answer) or a `DidNotReturn`. Each is an answer like
any other, compared with the model's, so a raise, a wrong type or a hang is a divergence with its input, never
an error of kvsim. `Refused` is the model's own refusal of an input (a ConfigError), which an adapter's
comparison may declare equal to a raise of upstream (`compare.Exact(refusals=...)`).

Where a raise was: the loader of the upstream code registers, for each file it executes, how that file's lines
map to the upstream file's (`register_lines`); `where` walks the traceback for the innermost such frame.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable

from .deadline import CallTimeout, within

# executed file -> (the upstream file it stands for, a map of one of its line numbers to "upstream/path.py:line", None
# where the line is not upstream's)
_LINES: dict[str, tuple[str, Callable[[int], str | None]]] = {}


def register_lines(filename: str, file: str, mapper: Callable[[int], str | None] | None = None) -> None:
    """`filename` was executed from the upstream `file` (a path like "vllm/v1/core/block_pool.py"): `mapper` maps
    its lines to that file's ("file:line"); without one, each line is the same line of `file`."""
    _LINES[filename] = (file, mapper or (lambda line: f"{file}:{line}"))


def registered(filename: str) -> bool:
    """Whether `filename` is a file of the code under test (one the loader executed)."""
    return filename in _LINES


def upstream_file(filename: str) -> str | None:
    """The upstream file `filename` was executed from (None: not a file of the code under test)."""
    entry = _LINES.get(filename)
    return entry[0] if entry is not None else None


def upstream_line(filename: str, line: int) -> str | None:
    entry = _LINES.get(filename)
    return entry[1](line) if entry is not None else None


@dataclass(frozen=True)
class Raised:
    """The code under test raised (`origin` "upstream"), or returned what the adapter could not read
    (`origin` "answer": a wrong type or shape; `where` is then the adapter's line)."""

    type: str
    message: str
    where: str
    origin: str = "upstream"

    def __str__(self) -> str:
        what = "raised" if self.origin == "upstream" else "returned an answer the adapter cannot read:"
        return f"{what} {self.type}: {self.message} ({self.where})"

    def __canon__(self) -> dict[str, str]:
        return {"raised": self.type, "message": self.message, "where": self.where, "origin": self.origin}


@dataclass(frozen=True)
class DidNotReturn:
    """The call was stopped: it ran past its deadline (`seconds`), or grew past its memory bound (`reason`)."""

    seconds: float
    reason: str = ""

    def __str__(self) -> str:
        return self.reason or f"did not return within {self.seconds:g} s"

    def __canon__(self) -> dict[str, Any]:
        return {"did_not_return": str(self)}


@dataclass(frozen=True)
class Refused:
    """The model refuses the input (its ConfigError's message)."""

    message: str

    def __str__(self) -> str:
        return f"refuses: {self.message}"

    def __canon__(self) -> dict[str, str]:
        return {"refuses": self.message}


FAILED = (Raised, DidNotReturn)


class Answered(Exception):
    """Raised where the answer of the code under test was made elsewhere (a kernel child reports a raise or a
    hang): `capture` returns `answer` as it is."""

    def __init__(self, answer: Any) -> None:
        super().__init__(str(answer))
        self.answer = answer


def where(tb: TracebackType | None) -> tuple[str, str]:
    """("upstream" | "answer", "file:line") of the innermost frame of the code under test, else of the
    innermost frame at all."""
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        found = upstream_line(frame.filename, frame.lineno or 0)
        if found is not None:
            return "upstream", found
    if frames:
        last = frames[-1]
        return "answer", f"{_short(last.filename)}:{last.lineno}"
    return "answer", "?"


def _short(filename: str) -> str:
    marker = "/kvsim/"
    return "kvsim/" + filename.rsplit(marker, 1)[1] if marker in filename else filename


def capture(fn: Callable[..., Any], *args: Any, seconds: float | None = None,
            passthrough: tuple[type[BaseException], ...] = (), **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`'s value, or the `Raised` / `DidNotReturn` it came to (KeyboardInterrupt, the
    command's own budget and the `passthrough` exceptions, such as Hypothesis' rejection of an input, pass)."""
    try:
        with within(seconds):
            return fn(*args, **kwargs)
    except CallTimeout as exc:
        return DidNotReturn(exc.seconds, exc.reason)
    except Answered as exc:
        return exc.answer
    except passthrough:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the code under test raises is its answer
        origin, place = where(exc.__traceback__)
        return Raised(type(exc).__name__, _message(exc), place, origin)


def _message(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
