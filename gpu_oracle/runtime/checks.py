"""The registry of differential checks and `oracle_report`, which runs them on every available backend.

A check is `fn(backend, max_examples, seed) -> CheckOutcome`, usually a
Hypothesis search comparing a backend with a reference model
(`hypothesis_check` does the bookkeeping). Later kernels register theirs
with `@oracle_check`. On `cpu-shim-asan` a check runs, whole, inside the
ASan child (`gpu_oracle.asan`), unless it manages its own children.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.strategies import SearchStrategy

from kvsim.engine.canon import canonical_json
from kvsim.engine.errors import PropertyViolation

from . import asan
from .discovery import BACKEND_NAMES, backends
from ..kernels.zero_kv_blocks.backends import asan_loaded


@dataclass(frozen=True)
class CheckOutcome:
    examples: int
    status: str  # "passed" or "failed"
    message: str = ""


@dataclass(frozen=True)
class OracleCheck:
    name: str
    doc: str
    backends: tuple[str, ...]
    fn: Callable[[str, int, int | None], CheckOutcome]
    asan_in_child: bool = True  # False: the check starts its own ASan children


CHECKS: dict[str, OracleCheck] = {}


def oracle_check(name: str, *, backends: tuple[str, ...] = BACKEND_NAMES,
                 asan_in_child: bool = True) -> Callable[[Callable[[str, int, int | None], CheckOutcome]], OracleCheck]:
    """Register `fn(backend, max_examples, seed)` as a check run on each of `backends`."""

    def wrap(fn: Callable[[str, int, int | None], CheckOutcome]) -> OracleCheck:
        if not fn.__doc__:
            raise TypeError(f"oracle check {name} needs a docstring")
        if name in CHECKS:
            raise ValueError(f"oracle check {name} is registered twice")
        check = OracleCheck(name, " ".join(fn.__doc__.split()), tuple(backends), fn, asan_in_child)
        CHECKS[name] = check
        return check

    return wrap


def hypothesis_check(strategy: SearchStrategy[Any], test: Callable[[Any], None], max_examples: int,
                     seed: int | None, describe: Callable[[Any], Any] = lambda case: case) -> CheckOutcome:
    """Run `test` over `strategy` with shrinking; a PropertyViolation (or any error) fails with the shrunk case."""
    record: dict[str, Any] = {"count": 0, "case": None}

    def body(case: Any) -> None:
        record["count"] += 1
        record["case"] = case
        test(case)

    run = settings(max_examples=max_examples, database=None, deadline=None, derandomize=False,
                   verbosity=Verbosity.quiet, print_blob=False, report_multiple_bugs=False,
                   suppress_health_check=list(HealthCheck),
                   phases=tuple(p for p in Phase if p is not Phase.explain))(given(strategy)(body))
    if seed is not None:
        run = hypothesis.seed(seed)(run)
    try:
        run()
    except Exception as exc:  # the last case Hypothesis ran before re-raising is the shrunk one
        kind = "" if isinstance(exc, PropertyViolation) else f"{type(exc).__name__}: "
        if record["count"] == 0:  # nothing was generated: the strategy or the setup itself is broken
            return CheckOutcome(0, "failed", f"{type(exc).__name__}: {exc}")
        case = canonical_json(describe(record["case"]))
        return CheckOutcome(record["count"], "failed", f"{kind}{exc}; minimal case: {case[:2000]}")
    return CheckOutcome(record["count"], "passed", "")


def run_check(check: OracleCheck, backend: str, *, max_examples: int, seed: int | None) -> CheckOutcome:
    """One check on one backend; a crash of the backend (build failure, driver error) is a failed check."""
    if backend == "cpu-shim-asan" and check.asan_in_child and not asan_loaded():
        args = ["check", check.name, "--max-examples", str(max_examples)]
        child = asan.run_child(args + (["--seed", str(seed)] if seed is not None else []))
        if child.output is not None and child.report is None:
            return CheckOutcome(child.output["examples"], child.output["status"], child.output["message"])
        return CheckOutcome(0, "failed", child.explain())
    try:
        return check.fn(backend, max_examples, seed)
    except Exception as exc:
        return CheckOutcome(0, "failed", f"{type(exc).__name__}: {exc}")


def oracle_report(*, max_examples: int = 50, seed: int | None = 0,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every registered check on every backend it applies to; unavailable backends are skipped with the reason."""
    note = progress or (lambda _: None)
    rows = backends()
    by_name = {b["name"]: b for b in rows}
    results = []
    for check in CHECKS.values():
        for name in check.backends:
            backend = by_name[name]
            if not backend["available"]:
                results.append({"name": check.name, "backend": name, "examples": 0, "status": "skipped",
                                "message": backend["reason"], "seconds": 0.0})
                continue
            note(f"{check.name} on {name} ...")
            start = time.perf_counter()
            outcome = run_check(check, name, max_examples=max_examples, seed=seed)
            seconds = time.perf_counter() - start
            note(f"{check.name} on {name}: {outcome.status}, {outcome.examples} examples, {seconds:.2f} s")
            results.append({"name": check.name, "backend": name, "examples": outcome.examples,
                            "status": outcome.status, "message": outcome.message, "seconds": round(seconds, 3)})
    return {"backends": rows, "checks": results}
