"""kvsim: a deterministic simulator and property-based verifier for KV-cache state machines."""

__version__ = "0.1.0"

from .engine.errors import ConfigError, KvsimError, PropertyViolation, TraceError  # noqa: E402

__all__ = ["ConfigError", "KvsimError", "PropertyViolation", "TraceError", "__version__"]
