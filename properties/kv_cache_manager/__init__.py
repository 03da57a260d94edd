"""kv-cache-manager: the transition system's stateful property (the block pool's invariants on Hypothesis-chosen
request sequences) and the #48195 bug report (`bugs.toml`: the connector's local hit as the maximum of the
per-group hits, `pre_48195`).

* `system`: the named property.
* `bugs.toml`: the bug report, as data.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry

from . import system


def register(registry: Registry) -> None:
    registry.add_from(system)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
