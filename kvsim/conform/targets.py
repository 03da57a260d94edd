"""The conform targets of an engine: the declarations the model packages' descriptors list.

A target is declared next to its model (`kvsim.models.<model>.conform`, `ModelDescriptor.conform`); this
module only reads those declarations (`targets`), selects among them (`select_targets`: names, or the targets
whose upstream files changed) and runs one on a source (`run_target`). No module list is kept here: a target
whose adapter does not import is an error naming it, never a silent skip.

Migration bridge: adapter modules not yet declared keep their `TARGETS` of the old `Target` records
(`LEGACY_MODULES`), run through the old frame; each is removed as its targets are declared.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from kvsim.engine.conformance.declare import ConformTarget
from kvsim.engine.conformance.result import MAX_REPORTED, STATUSES, TargetResult  # noqa: F401 - re-exported
from kvsim.engine.conformance.runner import Options
from kvsim.engine.errors import ConfigError, KvsimError

from .source import ENGINES, EngineSource

RunOptions = Options

LEGACY_MODULES = {
    "vllm": ("kvsim.conform.vllm.zeroer", "kvsim.conform.vllm.kernels", "kvsim.conform.vllm.merge_states",
             "kvsim.conform.vllm.uniform_plan",
             "kvsim.conform.vllm.workspace", "kvsim.conform.vllm.offload_mapping",
             "kvsim.conform.vllm.context_merge", "kvsim.conform.vllm.offload", "kvsim.conform.vllm.mla_decode"),
    "sglang": ("kvsim.conform.sglang.staging", "kvsim.conform.sglang.budget", "kvsim.conform.sglang.ring",
               "kvsim.conform.sglang.send_plan", "kvsim.conform.sglang.kernels",
               "kvsim.conform.sglang.layout", "kvsim.conform.sglang.status",
               "kvsim.conform.sglang.findings"),
    "flashinfer": ("kvsim.conform.flashinfer.merge", "kvsim.conform.flashinfer.metadata",
                   "kvsim.conform.flashinfer.selection", "kvsim.conform.flashinfer.fallback",
                   "kvsim.conform.flashinfer.triton_merge", "kvsim.conform.flashinfer.inputs",
                   "kvsim.conform.flashinfer.contract"),
}

ADAPTER_MODULES = LEGACY_MODULES  # (migration bridge) the old name


@dataclass(frozen=True)
class Target:
    """The old target record (migration bridge): `run(source, options)` returns a TargetResult."""

    engine: str
    name: str
    relpath: str
    symbols: tuple[str, ...]
    model: str
    doc: str
    run: Callable[[EngineSource, Options], TargetResult]

    @property
    def files(self) -> tuple[str, ...]:
        return (self.relpath,)


def descriptors() -> dict[str, Any]:
    from kvsim.app import catalog

    return dict(catalog.models().models)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ConfigError("engine", f"one of {', '.join(ENGINES)}", engine)


def targets(engine: str) -> list[Any]:
    """Every target of `engine`: the models' declarations in catalog order (then the bridge's old records)."""
    _check_engine(engine)
    found: list[Any] = [t for d in descriptors().values() for t in d.conform if t.engine == engine]
    names = {t.name for t in found}
    for module_name in LEGACY_MODULES.get(engine, ()):
        module = importlib.import_module(module_name)
        found.extend(t for t in getattr(module, "TARGETS", ()) if t.name not in names)
    return found


def split_names(values: Iterable[str] | str | None) -> list[str]:
    """`--target a,b --target c` -> ["a", "b", "c"]; an empty name is refused."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    names = []
    for value in values:
        for name in value.split(","):
            if not name.strip():
                raise ConfigError("--target", "target names separated by commas (kvsim conform ENGINE --json "
                                  "lists them)", value)
            names.append(name.strip())
    return names


def select_targets(engine: str, name: Iterable[str] | str | None = None) -> list[Any]:
    """The targets named (in the order given, each once), or all of them."""
    found = targets(engine)
    names = split_names(name)
    if not names:
        return found
    by_name = {t.name: t for t in found}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError("--target", f"one of {', '.join(by_name)}", ",".join(unknown))
    return [by_name[n] for n in dict.fromkeys(names)]


def changed_targets(found: Sequence[Any], changed: Iterable[str], engine: str) -> list[Any]:
    """The targets one of whose upstream files is among `changed` (paths in a tree: matched by their tail)."""
    paths = [p.replace("\\\\", "/").lstrip("./") for p in changed]

    def touched(target: Any) -> bool:
        return any(p == f or p.endswith("/" + f) for f in target.files for p in paths)
    return [t for t in found if touched(t)]


def run_target(target: Any, source: EngineSource, options: Options) -> TargetResult:
    """One target on one source (the declared ones through the engine's runner)."""
    if isinstance(target, ConformTarget):
        from .run import run_targets

        return run_targets([target], source, descriptors(), options)[0]
    return _run_legacy(target, source, options)


def _run_legacy(target: Target, source: EngineSource, options: Options) -> TargetResult:
    from .loader import names_in

    started = time.perf_counter()
    if not source.has(target.relpath):
        return TargetResult(target.name, source.version, "not present",
                            note=f"{target.relpath}: absent in {source.label}").finish(started)
    missing = [s for s in target.symbols if s not in names_in(source.file(target.relpath))]
    if missing:
        return TargetResult(target.name, source.version, "not present",
                            note=f"{target.relpath}:{','.join(missing)}: absent in {source.label}").finish(started)
    try:
        result = target.run(source, options)
    except KvsimError as exc:
        return TargetResult(target.name, source.version, "error", note=str(exc)).finish(started)
    except Exception as exc:  # noqa: BLE001 - the old frame's report of an adapter that could not drive the code
        return TargetResult(target.name, source.version, "error",
                            note=f"{target.relpath}: the adapter could not drive {', '.join(target.symbols)} "
                                 f"in {source.label}: {type(exc).__name__}: {exc}").finish(started)
    result.seconds = round(time.perf_counter() - started, 3)
    from .run import subject

    from kvsim.engine.conformance.compare import EXACT

    result.engine, result.files, result.subject = target.engine, [target.relpath], subject(source)
    for d in result.divergences:
        found = EXACT.difference(d["model"], d["upstream"])
        d.setdefault("difference", found.line() if found is not None else "")
    return result


def drive(strategy: Any, check: Callable[[Any], None], options: Options, max_examples: int | None = None,
          *, shrink: bool = False) -> None:
    """(migration bridge) Run `check` on Hypothesis inputs from `strategy`."""
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
