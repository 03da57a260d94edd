"""Typed model parameters, settable from the command line as `--param NAME=VALUE`."""

from __future__ import annotations

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
        field = f"--param {self.name}"
        try:
            if self.kind == "int":
                value: Any = int(text)
            elif self.kind == "float":
                value = float(text)
            elif self.kind == "ints":
                value = tuple(int(x) for x in text.split(",")) if text.strip() else ()
            else:
                value = text
        except ValueError:
            raise ConfigError(field, self.expected(), text) from None
        return self.validate(value)

    def validate(self, value: Any) -> Any:
        field = f"--param {self.name}"
        items = value if self.kind == "ints" else (value,)
        if self.kind == "ints" and not isinstance(value, tuple):
            raise ConfigError(field, self.expected(), value)
        for item in items:
            if self.choices and item not in self.choices:
                raise ConfigError(field, self.expected(), value)
            if self.minimum is not None and item < self.minimum:
                raise ConfigError(field, self.expected(), value)
            if self.maximum is not None and item > self.maximum:
                raise ConfigError(field, self.expected(), value)
        return value


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
                raise ConfigError("--param", "NAME=VALUE", text)
            name, _, raw = text.partition("=")
            pairs.append((name.strip(), raw.strip()))
        items = pairs
    for name, raw in items:
        if name not in by_name:
            known = ", ".join(by_name) or "(this model takes no parameters)"
            raise ConfigError("--param", f"one of {known}", name)
        spec = by_name[name]
        if isinstance(raw, str) and spec.kind != "str":
            values[name] = spec.parse(raw)
        else:
            values[name] = spec.validate(tuple(raw) if spec.kind == "ints" else raw)
    return values
