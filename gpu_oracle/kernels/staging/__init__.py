"""SGLang PD staging kernels (05c7ebf), checked against model `pd-staging`.

`staging_gather_head_slice.cu` and `staging_scatter.cu` with their launchers;
`backends` (both kernels on every backend), `properties` (the differentials and
the ASan check of the pre-05c7ebf slot overrun), `strategies`.
"""

from ...runtime.family import KernelFamily
from .backends import GATHER_KERNEL, SCATTER_KERNEL, run_document

FAMILY = KernelFamily(name="staging", model="pd-staging", package=__name__, kernels=(GATHER_KERNEL, SCATTER_KERNEL),
                      run_document=run_document)
register = FAMILY.register
