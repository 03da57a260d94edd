"""Typed actions, messages and other small records that travel as tagged tuples.

An action type made with `tagged("deliver", "writer", "channel", "message")`
is a tuple subclass whose first element is its tag:

    Deliver = tagged("deliver", "writer", "channel", "message")
    a = Deliver(0, 1, msg)        # == ("deliver", 0, 1, msg); a.writer == 0
    to_jsonable(a)               # ["deliver", 0, 1, [...]]: the tag is the JSON form's first element

So `offset.round` reads as a name, a record compares and hashes as the tuple
it is (explore fingerprints and pinned paths stay as they were), and its JSON
form round-trips: `decode(doc, types)` rebuilds the typed value from the tag.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Iterable, Mapping

# every record type by (defining module, tag, fields): pickling finds the very class again in another
# process (explore's worker processes), so `type(x) is Deliver` holds there too
_TYPES: dict[tuple[str, str, tuple[str, ...]], type["Tagged"]] = {}


class Tagged(tuple):
    """Base of tagged records; see `tagged`."""

    tag: str = ""
    fields: tuple[str, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> "Tagged":
        if not kwargs and len(args) == len(cls.fields):  # the common case: every field positional
            return tuple.__new__(cls, (cls.tag, *args))
        if len(args) > len(cls.fields):
            raise TypeError(f"{cls.__name__} takes {len(cls.fields)} fields {cls.fields}, got {len(args)}")
        values = list(args)
        for name in cls.fields[len(args):]:
            if name not in kwargs:
                raise TypeError(f"{cls.__name__}: missing field {name!r}")
            values.append(kwargs.pop(name))
        if kwargs:
            raise TypeError(f"{cls.__name__}: unknown fields {sorted(kwargs)}")
        return tuple.__new__(cls, (cls.tag, *values))

    _repr_fmt: str = "()"  # "deliver(side=%r, writer=%r, msg=%r)": `tagged` writes it once per type

    def __repr__(self) -> str:
        return self._repr_fmt % self[1:]  # a state's fingerprint is its repr: this runs for every record in it

    def __reduce__(self) -> tuple[Any, ...]:  # pickling (worker processes): the defining module's own class
        cls = type(self)
        return (rebuild, (cls.__module__, cls.tag, cls.fields, tuple(self[1:])))

    def _replace(self, **changes: Any) -> "Tagged":
        return type(self)(*(changes.pop(n, v) for n, v in zip(self.fields, self[1:])))


def tagged(tag: str, *fields: str, name: str | None = None) -> type[Tagged]:
    """A tagged record type: a tuple `(tag, *fields)` with the fields readable by name."""
    namespace: dict[str, Any] = {"tag": tag, "fields": tuple(fields), "__slots__": (),
                                 "_repr_fmt": tag.replace("%", "%%") + "(" + ", ".join(f"{f}=%r" for f in fields) + ")"}
    for index, field_name in enumerate(fields, start=1):
        namespace[field_name] = property(lambda self, i=index: self[i], doc=f"field {field_name!r}")
    cls_name = name or "".join(part.capitalize() for part in tag.replace("-", "_").split("_"))
    namespace["__module__"] = sys._getframe(1).f_globals.get("__name__", __name__)
    cls = type(cls_name, (Tagged,), namespace)
    _TYPES.setdefault((cls.__module__, tag, cls.fields), cls)
    return cls


def rebuild(module: str, tag: str, fields: tuple[str, ...], values: tuple[Any, ...]) -> Tagged:
    """A pickled record, rebuilt as its defining module's type (importing that module if needed)."""
    key = (module, tag, fields)
    if key not in _TYPES:
        importlib.import_module(module)
    return _TYPES[key](*values)


def type_table(types: Iterable[type[Tagged]]) -> dict[str, type[Tagged]]:
    table: dict[str, type[Tagged]] = {}
    for t in types:
        if t.tag in table and table[t.tag] is not t:
            raise ValueError(f"two record types share the tag {t.tag!r}")
        table[t.tag] = t
    return table


def decode(doc: Any, types: Mapping[str, type[Tagged]]) -> Any:
    """The typed value of a JSON form: lists become tuples, a list led by a known tag becomes that record."""
    if isinstance(doc, list):
        items = [decode(x, types) for x in doc]
        if items and isinstance(items[0], str) and items[0] in types:
            record = types[items[0]]
            if len(items) - 1 == len(record.fields):
                return record(*items[1:])
        return tuple(items)
    if isinstance(doc, dict):
        return {k: decode(v, types) for k, v in doc.items()}
    return doc
