"""kvsim: a deterministic simulator and property-based verifier for KV-cache state machines."""

from .engine.errors import ConfigError, KvsimError, PropertyViolation, TraceError

__version__ = "0.1.0"
__all__ = ["ConfigError", "KvsimError", "PropertyViolation", "TraceError", "__version__"]
