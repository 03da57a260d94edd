"""mla-chunks: the planner, metadata, DCP and numeric properties and the four bug reports.

* `cases`: the property inputs and the pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `plan`: planner and metadata properties (and their `check_*` functions);
* `dcp`: DCP coverage and `reorg_kvcache` properties;
* `numeric`: chunked context against full attention, in float64;
* `bugs.toml`: the bug reports, as data.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels import mla_context

from . import dcp, numeric, plan


def register(registry: Registry) -> None:
    registry.add_from(dcp, numeric, plan)
    mla_context.register(registry)  # the kernel properties of this model (gpu_oracle/kernels/mla_context)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
