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
import keyword
import sys
from collections import deque
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping

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
        # `itemgetter`: a field read runs in C (a model reads fields in every step and every explored state)
        namespace[field_name] = property(itemgetter(index), doc=f"field {field_name!r}")
    cls_name = name or "".join(part.capitalize() for part in tag.replace("-", "_").split("_"))
    namespace["__module__"] = sys._getframe(1).f_globals.get("__name__", __name__)
    namespace["__new__"] = _make_new(tag, fields)
    cls = type(cls_name, (Tagged,), namespace)
    cls._new = staticmethod(_make_positional(cls))
    _TYPES.setdefault((cls.__module__, tag, cls.fields), cls)
    return cls


_MISSING = object()


def _make_new(tag: str, fields: tuple[str, ...]) -> Callable[..., Tagged]:
    """A record type's own `__new__`, its fields as parameters: a model builds records in every step, and this
    builds one with a call fewer than `Tagged.__new__` and no per-call length checks. A field missing, one too
    many or an unknown one goes to `Tagged.__new__`, which names it."""
    if not all(f.isidentifier() and not keyword.iskeyword(f) and not f.startswith("_") for f in fields):
        return Tagged.__new__  # a field name no parameter can carry: the general constructor
    params = "".join(f"{f}=_MISSING, " for f in fields)
    missing = " or ".join(f"{f} is _MISSING" for f in fields) or "False"
    values = "".join(f"{f}, " for f in fields)
    source = (f"def __new__(_cls_, {params}*_args_, **_kw_):\n"
              f"    if _args_ or _kw_ or {missing}:\n"
              f"        return _general(_cls_, ({values}), _args_, _kw_)\n"
              f"    return _tuple_new(_cls_, (_tag, {values}))\n")
    namespace = {"_MISSING": _MISSING, "_general": _general_new, "_tuple_new": tuple.__new__, "_tag": tag}
    exec(source, namespace)  # noqa: S102 -- the source is built above from identifiers only
    return namespace["__new__"]


def _make_positional(cls: type[Tagged]) -> Callable[..., Tagged]:
    """A record type's `_new(*fields)`: the record of every field given by position, built in one call without the
    class call (`__new__` through `type.__call__` costs as much again as the tuple): for the few places that make
    a record per event (a timed simulation's deliveries, a model's sent messages). A wrong number of fields is
    the plain call's `TypeError`; the class's own constructor is the one that names a field."""
    if cls.__new__ is Tagged.__new__:  # field names no parameter can carry
        return lambda *values: Tagged.__new__(cls, *values)
    params = "".join(f"{f}, " for f in cls.fields)
    source = f"def _new({params}):\n    return _tuple_new(_cls, (_tag, {params}))\n"
    namespace = {"_tuple_new": tuple.__new__, "_cls": cls, "_tag": cls.tag}
    exec(source, namespace)  # noqa: S102 -- the source is built above from identifiers only
    return namespace["_new"]


def _general_new(cls: type[Tagged], values: tuple, extra: tuple, kwargs: dict[str, Any]) -> Tagged:
    """`_make_new`'s other calls, through `Tagged.__new__` (which names a missing, extra or unknown field)."""
    if extra:  # every field given by position, and more
        return Tagged.__new__(cls, *values, *extra, **kwargs)
    return Tagged.__new__(cls, **{f: v for f, v in zip(cls.fields, values) if v is not _MISSING}, **kwargs)


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


class Rules:
    """A model's actions by record type: each type's precondition beside its effect, read by `type(record)`.

    As Hypothesis's `@rule` with `@precondition`: a model declares, once per record type, what enables it
    and what it does,

        RULES = Rules()

        @RULES.rule(Enqueue, when=lambda self, s, a: self._can_enqueue(s, a.room))
        def _enqueue(self, s, a, ...): ...

    and dispatches with `effect, a = RULES.effect(a)` and `RULES.allows(self, s, a)` instead of an
    `if kind == ...` chain over the tag. A plain tuple (a record's untyped form) is found by its tag.
    `Rules(base)` starts from a copy of `base`'s table (a variant states only what it changes).
    """

    def __init__(self, base: "Rules | None" = None) -> None:
        self.effects: dict[type, Callable[..., Any]] = dict(base.effects) if base else {}
        self.preconditions: dict[type, Callable[..., bool]] = dict(base.preconditions) if base else {}
        self.by_tag: dict[str, type] = dict(base.by_tag) if base else {}

    def rule(self, *types: type[Tagged], when: Callable[..., bool] | None = None) -> Callable[[Callable], Callable]:
        """Register the decorated function as the effect of `types`, enabled when `when(system, state, record)`."""
        def register(effect: Callable[..., Any]) -> Callable[..., Any]:
            for t in types:
                self.effects[t] = effect
                self.by_tag[t.tag] = t
                if when is not None:
                    self.preconditions[t] = when
            return effect
        return register

    def typed(self, record: tuple) -> Tagged:
        """`record` as its registered record type (a plain tuple is found by its tag)."""
        if type(record) in self.effects:
            return record  # type: ignore[return-value]
        t = self.by_tag.get(record[0]) if isinstance(record, tuple) and record else None
        if t is None or len(record) - 1 != len(t.fields):
            raise ValueError(f"unknown action {record!r}")
        return t(*record[1:])

    def effect(self, record: tuple) -> tuple[Callable[..., Any], Tagged]:
        """What `record` does (the function registered for its type), and `record` typed."""
        effect = self.effects.get(type(record))
        if effect is None:
            record = self.typed(record)
            effect = self.effects[type(record)]
        return effect, record  # type: ignore[return-value]

    def allows(self, system: Any, state: Any, record: tuple) -> bool:
        """Whether `record` is enabled in `state`: its type's precondition (False for an unknown record)."""
        try:
            record = self.typed(record)
        except ValueError:
            return False
        when = self.preconditions.get(type(record))
        return when is not None and bool(when(system, state, record))

    def disagreements(self, system: Any, limit: int = 1500) -> tuple[set, list[tuple[Any, Any]]]:
        """A check of a model's rules against its `enabled`, breadth-first over at most `limit` reachable states:
        every action `enabled` lists in one of them, and each (state, action) of those where the precondition
        beside the action's effect (`allows`) disagrees with the state's `enabled` list (a model's tests expect
        none: what enables an action is written once, and `enabled` lists it under that same condition)."""
        seen: set = set()
        order: list = []
        actions: set = set()
        frontier = deque(system.initial_states())
        while frontier and len(seen) < limit:
            state = frontier.popleft()
            if state in seen:
                continue
            seen.add(state)
            order.append(state)
            for a in system.enabled(state):
                actions.add(a)
                frontier.append(system.step(state, a))
        wrong = []
        for state in order:
            listed = set(system.enabled(state))
            wrong += [(state, a) for a in actions if self.allows(system, state, a) != (a in listed)]
        return actions, wrong


def table(entries: Mapping[type[Tagged], Callable[..., Any]], default: Callable[..., Any]) -> Callable[..., Any]:
    """A function of a record, chosen by its type (a plain tuple by its tag), else `default`: a dispatch table."""
    by_type = dict(entries)
    by_tag = {t.tag: t for t in entries}

    def dispatch(record: Any, *args: Any) -> Any:
        f = by_type.get(type(record))
        if f is not None:
            return f(record, *args)
        t = by_tag.get(record[0]) if isinstance(record, tuple) and record and isinstance(record[0], str) else None
        if t is None or len(record) - 1 != len(t.fields):
            return default(record, *args)
        return by_type[t](t(*record[1:]), *args)
    return dispatch
