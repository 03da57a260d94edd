"""radix-cache: the transition system's stateful property. No bug reports yet (the seed fixes of this family are
in the unified / SWA caches and the EAGLE accounting, later models)."""

from kvsim.engine.registry import Registry

from . import system


def register(registry: Registry) -> None:
    registry.add_from(system)
