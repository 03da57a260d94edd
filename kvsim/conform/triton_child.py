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
child.call("kvsim.conform.vllm.kernels:run_zero", case)`. `shared(source, device, ...)` gives the child of a
source and device kept for the process's life (closed at exit), so every kernel target of a run shares one
child and triton and torch are imported once. The mutants of a `--mutants` run share it too: a request line
`{"mutant": ...}` (or null: the release) changes the mutant in force, and the child then forgets every definition
it loaded (`loader.loaded_cache`) and drops the loaded modules, so the next request loads the kernels afresh, from the
mutated or the released text. A mutant whose call hangs or kills the child gets a fresh child, started with that
mutant in its header, as before. The child-side kernel runners live beside their targets ("module:function"
under `kvsim.conform`), keep what they load in a `loaded_cache()`, and import torch and triton only when a
request runs.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from kvsim.engine.conformance.runner import TargetSkipped
from kvsim.engine.errors import ConfigError

from .child import LineChild, kill
from .loader import loaded_cache, use_mutant
from .source import EngineSource

DEVICES = ("cpu", "cuda")


class KernelSkipped(TargetSkipped):
    """The device cannot run the kernels here (no CUDA): a skip with its reason, not a failure."""


# --- child side ----------------------------------------------------------------------------------------

def load_upstream(source: EngineSource, relpath: str, names: Sequence[str], *,
                  modules: Mapping[str, Any] = {}, extra_globals: Mapping[str, Any] = {}) -> types.SimpleNamespace:
    """The named definitions of `relpath`, with `modules` standing in for those engine modules."""
    from .interpreter import install
    from .loader import load_definitions

    loaded = load_definitions(source.file(relpath), names, extra_globals=extra_globals, modules=modules,
                              where=relpath, version=source.label)
    install()  # triton is imported by now: its interpreter patches the language once per launch (no-op natively)
    return loaded


_SELFTEST_LOADED = loaded_cache()


def selftest(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    """A runner for checking the child itself (`kvsim.conform.triton_child:selftest`): echoes `case["echo"]`,
    raises ValueError, exits the process, never returns, or (`load`) calls `case["name"]` of the source's file
    `case["file"]`, loaded once while the mutant in force stays, as `case["do"]` says."""
    import time

    what = case.get("do", "echo")
    if what == "load":
        key = (case["file"], case["name"])
        if key not in _SELFTEST_LOADED:
            _SELFTEST_LOADED[key] = getattr(load_upstream(source, case["file"], (case["name"],)), case["name"])
        return {"value": _SELFTEST_LOADED[key]()}
    if what == "raise":
        raise ValueError(case.get("message", "asked to raise"))
    if what == "exit":
        os._exit(int(case.get("code", 3)))
    while what == "hang":
        time.sleep(3600)
    return {"echo": case.get("echo")}


class Runners(dict):
    """The child's kernel runners by name: "kvsim.conform.<engine>.<module>:<function>" is imported when first
    asked for (only under kvsim.conform); any other name is unknown."""

    def __missing__(self, name: str) -> Callable[..., dict[str, Any]]:
        module, _, function = name.partition(":")
        if function and module.startswith("kvsim.conform."):
            try:
                found = getattr(importlib.import_module(module), function)
            except (ImportError, AttributeError):
                raise KeyError(name) from None
            self[name] = found
            return found
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True


def child_kernels() -> dict[str, Callable[[EngineSource, Mapping[str, Any], str], dict[str, Any]]]:
    return Runners()


def cuda_missing_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "torch reports no CUDA device (torch.cuda.is_available() is False)"
    return None


def serve(device: str, lines: Any, out: Any) -> int:
    """Answer requests until stdin closes (the child's main loop)."""
    from kvsim.engine.conformance.answers import where
    from kvsim.engine.conformance.linetrace import LineTrace
    from kvsim.engine.conformance.mutants import Mutant

    header = json.loads(next(lines))
    source = EngineSource(header["engine"], header["version"], Path(header["root"]), header["origin"])
    if header.get("mutant"):
        use_mutant(Mutant.from_json(header["mutant"]))
    trace = LineTrace(probes=False) if header.get("trace") else None  # the interpreter recompiles a kernel
    skip = cuda_missing_reason() if device == "cuda" else None
    kernels = child_kernels()
    for line in lines:
        if not line.strip():
            continue
        request = json.loads(line)
        if "mutant" in request:  # not answered: the next request runs with it
            use_mutant(Mutant.from_json(request["mutant"]) if request["mutant"] else None)
            continue
        if trace is not None:
            trace.executed.clear()
            trace.start()
        try:
            if skip:
                answer = {"ok": False, "skipped": skip, "error": skip, "config": False}
            elif request["kernel"] not in kernels:
                answer = {"ok": False, "error": f"unknown kernel {request['kernel']}", "config": True}
            else:
                answer = {"ok": True, "result": kernels[request["kernel"]](source, request["case"], device)}
        except ConfigError as exc:
            answer = {"ok": False, "error": str(exc), "config": True}
        except Exception as exc:  # an upstream kernel that raises is an answer, with where it raised
            origin, place = where(exc.__traceback__)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "config": False,
                      "raised": {"type": type(exc).__name__, "message": " ".join(str(exc).split())[:300],
                                 "where": place, "origin": origin}}
        finally:
            if trace is not None:
                trace.stop()
        if trace is not None:
            answer["lines"] = sorted(trace.executed)
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

class KernelChild(LineChild):
    """A running child for one engine source and device; `call` sends one case and returns its result.

    `timeout`: seconds one call may take; a call that does not answer in time ends the child (its whole
    process group) and is the answer `DidNotReturn`, and the next call starts a new child. A kernel that
    raises is the answer `Raised` (with the upstream line), a child that dies `Raised("ChildDied")`: both
    reach the runner through `Answered`, so each is a divergence with its input. `mutant`: the mutant the
    child loads the kernels with; `trace`: a LineTrace the child's executed upstream lines are added to.
    """

    def __init__(self, source: EngineSource, device: str = "cpu", *, timeout: float | None = None,
                 mutant: Any = None, trace: Any = None) -> None:
        if device not in DEVICES:
            raise ConfigError("--device", f"one of {', '.join(DEVICES)}", device)
        super().__init__()
        self.source, self.device, self.timeout, self.mutant, self.trace = source, device, timeout, mutant, trace
        self.started = 0

    def use(self, mutant: Any) -> None:
        """The next calls run with `mutant` in force (None: the release); a running child is told, a child started
        later gets it in its header."""
        if mutant == self.mutant:
            return
        self.mutant = mutant
        if self.process is not None:
            try:
                self.send({"mutant": mutant.to_json() if mutant is not None else None})
            except (BrokenPipeError, OSError):  # it died: the next call starts a fresh one, with the mutant
                kill(self.process)
                self.close()

    def __enter__(self) -> "KernelChild":
        self._start()
        return self

    def _start(self) -> None:
        if self.device == "cuda" and self.started == 0:  # no CUDA here: the target is skipped before any call
            reason = cuda_missing_reason()
            if reason is not None:
                raise KernelSkipped(reason)
        env = dict(os.environ)
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.spawn(["-m", "kvsim.conform.triton_child", "--device", self.device], env)
        self.started += 1
        s = self.source
        self.send({"engine": s.engine, "version": s.version, "root": str(s.root), "origin": s.origin,
                   "mutant": self.mutant.to_json() if self.mutant is not None else None,
                   "trace": self.trace is not None})

    def call(self, kernel: str, case: Mapping[str, Any]) -> dict[str, Any]:
        """The kernel's result; ConfigError when upstream cannot be loaded, KernelSkipped without CUDA; a raise,
        a death or a hang of the kernel as `Answered` (its answer for the runner)."""
        from kvsim.engine.conformance.answers import Answered, DidNotReturn, Raised

        if self.process is None:
            self._start()
        assert self.process is not None
        try:
            self.send({"kernel": kernel, "case": case})
            line = self.readline(self.timeout)
        except (BrokenPipeError, OSError) as exc:
            line = ""
            reason = f"{exc}"
        else:
            reason = ""
        if line is None:
            kill(self.process)
            self.close()
            raise Answered(DidNotReturn(float(self.timeout or 0)))
        if not line:
            try:  # its output ended: the process is ending, and its exit code comes a moment later
                code = self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            tail = " ".join(self.stderr_tail(600).split())
            self.close()
            raise Answered(Raised("ChildDied", f"the kernel's process ended ({code}{'; ' + reason if reason else ''})"
                                  f": {tail}", kernel))
        answer = json.loads(line)
        if self.trace is not None and answer.get("lines"):
            self.trace.add(tuple(x) for x in answer["lines"])
        if answer["ok"]:
            return answer["result"]
        if answer.get("skipped"):
            raise KernelSkipped(answer["skipped"])
        if answer.get("config"):
            raise ConfigError(kernel, "upstream definitions that load", answer["error"])
        raised = answer.get("raised") or {"type": "Error", "message": answer["error"], "where": kernel}
        raise Answered(Raised(raised["type"], raised["message"], raised["where"], raised.get("origin", "upstream")))


_SHARED: dict[tuple[Any, ...], KernelChild] = {}
_SHARED_CLOSED_AT_EXIT: list[Any] = []


@contextlib.contextmanager
def shared(source: EngineSource, device: str = "cpu", *, timeout: float | None = None, mutant: Any = None,
           trace: Any = None) -> Iterator[KernelChild]:
    """The kernel child of this source and device, started on first use and kept for the next target until a
    target of another source or device asks for one (a child that hung or died is started again at its next
    call), running the block's calls with `mutant` in force (None: the release)."""
    key = (source.engine, source.version, str(source.root), source.origin, device, trace is not None)
    child = _SHARED.get(key)
    if child is None:
        if not _SHARED_CLOSED_AT_EXIT:
            _SHARED_CLOSED_AT_EXIT.append(atexit.register(close_shared))
        close_shared()  # one kept at a time: a run has one source (`--versions` one after the other), and a test
        child = _SHARED[key] = KernelChild(source, device, trace=trace)  # session's planted trees must not pile up
    child.timeout, child.trace = timeout, trace
    child.use(mutant)
    if child.process is None:
        child._start()
    try:
        yield child
    finally:
        child.trace = None


def close_shared() -> None:
    while _SHARED:
        _SHARED.popitem()[1].close()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch, triton: about half a second the parent waits for at close)
