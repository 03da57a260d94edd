"""Every GPU path of kvsim in one run, one JSON report (run by scripts/gpu_check.sh).

    python scripts/gpu_check.py --out gpu_check.json [--examples N] [--mib M]

Sections, each {"name", "status": passed | failed | error | skipped, "reason", "seconds", ...}:
  environment      torch / CUDA / CuPy / triton as this machine has them
  oracle           every kernel property of the catalog on torch-cuda and cupy-cuda (our CUDA C
                   through NVRTC, the torch index backends), as `kvsim oracle` runs them
  sdpa_low_precision  mla_prefill_sdpa_oracle_low_precision (float16 and bfloat16 tolerances) on torch-cuda
  triton_native    the release Triton kernels (`kvsim conform` kernel targets) with --device cuda
  zeroing_bandwidth   vLLM's zeroing kernel natively on M MiB of blocks against torch's device-to-device copy
On a machine without CUDA every GPU section is "skipped" with its reason; the script itself succeeds.
Exit code: 0 when nothing failed or errored, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

GPU_BACKENDS = ("torch-cuda", "cupy-cuda")


def cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install -e '.[torch]')"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False: no CUDA device or driver on this machine"
    return None


def environment() -> dict[str, Any]:
    row: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in ("numpy", "torch", "triton", "cupy", "hypothesis"):
        try:
            row[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001  a missing package is a fact of the report
            row[name] = f"absent ({type(exc).__name__})"
    reason = cuda_reason()
    if reason is None:
        import torch

        row["device"] = torch.cuda.get_device_name(0)
        row["cuda"] = torch.version.cuda
    row["cuda_reason"] = reason
    return {"status": "passed", **row}


def oracle(examples: int) -> dict[str, Any]:
    from kvsim.app.catalog import load
    from kvsim.app.oracle import backends, kernel_properties, run_kernel_property

    registry = load()
    rows = backends()
    checks = []
    for prop in kernel_properties(registry):
        for backend in GPU_BACKENDS:
            if backend not in prop.backends:
                continue
            started = time.perf_counter()
            result = run_kernel_property(prop, backend, variant=registry.model(prop.model).variants.fixed,
                                         max_examples=examples, seed=0, rows=rows)
            checks.append({"property": f"{prop.model}:{prop.name}", "backend": backend, "status": result.status,
                           "examples": result.examples, "message": result.message,
                           "seconds": round(time.perf_counter() - started, 3)})
    available = {r["name"]: r for r in rows}
    if not any(available[b]["available"] for b in GPU_BACKENDS):
        reasons = "; ".join(f"{b}: {available[b]['reason']}" for b in GPU_BACKENDS)
        return {"status": "skipped", "reason": reasons, "checks": checks}
    return {"status": _worst(c["status"] for c in checks), "checks": checks,
            "backends": [available[b] for b in GPU_BACKENDS]}


def sdpa_low_precision(examples: int) -> dict[str, Any]:
    from kvsim.app.catalog import load
    from kvsim.app.oracle import run_kernel_property

    registry = load()
    prop = registry.properties[("mla-chunks", "mla_prefill_sdpa_oracle_low_precision")]
    result = run_kernel_property(prop, "torch-cuda", variant=registry.model(prop.model).variants.fixed,
                                 max_examples=examples, seed=0)
    row = {"status": result.status, "examples": result.examples, "message": result.message}
    if result.status == "skipped":
        row["reason"] = result.message
    return row


def triton_native(examples: int) -> dict[str, Any]:
    from kvsim.conform.source import resolve_source
    from kvsim.conform.targets import RunOptions, targets

    reason = cuda_reason()
    names = {"vllm": ("zero-kv-blocks-kernel", "merge-attn-states-triton", "mla-paged-decode"),
             "sglang": ("staging-gather-triton", "staging-gather-torch", "staging-scatter-triton",
                        "staging-scatter-torch")}
    if reason is not None:
        return {"status": "skipped", "reason": reason, "targets": [f"{e}:{n}" for e, ns in names.items() for n in ns]}
    rows = []
    for engine, wanted in names.items():
        source = resolve_source(engine)  # the pinned release, from the cache or the package index
        for target in targets(engine):
            if target.name in wanted:
                result = target.run(source, RunOptions(max_examples=examples, device="cuda"))
                rows.append({"target": f"{engine}:{target.name}", "status": result.status,
                             "compared": result.compared, "seconds": result.seconds,
                             "divergences": result.divergences, "properties": result.properties, "note": result.note})
    status = _worst("passed" if r["status"] == "conforms" else "failed" for r in rows)
    return {"status": status, "targets": rows}


def zeroing_bandwidth(mib: int) -> dict[str, Any]:
    reason = cuda_reason()
    if reason is not None:
        return {"status": "skipped", "reason": reason}
    import torch

    from kvsim.conform.source import resolve_source
    from kvsim.conform.triton_child import load_upstream
    from kvsim.conform.vllm.kernels import UTILS, ZERO_SYMBOLS, vllm_modules

    ns = load_upstream(resolve_source("vllm"), UTILS, ZERO_SYMBOLS, modules=vllm_modules("cuda"))
    page_words, blocks = 4096, max(1, (mib << 20) // (4096 * 4))  # 16 KiB pages, one segment
    buffer = torch.full((blocks * page_words,), 7, dtype=torch.int32, device="cuda")
    zeroer = object.__new__(ns.KVBlockZeroer)
    zeroer.device = torch.device("cuda")
    block = min(1 << (page_words - 1).bit_length(), 1024)
    zeroer._meta = (torch.tensor([buffer.data_ptr()], dtype=torch.uint64, device="cuda"),
                    torch.tensor([page_words], dtype=torch.int64, device="cuda"),
                    torch.tensor([page_words], dtype=torch.int64, device="cuda"), -(-page_words // block), block, 1)
    ids = list(range(blocks))
    zeroer.zero_block_ids(ids)  # compile
    torch.cuda.synchronize()
    ok = bool((buffer == 0).all().item())

    def best(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return min(times)

    nbytes = buffer.numel() * 4
    zero_s = best(lambda: zeroer.zero_block_ids(ids))
    other = torch.empty_like(buffer)
    copy_s = best(lambda: other.copy_(buffer))
    memset_s = best(lambda: buffer.zero_())
    return {"status": "passed" if ok else "failed", "bytes": nbytes, "blocks": blocks,
            "zero_kernel_gb_s": round(nbytes / zero_s / 1e9, 1),
            "d2d_copy_gb_s": round(2 * nbytes / copy_s / 1e9, 1),  # a copy reads and writes every byte
            "torch_zero_gb_s": round(nbytes / memset_s / 1e9, 1),
            "note": "zeroing writes each byte once; the copy figure counts read + write bytes",
            "all_zero": ok}


def _worst(statuses: Any) -> str:
    seen = set(statuses)
    for s in ("error", "failed", "passed"):
        if s in seen:
            return s
    return "skipped"


SECTIONS: list[tuple[str, Callable[[argparse.Namespace], dict[str, Any]]]] = [
    ("environment", lambda a: environment()),
    ("oracle", lambda a: oracle(a.examples)),
    ("sdpa_low_precision", lambda a: sdpa_low_precision(a.examples)),
    ("triton_native", lambda a: triton_native(a.examples)),
    ("zeroing_bandwidth", lambda a: zeroing_bandwidth(a.mib)),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check.json"))
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--only", default="", help="comma-separated section names")
    args = parser.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "sections": {}}
    for name, run in SECTIONS:
        if only and name not in only:
            continue
        started = time.perf_counter()
        try:
            row = run(args)
        except Exception as exc:  # noqa: BLE001  one broken path must not hide the others
            row = {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        row["seconds"] = round(time.perf_counter() - started, 3)
        report["sections"][name] = row
        print(f"{name}: {row['status']}{' (' + row['reason'] + ')' if row.get('reason') else ''} "
              f"[{row['seconds']} s]", flush=True)
    report["status"] = _worst(r["status"] for n, r in report["sections"].items() if n != "environment")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"report: {args.out} ({report['status']})")
    return 1 if report["status"] in ("failed", "error") else 0


if __name__ == "__main__":
    sys.exit(main())
