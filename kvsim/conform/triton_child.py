"""Running real upstream Triton kernels in a child process, on CPU tensors under the Triton interpreter.

`TRITON_INTERPRET=1` is read when triton is imported, and the parent (the
`kvsim conform` process) may have imported triton already, or must not pay for
it; so every real kernel runs in a child:

    python -m kvsim.conform.triton_child --device cpu|cuda

The protocol is line-delimited JSON on the child's stdin/stdout. The first line
names the engine source (`EngineSource` fields); each later line is one request
`{"kernel": NAME, "case": {...}}` and gets one answer `{"ok": true, "result":
{...}}` or `{"ok": false, "error": "...", "config": bool}` (`config`: the
upstream definitions could not be loaded, a ConfigError naming the file and the
symbol). Arrays travel bit-exact as `gpu_oracle.runtime.asan.pack` documents.

The child loads each kernel and its Python launcher from the engine source with
`kvsim.conform.loader.load_definitions`; engine modules the launcher imports but
that kvsim must provide in its place (vLLM's `vllm.triton_utils` re-export of
triton, a platform's fp8 dtype, a stream context) are given as module
replacements (`upstream_modules`): everything else stays an inert stub.
`--device cuda` runs the same launchers natively (no interpreter); a machine
without CUDA answers every request with a skip and its reason.

`KernelChild` is the parent's handle: `with KernelChild(source, "cpu") as child:
child.call("vllm.zero_kv_blocks", case)`. The child-side kernel runners live
beside their targets (`kvsim.conform.vllm.kernels`, `kvsim.conform.sglang.kernels`,
`CHILD_KERNELS`), and import torch and triton only when a request runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from kvsim.engine.errors import ConfigError, KvsimError

from .source import EngineSource

DEVICES = ("cpu", "cuda")
KERNEL_MODULES = ("kvsim.conform.vllm.kernels", "kvsim.conform.vllm.context_merge", "kvsim.conform.vllm.offload_mapping",
                  "kvsim.conform.vllm.mla_decode", "kvsim.conform.sglang.kernels")


class KernelSkipped(KvsimError):
    """The device cannot run the kernels here (no CUDA): a skip with its reason, not a failure."""


class KernelChildError(KvsimError):
    """The child died or answered garbage: the message carries its stderr tail."""


# --- child side ----------------------------------------------------------------------------------------

def load_upstream(source: EngineSource, relpath: str, names: Sequence[str], *,
                  modules: Mapping[str, Any] = {}, extra_globals: Mapping[str, Any] = {}) -> types.SimpleNamespace:
    """The named definitions of `relpath`, with `modules` standing in for those engine modules."""
    from .loader import load_definitions

    return load_definitions(source.file(relpath), names, extra_globals=extra_globals, modules=modules,
                            where=relpath, version=source.label)


def child_kernels() -> dict[str, Callable[[EngineSource, Mapping[str, Any], str], dict[str, Any]]]:
    table: dict[str, Callable[..., dict[str, Any]]] = {}
    for name in KERNEL_MODULES:
        table.update(importlib.import_module(name).CHILD_KERNELS)
    return table


def cuda_missing_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "torch reports no CUDA device (torch.cuda.is_available() is False)"
    return None


def serve(device: str, lines: Any, out: Any) -> int:
    """Answer requests until stdin closes (the child's main loop)."""
    header = json.loads(next(lines))
    source = EngineSource(header["engine"], header["version"], Path(header["root"]), header["origin"])
    skip = cuda_missing_reason() if device == "cuda" else None
    kernels = child_kernels()
    for line in lines:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            if skip:
                answer = {"ok": False, "skipped": skip, "error": skip, "config": False}
            elif request["kernel"] not in kernels:
                answer = {"ok": False, "error": f"unknown kernel {request['kernel']}", "config": True}
            else:
                answer = {"ok": True, "result": kernels[request["kernel"]](source, request["case"], device)}
        except ConfigError as exc:
            answer = {"ok": False, "error": str(exc), "config": True}
        except Exception as exc:  # an upstream kernel that raises is a result, reported with its message
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "config": False}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvsim.conform.triton_child")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    elif os.environ.get("TRITON_INTERPRET") == "1":
        os.environ.pop("TRITON_INTERPRET")
    return serve(args.device, iter(sys.stdin.readline, ""), sys.stdout)


# --- parent side ---------------------------------------------------------------------------------------

class KernelChild:
    """A running child for one engine source and device; `call` sends one case and returns its result."""

    def __init__(self, source: EngineSource, device: str = "cpu") -> None:
        if device not in DEVICES:
            raise ConfigError("--device", f"one of {', '.join(DEVICES)}", device)
        self.source, self.device = source, device
        self.process: subprocess.Popen[str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")

    def __enter__(self) -> "KernelChild":
        env = dict(os.environ)
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.process = subprocess.Popen([sys.executable, "-m", "kvsim.conform.triton_child", "--device", self.device],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                        text=True, env=env)
        s = self.source
        self._send({"engine": s.engine, "version": s.version, "root": str(s.root), "origin": s.origin})
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.process is not None:
            if self.process.stdin:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        self._stderr.close()

    def _send(self, document: Mapping[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(document) + "\n")
        self.process.stdin.flush()

    def stderr_tail(self, limit: int = 2000) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()[-limit:]

    def call(self, kernel: str, case: Mapping[str, Any]) -> dict[str, Any]:
        """The kernel's result; ConfigError when upstream cannot be loaded, KernelSkipped without CUDA,
        KernelChildError when the kernel raised (message included) or the child died."""
        if self.process is None:
            raise KernelChildError("kernel child not started (use `with KernelChild(...)`)")
        try:
            self._send({"kernel": kernel, "case": case})
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise KernelChildError(f"kernel child died: {exc}; stderr: {self.stderr_tail()}") from exc
        if not line:
            raise KernelChildError(f"kernel child exited ({self.process.poll()}); stderr: {self.stderr_tail()}")
        answer = json.loads(line)
        if answer["ok"]:
            return answer["result"]
        if answer.get("skipped"):
            raise KernelSkipped(answer["skipped"])
        if answer.get("config"):
            raise ConfigError(kernel, "upstream definitions that load", answer["error"])
        raise KernelChildError(f"{kernel}: {answer['error']}")


if __name__ == "__main__":
    sys.exit(main())
