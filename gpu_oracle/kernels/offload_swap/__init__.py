"""The batched GPU<->CPU swap of vLLM's KV offload worker (0.33.0 `cpu/gpu_worker.py`), checked against model
`kv-offload` (its worker-side mapping, `kvsim.models.kv_offload.mapping`).

`offload_swap.cu` + `offload_swap_launch.cpp`; `backends` (the kernel on every backend), `properties` (the
differential, the round trip through the kernel and the ASan check of a planted skip_count), `strategies`,
`cases`.
"""

from ...runtime.family import KernelFamily
from .backends import KERNEL, run_document

FAMILY = KernelFamily(name="offload_swap", model="kv-offload", package=__name__, kernels=(KERNEL,),
                      run_document=run_document)
register = FAMILY.register
