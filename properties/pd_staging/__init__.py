"""pd-staging: properties of the send plan, head slicing, slot layout, ring, KVPoll status rules, the
end-to-end transfer, and the transition system's stateful property and bug reports.

* `cases`: the property inputs and pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `ring`, `plan`, `status`, `system`, `e2e`: the named properties;
* `bugs.toml`: the bug reports, as data (with the findings SGLang 0.5.23's model turned up).
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels import staging

from . import e2e, plan, ring, status, system


def register(registry: Registry) -> None:
    registry.add_from(ring, plan, status, system, e2e)
    staging.register(registry)  # the kernel properties of this model (gpu_oracle/kernels/staging)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
