"""The KV block zeroing kernel of vLLM's `KVBlockZeroer` (d6af803), checked against model `kv-zeroing`.

`zero_kv_blocks.cu` + `zero_kv_blocks_launch.cpp`; `backends` (the kernel on
every backend), `properties` (its kernel properties, registered into the
kv-zeroing catalog by `register(registry)`), `strategies` (their cases).
"""

from ...runtime.family import KernelFamily
from .backends import KERNEL, run_document

FAMILY = KernelFamily(name="zero_kv_blocks", model="kv-zeroing", package=__name__, kernels=(KERNEL,),
                      run_document=run_document)
register = FAMILY.register
