"""mla-chunks: the planner, metadata, DCP and numeric properties and the four bug reports.

* `cases`: the property inputs and the pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `plan`: planner and metadata properties (and their `check_*` functions);
* `dcp`: DCP coverage and `reorg_kvcache` properties;
* `numeric`: chunked context against full attention, in float64;
* `bugs`: the bug reports.
"""

from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels import mla_context

from . import bugs, dcp, numeric, plan


def register(registry: Registry) -> None:
    registry.add_from(dcp, numeric, plan, bugs)
    mla_context.register(registry)  # the kernel properties of this model (gpu_oracle/kernels/mla_context)
