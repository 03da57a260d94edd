"""FlashInfer's base-2 `merge_state` as a CUDA C kernel, checked against model `mla-backends`.

`merge_state.cu` with its launcher; `backends` (every backend), `properties` (the differential against the
model's `merge_state`, which catches the `merge_nan_4051` variant, and the agreement with the natural-log
`merge_attn_states` kernel of `mla_context` after converting the LSE base), `strategies`.
"""

from ...runtime.family import KernelFamily
from .backends import KERNEL, run_document

FAMILY = KernelFamily(name="merge_state", model="mla-backends", package=__name__, kernels=(KERNEL,),
                      run_document=run_document)
register = FAMILY.register
