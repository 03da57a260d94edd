"""swa-budget: properties B1–B6, the scheduler invariants and the af7c62e bug report.

* `cases`: the property inputs and the pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `resume`: the named properties;
* `bugs.toml`: the bug report, as data.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry

from . import resume


def register(registry: Registry) -> None:
    registry.add_from(resume)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
