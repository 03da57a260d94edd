"""Real kernels and the differential checks that compare them with `models/`.

    gpu_oracle.backends()        what this machine can run, and why not the rest
    gpu_oracle.oracle_report()   every registered check on every available backend

Kernels: `kernels/zero_kv_blocks.cu` (vLLM KVBlockZeroer, d6af803), run by
CuPy on a GPU and by g++ through `kernels/cuda_cpu_shim.h` on the CPU, with
and without AddressSanitizer; a torch implementation runs on CPU and CUDA.
MLA chunked context (vLLM b38e111d): `kernels/gather_mla_context.cu` and
`kernels/merge_attn_states.cu` on the same backends (`gpu_oracle.mla`), and
torch `scaled_dot_product_attention` as the full-attention oracle of
`models.mla_prefill` (`gpu_oracle.mla_prefill_checks`).
SGLang PD staging (05c7ebf): `kernels/staging_gather_head_slice.cu` and
`kernels/staging_scatter.cu` against `models.pd_staging_copy` (`gpu_oracle.staging`).
Importing this package registers the checks; it imports neither torch nor
CuPy until a backend is used.
"""

from .kernels.zero_kv_blocks import checks as zeroing_checks  # noqa: F401  registers the zeroing checks
from .kernels.mla_context import checks as mla_checks  # noqa: F401,I001  then the MLA checks, in report order
from .kernels.mla_context import prefill_checks as mla_prefill_checks
from .kernels.staging import checks as staging_checks  # noqa: F401,I001  then the PD staging checks
from .runtime.discovery import BACKEND_NAMES, backends
from .runtime.checks import CHECKS, CheckOutcome, OracleCheck, oracle_check, oracle_report, run_check
from .kernels.mla_context.backends import gather_mla_context, merge_attn_states
from .kernels.staging.backends import gather_head_slice, scatter_staging
from .kernels.zero_kv_blocks.backends import zero_kv_blocks

__all__ = ["BACKEND_NAMES", "CHECKS", "CheckOutcome", "OracleCheck", "backends", "gather_head_slice",
           "gather_mla_context", "merge_attn_states", "oracle_check", "oracle_report", "run_check", "scatter_staging",
           "zero_kv_blocks"]
