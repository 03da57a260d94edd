#!/usr/bin/env bash
# kvsim's one GPU check: every CUDA path in a few minutes, one JSON report.
#
#   scripts/gpu_check.sh [REPORT.json]        (default: $OUT/gpu_check.json, else ./gpu_check.json)
#
# Runs (scripts/gpu_check.py): the kernel properties of our CUDA C on torch-cuda and cupy-cuda, the
# bf16/fp16 SDPA tolerances on torch-cuda, the release Triton kernels natively (kvsim conform's kernel
# targets with --device cuda), and vLLM's zeroing kernel bandwidth against device-to-device copy.
# On a machine without CUDA each of those is reported "skipped" with its reason (exit 0).
#
# Environment: KVSIM_GPU_CHECK_INSTALL=1 first runs `pip install -e '.[test,torch,gpu]'` (the only
# install this script ever does; it needs the package index and nothing else). PYTHON picks the
# interpreter (default: .venv/bin/python when present, else python3). GPU_CHECK_EXAMPLES (25) and
# GPU_CHECK_MIB (1024) size the run. Exit code: 0 unless a path failed or errored.
set -euo pipefail
cd "$(dirname "$0")/.."
report="${1:-${OUT:-.}/gpu_check.json}"
if [[ -n "${PYTHON:-}" ]]; then py="$PYTHON"
elif [[ -x .venv/bin/python ]]; then py=.venv/bin/python
else py=python3; fi
if [[ "${KVSIM_GPU_CHECK_INSTALL:-0}" == 1 ]]; then
  "$py" -m pip install -q -e '.[test,torch,gpu]'
fi
exec "$py" scripts/gpu_check.py --out "$report" --examples "${GPU_CHECK_EXAMPLES:-25}" --mib "${GPU_CHECK_MIB:-1024}"
