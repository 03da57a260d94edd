"""Kernel properties on real backends: `kvsim check --backend NAME` and `kvsim oracle`.

A kernel property (`kvsim.engine.property.kernel_property`) is an ordinary
property of its model with a backend argument; `kvsim.engine.runner` runs it.
What this module adds is the backend side, which the engine does not know
about: whether this machine has the backend (`kvsim.gpu_oracle` discovery),
and on `cpu-shim-asan` running the property inside a child interpreter with
libasan preloaded (AddressSanitizer cannot be loaded into a running one),
unless this process already has it or the property starts its own children
(`asan_in_child=False`).

    run_kernel_property(prop, backend, variant=..., max_examples=..., seed=...) -> PropertyResult
    oracle_report(registry, max_examples=..., seed=..., progress=...) -> {"backends": [...], "checks": [...]}
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..engine.canon import to_jsonable
from ..engine.errors import ConfigError
from ..engine.interrupt import INTERRUPT, BudgetExceeded, Interrupted, asked
from ..engine.runner import PropertyResult, run_property


def backends() -> list[dict[str, Any]]:
    """Every kernel backend with whether this machine can run it and why (or why not)."""
    from kvsim.gpu_oracle.runtime.discovery import backends as probe_all

    return probe_all()


def kernel_properties(registry: Any) -> list[Any]:
    """The registry's kernel properties, in catalog order."""
    return [p for p in registry.properties.values() if p.is_kernel]


def _in_asan_child(prop: Any, variant: str, max_examples: int, seed: int | None) -> PropertyResult:
    from kvsim.gpu_oracle.runtime import asan

    args = ["property", prop.home, prop.name, "--variant", variant, "--max-examples", str(max_examples)]
    child = asan.run_child(args + (["--seed", str(seed)] if seed is not None else []))
    if child.output is not None and child.report is None:
        return PropertyResult(**child.output)
    return PropertyResult(prop.name, prop.model, variant, "failed", 0, 0.0, message=child.explain())


def run_kernel_property(prop: Any, backend: str, *, variant: Any = "fixed", max_examples: int = 50,
                        seed: int | None = 0, rows: list[dict[str, Any]] | None = None,
                        descriptor: Any = None) -> PropertyResult:
    """Run kernel property `prop` on `backend`: status "skipped" (with the reason) where this machine lacks the
    backend; on cpu-shim-asan inside the ASan child unless libasan is already loaded here or the property
    starts its own children. `rows`: the backend rows already probed (`backends()`); `descriptor`: the model, where
    the caller resolved it."""
    from kvsim.gpu_oracle.runtime.shim import asan_loaded

    name = to_jsonable(variant)
    if backend not in prop.backends:
        raise ConfigError("--backend", f"one of {', '.join(prop.backends)} for {prop.name}", backend)
    row = next(r for r in rows or backends() if r["name"] == backend)
    if not row["available"]:
        return PropertyResult(prop.name, prop.model, name, "skipped", 0, 0.0, message=row["reason"])
    if backend == "cpu-shim-asan" and prop.asan_in_child and not asan_loaded():
        return _in_asan_child(prop, name, max_examples, seed)
    return run_property(prop, variant, max_examples=max_examples, seed=seed, backend=backend, descriptor=descriptor)


def oracle_report(registry: Any, *, max_examples: int = 50, seed: int | None = 0,
                  progress: Callable[[str], None] | None = None, max_seconds: float | None = None,
                  rows: list[dict[str, Any]] | None = None,
                  on_stop: Callable[[], None] | None = None) -> dict[str, Any]:
    """Every kernel property of `registry` on every backend it lists, on the model's fixed variant.

    Rows: `name` is "<model>:<property>"; `status` is "passed", "failed", "error" (the property or backend
    crashed) or "skipped" (the backend is unavailable here; `message` says why); a row that did not pass
    carries `counterexample` and `replay` (the `kvsim check` command that reruns it). With `max_seconds`, runs
    that would start after the budget are not started: they are listed in `not_run`, and so are the run the
    command's time limit (`BudgetExceeded`) or a stop asked by Ctrl-C or SIGTERM cut short and those after it;
    `stopped_by` says which ("max-seconds", "interrupt"; None for a complete report). `rows`: the backends,
    where the caller probed them (`backends()`); `on_stop`: called once such a stop is caught (the command line
    disarms its time limit, which fires again until it is).
    """
    note = progress or (lambda _: None)
    rows = backends() if rows is None else rows
    results: list[dict[str, Any]] = []
    not_run: list[str] = []
    stopped: str | None = None
    deadline = None if max_seconds is None else time.perf_counter() + max_seconds
    for prop in kernel_properties(registry):
        name = f"{prop.model}:{prop.name}"
        for backend in prop.backends:
            available = next(r for r in rows if r["name"] == backend)["available"]
            try:
                if available and stopped is None and deadline is not None and time.perf_counter() > deadline:
                    stopped = "max-seconds"
                if available and stopped is None and asked():
                    stopped = INTERRUPT
                if available and stopped is not None:
                    not_run.append(f"{name} on {backend}")
                    continue
                if available:
                    note(f"{name} on {backend} ...")
                results.append(_oracle_row(prop, name, backend, registry, max_examples, seed, rows, note))
            except (BudgetExceeded, Interrupted) as exc:  # cut short: this run and the rest are not run
                if on_stop is not None:
                    on_stop()
                stopped = "max-seconds" if isinstance(exc, BudgetExceeded) else INTERRUPT
                not_run.append(f"{name} on {backend}")
    return {"backends": rows, "checks": results, "complete": not not_run, "not_run": not_run, "stopped_by": stopped}


def _oracle_row(prop: Any, name: str, backend: str, registry: Any, max_examples: int, seed: int | None,
                rows: list[dict[str, Any]], note: Callable[[str], None]) -> dict[str, Any]:
    """One kernel property on one backend, as a row of `oracle_report`."""
    start = time.perf_counter()
    model = registry.model(prop.model)
    result = run_kernel_property(prop, backend, variant=model.variants.fixed, max_examples=max_examples, seed=seed,
                                 rows=rows, descriptor=model)
    seconds = time.perf_counter() - start
    row = {"name": name, "backend": backend, "examples": result.examples, "status": result.status,
           "message": result.message, "seconds": round(seconds, 3) if result.status != "skipped" else 0.0}
    if result.status != "skipped":
        note(f"{name} on {backend}: {result.status}, {result.examples} examples, {seconds:.2f} s")
    if result.status not in ("passed", "skipped"):
        row.update(counterexample=result.counterexample, replay=result.replay)
    return row
