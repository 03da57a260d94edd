"""Real kernels and the differential checks that compare them with `models/`.

    gpu_oracle.backends()        what this machine can run, and why not the rest
    gpu_oracle.oracle_report()   every registered check on every available backend

Kernels: `kernels/zero_kv_blocks.cu` (vLLM KVBlockZeroer, d6af803), run by
CuPy on a GPU and by g++ through `kernels/cuda_cpu_shim.h` on the CPU, with
and without AddressSanitizer; a torch implementation runs on CPU and CUDA.
Importing this package registers the checks; it imports neither torch nor
CuPy until a backend is used.
"""

from . import zeroing_checks  # noqa: F401  (registers the zeroing checks)
from .discovery import BACKEND_NAMES, backends
from .checks import CHECKS, CheckOutcome, OracleCheck, oracle_check, oracle_report, run_check
from .zeroing import zero_kv_blocks

__all__ = ["BACKEND_NAMES", "CHECKS", "CheckOutcome", "OracleCheck", "backends", "oracle_check", "oracle_report",
           "run_check", "zero_kv_blocks"]
