"""mla-backends: merge algebra, metadata, selection and lifecycle properties, and the bug reports.

* `cases`: the property inputs and the pinned cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs;
* `merge`: the base-2 merge algebra, chunked attention against full attention, paged MLA against torch SDPA;
* `metadata`: conversions, round trips, validation, dual forms;
* `selection`: auto orders, capabilities, typed fallback, run-input representations, the run contract;
* `bugs`: the lifecycle's stateful property (the bug reports are data, in `bugs.toml`);
* the kernel properties of `gpu_oracle/kernels/merge_state` (FlashInfer's base-2 merge as CUDA C).
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels import merge_state

from . import bugs, merge, metadata, selection


def register(registry: Registry) -> None:
    registry.add_from(merge, metadata, selection, bugs)
    merge_state.register(registry)  # the kernel properties of this model (gpu_oracle/kernels/merge_state)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
