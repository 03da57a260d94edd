"""The three errors kvsim raises on purpose.

Each carries a message written for the person who has to act on it: a
`ConfigError` names the field, the expected value and the value received; a
`PropertyViolation` names the quantity, the expected relation and what was
observed; a `TraceError` names the trace line that could not be used.
"""

from __future__ import annotations

from typing import Any, Mapping


class KvsimError(Exception):
    """Base class of the errors kvsim reports to its user (CLI exit 2 or 1)."""


class ConfigError(KvsimError, ValueError):
    """Bad input: an unknown name, an out-of-range parameter, a malformed spec."""

    def __init__(self, field: str, expected: str, received: Any, hint: str = "") -> None:
        self.field = field
        self.expected = expected
        self.received = received
        self.hint = hint
        message = f"{field}: expected {expected}, got {received!r}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)

    def named(self, names: Mapping[str, str]) -> ConfigError:
        """This error under the name its reader knows the field by: the engine names its fields (`checkpoint`,
        `workers`), a command line maps them to its flags (`{"checkpoint": "--checkpoint"}`). A field with
        no entry in `names` keeps its name."""
        name = names.get(self.field)
        return self if name is None else ConfigError(name, self.expected, self.received, self.hint)


class PropertyViolation(KvsimError, AssertionError):
    """A named property or invariant does not hold.

    Subclassing AssertionError lets a property be called directly inside any
    pytest test and fail it the usual way.
    """


class TraceError(KvsimError):
    """A trace file cannot be read or replayed: truncated, corrupt or foreign."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")


def require(condition: bool, field: str, expected: str, received: Any) -> None:
    """Raise ConfigError unless `condition` holds; keeps validators one line each."""
    if not condition:
        raise ConfigError(field, expected, received)


def check_int(value: Any, field: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Validate an integer parameter (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, "an integer", value)
    if minimum is not None and value < minimum:
        raise ConfigError(field, f"an integer >= {minimum}", value)
    if maximum is not None and value > maximum:
        raise ConfigError(field, f"an integer <= {maximum}", value)
    return value
