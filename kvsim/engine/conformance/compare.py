"""How a target's two answers are compared, and how a difference is shown.

Answers are data with field names (dicts, dataclasses, named tuples, lists, numbers, numpy arrays), so a
difference is a path: `plans[2].seq_lens[0]: model 16, upstream 15`, or for an array the first element that
differs and how many do: `memory[1042]: model 0, upstream 171 (12 of 4096 elements differ)`. `Exact` compares
every field exactly (arrays: the same shape, dtype and bytes); `Close` compares floats and float arrays within a
tolerance, NaN equal to NaN, an infinity only to itself. Either may declare which raises of the code under
test equal the model's refusal of an input (`refusals`: exception type names, the convention the target's
documentation states), so "upstream asserts where the model refuses" is not a divergence.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any

from ..canon import canonical_json, to_jsonable
from .answers import DidNotReturn, Raised, Refused


@dataclass(frozen=True)
class Difference:
    path: str  # "" for the whole answer
    model: Any
    upstream: Any
    detail: str = ""

    def line(self, width: int = 100) -> str:
        at = self.path or "the answer"
        extra = f" ({self.detail})" if self.detail else ""
        return f"{at}: model {render(self.model, width)}, upstream {render(self.upstream, width)}{extra}"


@dataclass(frozen=True)
class Exact:
    """Equal field by field; `refusals`: upstream raise types that equal the model's `Refused`."""

    refusals: tuple[str, ...] = ()

    def difference(self, model: Any, upstream: Any) -> Difference | None:
        if isinstance(model, (Refused, Raised, DidNotReturn)) or isinstance(upstream, (Raised, DidNotReturn, Refused)):
            if isinstance(model, Refused) and isinstance(upstream, Raised) and upstream.origin == "upstream" \
                    and upstream.type in self.refusals:
                return None
            if type(model) is type(upstream) and to_jsonable(model) == to_jsonable(upstream) \
                    and not isinstance(model, DidNotReturn):
                return None  # both raised alike (a lockstep of two releases)
            return Difference("", model, upstream)
        return self._walk("", model, upstream)

    # -- the walk ---------------------------------------------------------------------------------------

    def _walk(self, path: str, a: Any, b: Any) -> Difference | None:
        ta, tb = type(a), type(b)
        if ta is tb and ta in _PLAIN and a == b:
            return None  # equal values of one plain type are equal under every comparison (a NaN goes on below)
        if not (ta in _CONTAINERS and tb in _CONTAINERS) and (_is_array(a) or _is_array(b)):
            return self._arrays(path, a, b)
        a = a if ta in _CONTAINERS else _fields(a)
        b = b if tb in _CONTAINERS else _fields(b)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in list(a) + [k for k in b if k not in a]:
                if key not in a or key not in b:
                    return Difference(_join(path, key), a.get(key, "(absent)"), b.get(key, "(absent)"))
                found = self._walk(_join(path, key), a[key], b[key])
                if found is not None:
                    return found
            return None
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            for i, (x, y) in enumerate(zip(a, b)):
                found = self._walk(f"{path}[{i}]", x, y)
                if found is not None:
                    return found
            if len(a) != len(b):
                return Difference(f"{path} (length)" if path else "length", len(a), len(b))
            return None
        if _number(a) and _number(b):
            same_kind = isinstance(a, float) == isinstance(b, float)
            return None if same_kind and self.close(float(a), float(b)) else Difference(path, a, b)
        ja, jb = to_jsonable(a), to_jsonable(b)
        return None if ja == jb and _kind(a) == _kind(b) else Difference(path, a, b)

    def close(self, a: float, b: float) -> bool:
        return a == b or (math.isnan(a) and math.isnan(b))

    def _arrays(self, path: str, a: Any, b: Any) -> Difference | None:
        import numpy as np

        if not (_is_array(a) and _is_array(b)):
            return Difference(path, _kind(a), _kind(b), "an array on one side only")
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return Difference(f"{path} (shape)" if path else "shape", list(a.shape), list(b.shape))
        if a.dtype != b.dtype:
            return Difference(f"{path} (dtype)" if path else "dtype", str(a.dtype), str(b.dtype))
        bad = self._unequal(a, b)
        if not bad.any():
            return None
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        index = ", ".join(map(str, where))
        return Difference(f"{path}[{index}]", a[where].item(), b[where].item(),
                          f"{int(bad.sum())} of {bad.size} elements differ")

    def _unequal(self, a: Any, b: Any) -> Any:
        import numpy as np

        if a.dtype.kind == "f":
            return ~((a == b) | (np.isnan(a) & np.isnan(b)))
        return a != b


@dataclass(frozen=True)
class Close(Exact):
    """Floats within `rtol` / `atol` (NaN equals NaN, infinities equal only themselves); the rest exact."""

    rtol: float = 1e-5
    atol: float = 1e-6

    def close(self, a: float, b: float) -> bool:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= self.atol + self.rtol * abs(b)

    def _unequal(self, a: Any, b: Any) -> Any:
        import numpy as np

        if a.dtype.kind != "f":
            return a != b
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(a64) & np.isfinite(b64)
        near = np.zeros(a.shape, dtype=bool)
        near[finite] = np.abs(a64[finite] - b64[finite]) <= self.atol + self.rtol * np.abs(b64[finite])
        same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        return ~(near | same)


EXACT = Exact()
# types whose values the walk compares at once when equal, and containers it walks without asking for fields
# (a sweep compares tens of thousands of answers: the general path was half of such a target's time)
_PLAIN = frozenset((int, float, str, bool, type(None)))
_CONTAINERS = frozenset((dict, list))


def _is_array(value: Any) -> bool:
    return hasattr(value, "dtype") and hasattr(value, "shape") and getattr(value, "ndim", 0) > 0


def _fields(value: Any) -> Any:
    """One level of a record as a dict of its fields (a value naming its own JSON form keeps that)."""
    if hasattr(type(value), "__canon__"):
        return value.__canon__()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: getattr(value, name) for name in value._fields}
    return value


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, enum.Enum):
        return "enum"
    if value is None:
        return "None"
    return "number" if _number(value) else type(value).__name__ if isinstance(value, (str, list, dict)) else "other"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, (bool, enum.Enum)) or (
        hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0 and getattr(value.dtype, "kind", "") in "iuf")


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def render(value: Any, width: int = 100) -> str:
    """One readable line: the answer's JSON form (field names kept), cut at `width` with its length said."""
    if isinstance(value, (Raised, DidNotReturn, Refused)):
        text = str(value)
    elif isinstance(value, str):
        text = value
    elif _is_array(value):
        text = f"array{list(value.shape)} {value.dtype}"
    else:
        text = canonical_json(value)
    return text if len(text) <= width else f"{text[: width - 20]}... ({len(text)} chars)"
