"""Canonical JSON: the one encoding used for digests, traces and `--json` output.

Digests must not depend on PYTHONHASHSEED, dict insertion order or the
platform, so everything that is hashed goes through `to_jsonable` and then
`canonical_json` (sorted keys, no whitespace).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import json.encoder
import math
from typing import Any, Callable

from .actions import Tagged


PLAIN = frozenset({type(None), bool, int, str})  # leaves `to_jsonable` keeps as they are (the trace recorder too)
RECORDS: set[type] = set()  # the `Tagged` types seen (a set lookup, not an `isinstance` per record; the trace reads it)


def to_jsonable(value: Any) -> Any:
    """Plain JSON data for any model value: dataclasses, named tuples, enums, numpy scalars."""
    kind = type(value)
    # exact-type fast paths first: this runs once per recorded step and per explored state export
    if kind in PLAIN:
        return value
    # sequences: a plain element is taken as it is, here, instead of by a call per element
    if kind is tuple or kind is list:
        return [v if type(v) in PLAIN else to_jsonable(v) for v in value]
    if kind is dict:
        return {str(k): v if type(v) in PLAIN else to_jsonable(v) for k, v in value.items()}
    if kind in RECORDS or isinstance(value, Tagged):  # actions, messages, effects: the tuple they are, tag first
        RECORDS.add(kind)
        return [v if type(v) in PLAIN else to_jsonable(v) for v in value]
    if hasattr(kind, "__canon__"):  # a value that names its own JSON form (a variant: its name)
        return to_jsonable(value.__canon__())
    if isinstance(value, (bool, int, str)):  # subclasses too: an IntEnum stays its integer, as JSON writes it
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return repr(value)  # "nan", "inf", "-inf": JSON has no literal for them
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: to_jsonable(getattr(value, name)) for name in value._fields}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (frozenset, set)):
        items = [to_jsonable(v) for v in value]
        return sorted(items, key=canonical_json)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return to_jsonable(value.tolist())
    return repr(value)


def canonical_json(value: Any) -> str:
    return dumps(to_jsonable(value))


def dumps(jsonable: Any) -> str:
    """Canonical text of data that is already plain JSON (no second conversion pass)."""
    return _ENCODE(jsonable)


def _encoder() -> Callable[[Any, int], Any]:
    """The canonical encoder, built once: `json.dumps` builds a new encoder on every call, which cost as much
    as the encoding of a trace step line. `encoder(value, 0)` gives the text's pieces: the C encoder's where
    this Python has it (checked on a probe: the same text as the pure-Python one), else the pure-Python
    one's text as one piece; the text is the same either way."""
    plain = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def whole(value: Any, _level: int) -> tuple[str]:
        return (plain.encode(value),)

    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return whole
    try:
        c_encode = make(None, plain.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)
        probe = {"t": 0.1, "data": [1, ["A", -2, None, True]], "s": "\u00e9\n", "f": float("inf"),
                 "d": {"b": 1, "a": 2.5e-300}}
        if "".join(c_encode(probe, 0)) != plain.encode(probe):
            return whole
    except (TypeError, ValueError):  # another C signature: the pure-Python encoder
        return whole
    return c_encode


_encode_pieces = _encoder()  # `"".join(_encode_pieces(value, 0))` is `dumps(value)`
_join = "".join


def encode(value: Any) -> str:
    """`dumps` as one call, for a hot path."""
    return _join(_encode_pieces(value, 0))


_ENCODE = encode


def digest(value: Any, length: int = 64) -> str:
    return hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()[:length]
