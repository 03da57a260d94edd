"""kv-cache-manager and kv-cache-manager-pd (the package's two systems): each transition system's stateful
property, and the bug reports.

* `system`: the block pool's invariants on Hypothesis-chosen request sequences (kv-cache-manager).
* `scheduler`: the P/D life cycle's invariants (kv-cache-manager-pd).
* `bugs.toml`: the bug reports, as data (#48195 on kv-cache-manager; #50297 and #55055 on kv-cache-manager-pd).
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry

from . import scheduler, system


def register(registry: Registry) -> None:
    registry.add_from(system, scheduler)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
