"""Variants as records of named behaviour flags.

A model's variants are instances of one frozen dataclass deriving from
`Variant`: a name plus one boolean (or small value) per upstream change,
read at exactly the line that change touched:

    @dataclass(frozen=True)
    class MlaVariant(Variant):
        per_request_plan: bool      # b38e111d: ContextChunk plans instead of uniform batch columns
        aligned_workspace: bool     # b38e111d: the workspace lower bound

    VARIANTS = VariantTable(MlaVariant("fixed", True, True), MlaVariant("pre_b38e111d", False, False))

The name is resolved to its record once, at the boundary (`VariantTable.resolve`,
called by the registry for the command line and the runner); inside a model a
variant is never a string, so no comparison with a name can send an unknown
variant down the wrong path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generic, Iterator, Mapping, TypeVar

from .errors import ConfigError


@dataclass(frozen=True)
class Variant:
    """Base of a model's variant record; subclasses add the flags."""

    name: str

    def __str__(self) -> str:
        return self.name

    def __canon__(self) -> str:  # JSON, traces and replay lines carry the name
        return self.name

    def flags(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}


V = TypeVar("V", bound=Variant)


class VariantTable(Mapping[str, V], Generic[V]):
    """The variants of one model, `fixed` first, looked up by name."""

    def __init__(self, *variants: V) -> None:
        if not variants or variants[0].name != "fixed":
            raise ValueError("a variant table starts with the `fixed` variant")
        kinds = {type(v) for v in variants}
        if len(kinds) != 1:
            raise ValueError(f"variants of one model share one record type, got {sorted(k.__name__ for k in kinds)}")
        self._by_name = {v.name: v for v in variants}
        if len(self._by_name) != len(variants):
            raise ValueError("variant names must be unique")

    @property
    def fixed(self) -> V:
        return next(iter(self._by_name.values()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def resolve(self, variant: str | V, field: str = "variant") -> V:
        """The record for a name (or the record itself, if it is one of this table's); ConfigError otherwise."""
        if isinstance(variant, str) and variant in self._by_name:
            return self._by_name[variant]
        if isinstance(variant, Variant) and self._by_name.get(variant.name) == variant:
            return variant  # type: ignore[return-value]
        raise ConfigError(field, f"one of {', '.join(self._by_name)}", str(variant))

    def __getitem__(self, name: str) -> V:
        return self.resolve(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)
