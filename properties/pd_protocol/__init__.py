"""pd-protocol: properties P1–P8 of the PD control protocol (SGLang PR #35281) and its bug reports.

* `cases`: the pinned inputs (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `layout`: P6, Mori's destination descriptors (area 4);
* `frames`: P3 and P4, the bootstrap and decode threads over byte frames (areas 1 and 3);
* `protocol`: the transition system's invariants as a stateful property;
* `bugs.toml`: the bug reports, as data.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry

from . import frames, layout, protocol


def register(registry: Registry) -> None:
    registry.add_from(layout, frames, protocol)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
