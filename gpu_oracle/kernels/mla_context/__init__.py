"""The MLA chunked-context kernels of vLLM b38e111d, checked against model `mla-chunks`.

`gather_mla_context.cu` and `merge_attn_states.cu` with their launchers; `backends`
(both kernels on every backend), `properties` (the kernel differentials and the ASan
check), `prefill_properties` (the prefill end to end against torch SDPA), `strategies`.
"""

from ...runtime.family import KernelFamily
from .backends import GATHER_KERNEL, MERGE_KERNEL, run_document

FAMILY = KernelFamily(name="mla_context", model="mla-chunks", package=__name__, kernels=(GATHER_KERNEL, MERGE_KERNEL),
                      run_document=run_document, properties=("properties", "prefill_properties"))
register = FAMILY.register
