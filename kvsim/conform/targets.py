"""The Target record, the result records, and the registry of targets per engine.

A target names the upstream file and the top-level definitions it loads, the model it is
compared with, and a `run(source, options)` that returns a `TargetResult`. Adapter modules
(`kvsim.conform.<engine>.<module>`) each define `TARGETS`; this module collects them lazily.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kvsim.engine.errors import ConfigError

from .source import EngineSource

ADAPTER_MODULES = {
    "vllm": ("kvsim.conform.vllm.planner", "kvsim.conform.vllm.zeroer", "kvsim.conform.vllm.kernels",
             "kvsim.conform.vllm.uniform_plan",
             "kvsim.conform.vllm.workspace",
             "kvsim.conform.vllm.offload_mapping",
             "kvsim.conform.vllm.context_merge",
             "kvsim.conform.vllm.offload",
             "kvsim.conform.vllm.mla_decode"),
    "sglang": ("kvsim.conform.sglang.staging", "kvsim.conform.sglang.budget", "kvsim.conform.sglang.ring",
               "kvsim.conform.sglang.send_plan", "kvsim.conform.sglang.kernels",
               "kvsim.conform.sglang.layout", "kvsim.conform.sglang.status",
               "kvsim.conform.sglang.findings"),
    "flashinfer": ("kvsim.conform.flashinfer.merge", "kvsim.conform.flashinfer.metadata",
                   "kvsim.conform.flashinfer.selection", "kvsim.conform.flashinfer.fallback",
                   "kvsim.conform.flashinfer.triton_merge", "kvsim.conform.flashinfer.inputs",
                   "kvsim.conform.flashinfer.contract"),
}
STATUSES = ("conforms", "diverges", "not present", "skipped", "error")
MAX_REPORTED = 5  # divergences kept per target (the count is always exact)


@dataclass(frozen=True)
class RunOptions:
    max_examples: int = 200
    seed: int | None = None  # None: derandomized (same inputs every run)
    device: str = "cpu"


@dataclass
class TargetResult:
    target: str
    version: str | None
    status: str = "conforms"
    compared: int = 0
    seconds: float = 0.0
    divergences: list[dict[str, Any]] = field(default_factory=list)
    divergent: int = 0  # inputs that diverged (divergences keeps the first MAX_REPORTED)
    properties: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def diverge(self, input: Any, model: Any, upstream: Any, note: str = "") -> None:
        self.divergent += 1
        if len(self.divergences) < MAX_REPORTED:
            self.divergences.append({"input": input, "model": model, "upstream": upstream, "note": note})

    def prop(self, name: str, status: str, message: str = "") -> None:
        self.properties.append({"property": name, "status": status, "message": message})

    def finish(self, started: float) -> "TargetResult":
        self.seconds = round(time.perf_counter() - started, 3)
        if self.status == "conforms" and (self.divergent or any(p["status"] == "fails" for p in self.properties)):
            self.status = "diverges"
        return self


@dataclass(frozen=True)
class Target:
    engine: str
    name: str
    relpath: str
    symbols: tuple[str, ...]
    model: str
    doc: str  # what is compared, and the adapter's convention notes
    run: Callable[[EngineSource, RunOptions], TargetResult]


def targets(engine: str) -> list[Target]:
    """Every target of `engine`, in adapter-module order (modules not written yet are skipped)."""
    if engine not in ADAPTER_MODULES:
        raise ConfigError("engine", f"one of {', '.join(ADAPTER_MODULES)}", engine)
    found: list[Target] = []
    for name in ADAPTER_MODULES[engine]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        found.extend(getattr(module, "TARGETS", ()))
    return found


def select_targets(engine: str, name: str | None) -> list[Target]:
    found = targets(engine)
    if name is None:
        return found
    chosen = [t for t in found if t.name == name]
    if not chosen:
        raise ConfigError("--target", f"one of {', '.join(t.name for t in found)}", name)
    return chosen


def drive(strategy: Any, check: Callable[[Any], None], options: RunOptions, max_examples: int | None = None,
          *, shrink: bool = False) -> None:
    """Run `check` on Hypothesis inputs from `strategy` (derandomized unless a seed is given). Without `shrink`,
    `check` records divergences itself and must not raise for them; with it, the exception `check` raises
    propagates for the shrunk input."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())
    runner = settings(max_examples=max_examples or options.max_examples, database=None, deadline=None,
                      derandomize=options.seed is None, phases=phases,
                      suppress_health_check=list(HealthCheck))(given(strategy)(check))
    if options.seed is not None:
        runner = seed(options.seed)(runner)
    runner()


def sweep(inputs: Iterable[Any], check: Callable[[Any], None]) -> None:
    for value in inputs:
        check(value)
