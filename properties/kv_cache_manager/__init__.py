"""kv-cache-manager: the transition system's stateful property (the block pool's invariants on Hypothesis-chosen
request sequences). No bug reports yet: this slice has no pre-fix variant (`models/kv_cache_manager/variants.py`).

* `system`: the named property.
"""

from kvsim.engine.registry import Registry

from . import system


def register(registry: Registry) -> None:
    registry.add_from(system)
