"""kv-zeroing: properties 2.4.1–2.4.6, 2.4.8, 2.4.9 and the d6af803 bug report.

* `cases`: the property input `ZeroingCase` and the pinned upstream cases (no Hypothesis);
* `strategies`: the Hypothesis strategies, imported only when a property runs (the layout
  families are public: the kernel oracle draws the same geometries);
* `zeroer`: the named properties;
* `bugs.toml`: the bug report, as data.
"""

from kvsim.engine.bugfile import bug_file, load_bugs
from kvsim.engine.registry import Registry
from kvsim.gpu_oracle.kernels import zero_kv_blocks

from . import zeroer


def register(registry: Registry) -> None:
    registry.add_from(zeroer)
    zero_kv_blocks.register(registry)  # the kernel properties of this model (gpu_oracle/kernels/zero_kv_blocks)
    load_bugs(registry, bug_file(__file__))  # bugs.toml: the bug reports, as data
