"""Typed model parameters, settable from the command line as `--param NAME=VALUE`."""

from __future__ import annotations

import dataclasses
import math
import shlex
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import ConfigError


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: str  # "int", "ints" (comma-separated list of ints), "float" or "str"
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    def expected(self) -> str:
        kind = {"int": "an integer", "ints": "a comma-separated list of integers",
                "float": "a number", "str": "a string"}[self.kind]
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {self.minimum}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum}")
        return kind + (f" ({' and '.join(bounds)}{' each' if self.kind == 'ints' else ''})" if bounds else "")

    def parse(self, text: str) -> Any:
        field = f"param {self.name}"
        try:
            if self.kind != "str" and not text.isascii():  # `int("３")` is 3: only ASCII digits make a number here
                raise ValueError(text)
            if self.kind == "int":
                value: Any = int(text)
            elif self.kind == "float":
                value = float(text)
                if not math.isfinite(value):
                    raise ValueError(text)
            elif self.kind == "ints":
                value = tuple(int(x) for x in text.split(",")) if text.strip() else ()
            else:
                value = text
        except ValueError:
            raise ConfigError(field, self.expected(), text) from None
        return self.validate(value)

    def validate(self, value: Any) -> Any:
        """A typed value (from a trace header, a test or a saved counterexample): type, finiteness, range."""
        field = f"param {self.name}"
        items = value if self.kind == "ints" else (value,)
        if self.kind == "ints" and not isinstance(value, tuple):
            raise ConfigError(field, self.expected(), value)
        for item in items:
            if not _of_kind(item, self.kind):
                raise ConfigError(field, self.expected(), value)
            if self.choices and item not in self.choices:
                raise ConfigError(field, self.expected(), value)
            if self.minimum is not None and item < self.minimum:
                raise ConfigError(field, self.expected(), value)
            if self.maximum is not None and item > self.maximum:
                raise ConfigError(field, self.expected(), value)
        return value


def _of_kind(item: Any, kind: str) -> bool:
    if kind in ("int", "ints"):
        return isinstance(item, int) and not isinstance(item, bool)
    if kind == "float":
        return isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item)
    return isinstance(item, str)


def resolve(specs: Iterable[ParamSpec], given: Iterable[str] | Mapping[str, Any] = ()) -> dict[str, Any]:
    """Defaults overlaid with `NAME=VALUE` strings (CLI) or a mapping of typed values (traces, tests)."""
    by_name = {s.name: s for s in specs}
    values = {s.name: s.default for s in by_name.values()}
    items: Iterable[tuple[str, Any]]
    if isinstance(given, Mapping):
        items = given.items()
    else:
        pairs = []
        for text in given:
            if "=" not in text:
                raise ConfigError("param", "NAME=VALUE", text)
            name, _, raw = text.partition("=")
            pairs.append((name.strip(), raw.strip()))
        items = pairs
    for name, raw in items:
        if name not in by_name:
            known = ", ".join(by_name) or "(this model takes no parameters)"
            raise ConfigError("param", f"one of {known}", name)
        spec = by_name[name]
        if isinstance(raw, str) and spec.kind != "str":
            values[name] = spec.parse(raw)
        else:
            values[name] = spec.validate(tuple(raw) if spec.kind == "ints" and isinstance(raw, list) else raw)
    return values


# -- parameters declared once, on the config dataclass a model builds from them ----------------------

_PARAM_KEY = "kvsim.param"


@dataclass(frozen=True)
class _ParamMeta:
    doc: str
    minimum: float | None
    maximum: float | None
    choices: tuple[str, ...]


def param_args(values: Mapping[str, Any]) -> str:
    """The `--param NAME=VALUE` arguments that give `values` back through `resolve` (shell-quoted, in order; a
    list of integers as its comma-separated form)."""
    return " ".join(f"--param {shlex.quote(f'{k}={_arg(v)}')}" for k, v in values.items())


def _arg(value: Any) -> Any:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def param(default: Any, doc: str, *, minimum: float | None = None, maximum: float | None = None,
          choices: tuple[str, ...] = ()) -> Any:
    """A config dataclass field that is also a `--param`: its default, documentation and range in one place.

        @dataclass(frozen=True)
        class ProtocolConfig:
            rooms: int = param(1, "requests sharing the prefill/decode pair", minimum=1, maximum=3)
    """
    return dataclasses.field(default=default, metadata={_PARAM_KEY: _ParamMeta(doc, minimum, maximum, choices)})


def _kind(annotation: Any, name: str) -> str:
    if annotation is bool or annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if annotation is str:
        return "str"
    if typing.get_origin(annotation) is tuple and typing.get_args(annotation)[:1] == (int,):
        return "ints"
    raise TypeError(f"parameter {name}: no command-line form for type {annotation!r}")


def params_of(config: type) -> tuple[ParamSpec, ...]:
    """The `--param` specs of a config dataclass: every field declared with `param()`, in field order.

    A `bool` field is the integer parameter 0 or 1 (`config_from` turns it back into a bool).
    """
    hints = typing.get_type_hints(config)
    specs = []
    for f in dataclasses.fields(config):
        meta = f.metadata.get(_PARAM_KEY)
        if meta is None:
            continue
        hint = hints[f.name]
        is_bool = hint is bool
        default = int(f.default) if is_bool else f.default
        specs.append(ParamSpec(f.name, _kind(hint, f.name), default, meta.doc,
                               minimum=0 if is_bool else meta.minimum, maximum=1 if is_bool else meta.maximum,
                               choices=meta.choices))
    return tuple(specs)


def config_from(config: type, values: Mapping[str, Any]) -> Any:
    """An instance of the config dataclass from resolved parameter values (bool fields from 0/1)."""
    hints = typing.get_type_hints(config)
    kwargs = {}
    for f in dataclasses.fields(config):
        if f.name in values:
            kwargs[f.name] = bool(values[f.name]) if hints[f.name] is bool else values[f.name]
    return config(**kwargs)
