"""pipelined-transfer: properties of the chunk coordinates and the transition system's bug reports.

* `cases`: the property inputs and pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `chunks`: S4 coverage, token ranges, masking, SWA groups and the projection;
* `gates`: S10, the configuration gates;
* `bugs`: the stateful property (S1-S3, S5-S9, E1, E2); the bug reports of section 1.12 are data, in `bugs.toml`;
* `timing`: the max-plus closed form against its recursion and against the timed simulation.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry

from . import bugs, chunks, gates, timing


def register(registry: Registry) -> None:
    registry.add_from(chunks, gates, bugs, timing)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
