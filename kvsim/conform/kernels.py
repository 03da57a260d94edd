"""Kernel targets: real upstream Triton kernels checked against the models' byte-level references.

A `KernelCheck` names the upstream file and definitions (the kernel and its
Python launcher), the model, the child-side runner (`kernel`, a key of some
`CHILD_KERNELS`), the Hypothesis strategy its cases come from (the `gpu_oracle`
family's own strategy, so the geometries are the ones our CUDA C is checked
on), pinned cases, and `compare(child, case) -> Divergence | None`, which runs
the upstream kernel in the child (`kvsim.conform.triton_child`) and compares
it with the model in this process.

`run_kernel_check` drives one check: pinned cases first, then Hypothesis
(derandomized unless a seed is given; a divergence shrinks to a minimal case),
then the `probes`: documented conventions where upstream and the model are
known to differ on inputs the model refuses (each probe returns None while
upstream still behaves as documented, a message when it changed). The result
is the `TargetResult` of `kvsim conform` (`targets.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from kvsim.engine.canon import to_jsonable

from .source import EngineSource
from kvsim.engine.conformance.answers import Answered as KernelChildError

from .triton_child import KernelChild, KernelSkipped

DEFAULT_EXAMPLES = 40  # budget per kernel target unless KVSIM_PROFILE=dev (one interpreted launch each)
DEV_EXAMPLES = 200  # KVSIM_PROFILE=dev


@dataclass(eq=False)
class Divergence(Exception):  # not frozen: Hypothesis adds notes to the exception it re-raises
    """The upstream kernel and the model disagree on one input."""

    input: Any
    model: Any
    upstream: Any
    note: str

    def record(self) -> dict[str, Any]:
        return {"input": to_jsonable(self.input), "model": self.model, "upstream": self.upstream, "note": self.note}


@dataclass(frozen=True)
class Probe:
    """A documented convention: upstream's answer on an input the model refuses, checked to still hold."""

    name: str
    doc: str
    check: Callable[[KernelChild], str | None]  # None: upstream behaves as the target's doc says


@dataclass(frozen=True)
class KernelCheck:
    engine: str
    name: str
    relpath: str
    symbols: tuple[str, ...]
    model: str
    doc: str
    kernel: str  # the child runner
    strategy: Callable[[], Any]  # -> a Hypothesis strategy (imported only when the target runs)
    compare: Callable[[KernelChild, Any], Divergence | None]
    pinned: Callable[[], Sequence[Any]] = lambda: ()
    probes: tuple[Probe, ...] = field(default=())
    # the release's kernel has the shape this adapter drives? None, or why not (the target is then "not present")
    shape: Callable[[EngineSource], str | None] = lambda source: None


def kernel_examples() -> int:
    """A kernel target's cap on examples: each is one interpreted launch (`Differential(examples=...)`)."""
    import os

    return DEV_EXAMPLES if os.environ.get("KVSIM_PROFILE") == "dev" else DEFAULT_EXAMPLES


def call_kernel(ctx: Any, runner: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """One launch of the upstream kernel in the target's child: `runner` is "kvsim.conform.<engine>.<module>:
    <function>", the child-side function that loads the kernel and runs `document`; a raise, death or hang of
    the kernel reaches the runner as that call's answer."""
    return ctx.child.call(runner, document)


def budget(options: Any) -> int:
    """`options.max_examples` (the CLI's budget), capped by the profile: CI keeps kernel targets short."""
    import os

    cap = DEV_EXAMPLES if os.environ.get("KVSIM_PROFILE") == "dev" else DEFAULT_EXAMPLES
    given = getattr(options, "max_examples", None)
    return min(int(given), cap) if given else cap


def run_kernel_check(check: KernelCheck, source: EngineSource, options: Any) -> Any:
    """Pinned cases, Hypothesis cases and probes through one child; the target's result."""
    from .targets import TargetResult, drive

    started = time.perf_counter()
    result = TargetResult(target=check.name, version=source.label)
    device = getattr(options, "device", None) or "cpu"
    source.file(check.relpath)  # a missing file is the ConfigError naming it, before a child starts
    other_shape = check.shape(source)
    if other_shape is not None:
        result.status, result.note = "not present", other_shape
        return result.finish(started)
    try:
        with KernelChild(source, device) as child:
            for case in check.pinned():
                result.compared += 1
                found = check.compare(child, case)
                if found:
                    result.diverge(**found.record())

            def one(case: Any) -> None:
                found = check.compare(child, case)  # may reject the input (hypothesis.reject): not counted
                result.compared += 1
                if found:
                    raise found

            if not result.divergent:
                try:
                    drive(check.strategy(), one, options, budget(options), shrink=True)
                except Divergence as found:  # the shrunk input
                    result.diverge(**found.record())
            for probe in check.probes:
                message = probe.check(child)
                result.prop(probe.name, "holds" if message is None else "fails", message or probe.doc)
    except KernelSkipped as exc:
        result.status = "skipped"
        result.note = f"{check.name} on {device}: {exc}"
        result.prop(f"{check.name} on {device}", "skipped", str(exc))
    except KernelChildError as exc:
        result.status = "error"
        result.note = str(exc)
        result.diverge(None, None, str(exc), "the upstream kernel raised or its child died")
    return result.finish(started)


def as_target(check: KernelCheck) -> Any:
    """B's `Target` record for a kernel check (`run(source, options)`)."""
    from .targets import Target

    return Target(engine=check.engine, name=check.name, relpath=check.relpath, symbols=check.symbols,
                  model=check.model, doc=check.doc, run=lambda source, options: run_kernel_check(check, source, options))


def first_byte_difference(expected: Any, got: Any) -> str | None:
    """None when the two arrays are the same bytes, else where they first differ."""
    import numpy as np

    a, b = np.ascontiguousarray(expected).view(np.uint8).reshape(-1), np.ascontiguousarray(got).view(np.uint8).reshape(-1)
    if a.shape != b.shape:
        return f"{b.size} bytes instead of {a.size}"
    bad = np.flatnonzero(a != b)
    if not bad.size:
        return None
    return f"{bad.size} bytes differ, first at byte {int(bad[0])}: model {int(a[bad[0]])}, upstream {int(b[bad[0]])}"


def unpacked(result: Mapping[str, Any], key: str) -> Any:
    from kvsim.gpu_oracle.runtime.asan import unpack

    return unpack(result[key])
