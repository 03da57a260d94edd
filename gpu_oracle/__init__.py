"""Real kernels, and the kernel properties that compare them with the models.

    kvsim.gpu_oracle.backends()       what this machine can run, and why not the rest
    kvsim.gpu_oracle.families()       every kernel family (one folder under kernels/)
    kvsim.gpu_oracle.register(reg)    every family's kernel properties into a registry holding their models

`runtime/` is written once for every kernel: `build` (g++ builds of the CUDA C
sources for the CPU, cached by source hash), `shim` (loading them, moving
arrays in and out), `asan` / `asan_run` (the AddressSanitizer child and its
report), `discovery` (the backends: torch-cpu, cpu-shim, cpu-shim-asan,
torch-cuda, cupy-cuda), `family` (the `Kernel` and `KernelFamily`
descriptors: prepare, reference, torch, shim and cupy entry points, the
backend table, the case document the ASan child runs).

`kernels/<family>/` holds the `.cu` sources and launchers, `backends.py`,
and the family's kernel properties (`properties.py`, declared with
`kvsim.engine.property.kernel_property` and run by `kvsim.engine.runner`
like any property of the model; strategies in `strategies.py`):

* `zero_kv_blocks` (model kv-zeroing): vLLM KVBlockZeroer, d6af803.
* `mla_context` (model mla-chunks): `gather_mla_context` and
  `merge_attn_states`, vLLM b38e111d, and the prefill end to end against
  torch SDPA.
* `staging` (model pd-staging): SGLang PD head-slice gather and scatter,
  05c7ebf.

`kvsim oracle` (`kvsim.app.oracle.oracle_report`) runs every kernel property
on every backend it lists; `kvsim check MODEL --backend NAME` runs one.
Importing this package imports neither Hypothesis, torch nor CuPy.
"""

from typing import Any

from .kernels.mla_context.backends import gather_mla_context, merge_attn_states
from .kernels.staging.backends import gather_head_slice, scatter_staging
from .kernels.zero_kv_blocks.backends import zero_kv_blocks
from .runtime.discovery import BACKEND_NAMES, backends
from .runtime.family import Kernel, KernelFamily, families


def register(registry: Any) -> None:
    """Every family's kernel properties, for the families whose model `registry` holds, in model order."""
    order = list(registry.models)
    for family in sorted((f for f in families() if f.model in registry.models), key=lambda f: order.index(f.model)):
        family.register(registry)


__all__ = ["BACKEND_NAMES", "Kernel", "KernelFamily", "backends", "families", "gather_head_slice",
           "gather_mla_context", "merge_attn_states", "register", "scatter_staging", "zero_kv_blocks"]
