"""`kvsim explore --coverage`: line coverage of the model's own package during one run.

Researchers read it beside the explore result's action and invariant counts to see which
corners of the model a bound (or a small configuration) cut off. It needs the `coverage`
package (`pip install coverage`, in the `test` extra); without it, the flag is refused
with that one line. The model was imported before the run, so its module-level lines
(imports, `def` and `class` lines, constants) ran then: they count as run, and only lines
inside function bodies can show as missed.
"""

from __future__ import annotations

import ast
import importlib
import os
from typing import Any, Callable, TypeVar

from kvsim.engine.errors import ConfigError

T = TypeVar("T")


def model_package(descriptor: Any) -> str:
    """The import name of the package a descriptor's transition system lives in (`kvsim.models.<m>`)."""
    module = getattr(descriptor.system, "__module__", "") or ""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["kvsim", "models"]:
        raise ConfigError("--coverage", "a model packaged under kvsim.models", module or descriptor.name)
    return ".".join(parts[:3])


class WorkerLines:
    """The lines of `package` a worker of a partitioned search runs (a forked process or a Ray actor, on any
    machine): `start` where the worker starts, `stop` when it finishes gives them, by path in the package."""

    def __init__(self, package: str) -> None:
        self.package = package
        self._cov: Any = None

    def start(self) -> None:
        self._cov = _coverage(self.package)
        self._cov.start()

    def stop(self) -> dict[str, list[int]]:
        self._cov.stop()
        data, folder = self._cov.get_data(), _folder(self.package)
        return {os.path.relpath(path, folder): sorted(data.lines(path) or ()) for path in data.measured_files()}

    def __getstate__(self) -> dict[str, Any]:
        return {"package": self.package, "_cov": None}  # a worker measures itself


def run_with_coverage(package: str, fn: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """Run `fn` measuring line coverage of `package`'s files; (its result, the coverage document). The lines
    its workers ran (`worker_lines` of the result, from `WorkerLines`) are counted as run."""
    folder = _folder(package)
    cov = _coverage(package)
    cov.start()
    try:
        result = fn()
    finally:
        cov.stop()
    elsewhere = getattr(result, "worker_lines", None)
    if elsewhere:
        cov.get_data().add_lines({os.path.join(folder, rel): lines for rel, lines in elsewhere.items()})
    files: dict[str, Any] = {}
    total = hit = 0
    for path in sorted(cov.get_data().measured_files()):
        _, statements, _, missing, _ = cov.analysis2(path)
        bodies = function_body_lines(path)
        missing = [line for line in missing if line in bodies]
        name = f"{package}.{os.path.splitext(os.path.relpath(path, folder))[0].replace(os.sep, '.')}"
        files[name] = {"statements": len(statements), "missed": len(missing), "missed_lines": list(missing),
                       "percent": round(100.0 * (len(statements) - len(missing)) / len(statements), 1)
                       if statements else 100.0}
        total += len(statements)
        hit += len(statements) - len(missing)
    doc = {"package": package, "percent": round(100.0 * hit / total, 1) if total else 100.0, "files": files}
    return result, doc


def _folder(package: str) -> str:
    return os.path.dirname(importlib.import_module(package).__file__ or "")


def _coverage(package: str) -> Any:
    try:
        import coverage
    except ImportError:
        raise ConfigError("--coverage", "the coverage package installed (pip install coverage)",
                          "not installed") from None
    return coverage.Coverage(source=[_folder(package)], data_file=None, branch=False, config_file=False)


def function_body_lines(path: str) -> set[int]:
    """The line numbers inside function bodies (what can run after import)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def coverage_lines(doc: dict[str, Any]) -> list[str]:
    rows = [f"line coverage of {doc['package']}: {doc['percent']}%"]
    for name, f in doc["files"].items():
        rows.append(f"  {name}: {f['percent']}% ({f['missed']} of {f['statements']} lines not run)")
    return rows
