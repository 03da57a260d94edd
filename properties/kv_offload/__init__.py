"""kv-offload: properties of the CPU offloading manager (section 3.3), the #52615 rename, the transition
system's stateful property and the #35846 bug report; the worker-side mapping's properties beside.

* `cases`: the property inputs (operation sequences) and pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies (and, star-imported, `mapping_strategies`);
* `manager`, `positions`, `rename`, `system`: the named properties (`positions`: the eviction order a
  position-aware policy promises); `mapping`: the worker mapping's;
* `bugs.toml`: the bug report, as data.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels import offload_swap

from . import manager, mapping, positions, rename, system


def register(registry: Registry) -> None:
    registry.add_from(manager, rename, system, positions)
    registry.add_from(mapping)  # the worker-side GPU <-> CPU mapping (its own module)
    offload_swap.register(registry)  # the batched swap's CUDA C kernel against the mapping
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
