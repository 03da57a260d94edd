"""radix-cache and radix-cache-swa (the package's two systems): each transition system's stateful property, and
the bug reports.

* `system`: the radix cache's and the paged allocator's invariants (radix-cache).
* `swa`: the unified cache's SWA component (radix-cache-swa).
* `bugs.toml`: the bug reports, as data (#28161 on radix-cache-swa).
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry

from . import swa, system


def register(registry: Registry) -> None:
    registry.add_from(system, swa)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
