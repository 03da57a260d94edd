"""Which lines of the code under test a run executed (`kvsim conform --coverage`).

`LineTrace` records each executed statement as the upstream file and line it came from. A file the loader
executed into a module (`probes.loaded`) is measured by line probes, compiled into its functions while the
trace runs, so the rest of the process (Hypothesis, the model, numpy) runs at full speed; any other registered
file (`answers.register_lines`), and every file under `LineTrace(probes=False)` (the Triton interpreter compiles
a kernel again from its source), by a trace hook on the frames of those files only. `coverage(executed,
executable)` gives the share of the checked definitions' statement lines that ran, per file, with the lines that
did not.
"""

from __future__ import annotations

import ast
import sys
import threading
from typing import Any, Iterable, Iterator, Mapping

from . import probes as _probes
from .answers import registered, upstream_file, upstream_line
from .probes import statement_line, without_docstring


class LineTrace:
    """The upstream lines a run executed: measured by probes (`probes=True`) in every module `probes.loaded`
    registers, and by the trace hook in the registered files named in `hooked` (a file a child could not import
    before the run); with `probes=False`, by the hook in every registered file. With `files` (a target's upstream
    files, the only ones its coverage counts), only the registered files executed from those are measured: a
    process that ran other targets before holds their modules too (the loader's stay in `sys.modules`), and
    probing them all at each start cost seconds a target once there were hundreds."""

    def __init__(self, *, probes: bool = True, hooked: Iterable[str] = (), files: Iterable[str] | None = None) -> None:
        self.executed: set[tuple[str, int]] = set()
        self.probes = probes
        self.hooked = frozenset(hooked)
        self.files = None if files is None else frozenset(files)
        self._probed: dict[int, _probes.Probed] = {}  # id(module) -> its functions' probed code, for this trace
        self._seen: dict[str, bool] = {}
        self._previous: Any = None
        self._depth = 0

    def _counts(self, filename: str) -> bool:
        """Whether `filename` is one this trace measures: of the code under test, and of `files` where given."""
        return registered(filename) and (self.files is None or upstream_file(filename) in self.files)

    def _wanted(self, filename: str) -> bool:
        known = self._seen.get(filename)
        if known is None:
            known = self._seen[filename] = self._counts(filename) and (not self.probes or filename in self.hooked)
        return known

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and self._wanted(frame.f_code.co_filename):
            return self._local
        return None

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            found = upstream_line(frame.f_code.co_filename, frame.f_lineno)
            if found is not None:
                path, _, line = found.rpartition(":")
                self.executed.add((path, int(line)))
        return self._local

    def probe(self, filename: str, module: Any, text: str) -> None:
        """Measure `module` (executed from `text` as `filename`) by its probes from now on (`probes.loaded`), if
        it is of a file this trace measures."""
        if not self._counts(filename):
            return
        probed = self._probed.get(id(module))
        if probed is None or probed.module is not module:
            probed = self._probed[id(module)] = _probes.Probed(filename, module, text,
                                                               lambda line: upstream_line(filename, line))
        probed.attach(self.executed)

    @property
    def _hooked(self) -> bool:
        return not self.probes or bool(self.hooked)

    def start(self) -> None:
        if self._depth == 0:
            if self.probes:
                for filename, module, text in _probes.modules():
                    self.probe(filename, module, text)
                _probes.MEASURING.append(self)
            if self._hooked:
                self._previous = sys.gettrace()
                sys.settrace(self._global)
                threading.settrace(self._global)
        self._depth += 1

    def stop(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            if self._hooked:
                sys.settrace(self._previous)
                threading.settrace(self._previous)  # type: ignore[arg-type]
            if self.probes:
                _probes.MEASURING.remove(self)
                for probed in self._probed.values():
                    probed.detach()

    def add(self, lines: Iterable[tuple[str, int]]) -> None:
        """Lines another process executed (a kernel child)."""
        self.executed.update((str(p), int(n)) for p, n in lines)


def statement_lines(source: str, definitions: Iterable[str]) -> dict[str, set[int]]:
    """The statement lines inside each named definition ("fn", "Class", "Class.method") of a module's source
    (docstrings, `def` and decorator lines left out: they run when the module loads)."""
    tree = ast.parse(source)
    found: dict[str, set[int]] = {}
    for name in definitions:
        node = find_definition(tree, name)
        if node is not None:
            found[name] = _body_lines(node)
    return found


def statement_of(source: str) -> dict[int, int]:
    """{line: the counted line (`statement_line`) of the innermost statement holding it inside a function}: a
    mutant on a continuation line or inside a test ran when its statement did."""
    owner: dict[int, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt, line in _statements(node):  # outer statements first: an inner one holds its own lines
                if line is not None:
                    owner.update(dict.fromkeys(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1), line))
    return owner


def documented_lines(source: str, unreached: Iterable[Any], *, every_line: bool = False) -> dict[str, set[int]]:
    """{definition: its statement lines inside the statements the `unreached` declarations name} in this source:
    each declaration's definition, every statement there whose first line holds its text, and all inside it
    (`every_line`: every source line inside, continuation lines too, where a mutant may sit)."""
    tree = ast.parse(source)
    text = source.splitlines()
    found: dict[str, set[int]] = {}
    for entry in unreached:
        node = find_definition(tree, entry.definition)
        if node is None:
            continue
        statements = list(_statements(node))  # one walk: the definition's statement lines, and where the text is
        body = {line for _, line in statements if line is not None}
        for stmt, _ in statements:
            if entry.text in text[stmt.lineno - 1]:
                # an `if` / `elif` / loop: its test and its own body (its `else` / `elif` chain is another branch)
                last = stmt.body[-1].end_lineno if isinstance(stmt, (ast.If, ast.While, ast.For)) else stmt.end_lineno
                inside = set(range(stmt.lineno, (last or stmt.lineno) + 1))
                found.setdefault(entry.definition, set()).update(inside if every_line else body & inside)
    return found


def find_definition(tree: ast.Module, dotted: str) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in dotted.split("."):  # the last definition of a name is the one bound (after `@overload` stubs)
        node = next((n for n in reversed(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                   ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body  # type: ignore[attr-defined]
    return node


def _body_lines(node: ast.AST) -> set[int]:
    return {line for _, line in _statements(node) if line is not None}


def _statements(node: ast.AST) -> Iterator[tuple[ast.stmt, int | None]]:
    """Every statement inside a definition, each with the line that runs for it when the definition is called, or
    None: a class's own body and a method's `def` line ran when the module loaded (a class: the bodies of its
    methods), so did a function's docstring, and `x: T` compiles to nothing."""
    body = getattr(node, "body", [])
    if isinstance(node, ast.ClassDef):
        for child in body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child, None
                yield from _statements(child)
            else:
                yield from ((sub, None) for sub in ast.walk(child) if isinstance(sub, ast.stmt))
        return
    code = without_docstring(body)
    for stmt in body[:len(body) - len(code)]:  # the docstring
        yield stmt, None
    for stmt in code:
        for sub in ast.walk(stmt):  # inside a function all of it runs when it is called, nested bodies too
            if isinstance(sub, ast.stmt):
                yield sub, statement_line(sub)


def coverage(executed: set[tuple[str, int]], executable: Mapping[str, Mapping[str, set[int]]],
             documented: Mapping[str, Mapping[str, set[int]]] | None = None) -> dict[str, Any]:
    """{"percent", "lines", "run", "files": {file: {"percent", "lines", "run", "missed": {definition: [lines]},
    "documented": {definition: [lines]}}}}: `documented` lines (`declare.Unreached`) are left out of the count
    and listed apart."""
    files: dict[str, Any] = {}
    total = ran = 0
    for path, definitions in executable.items():
        known = (documented or {}).get(path, {})
        counted = {d: ls - known.get(d, set()) for d, ls in definitions.items()}
        lines = set().union(*counted.values()) if counted else set()
        hit = {n for n in lines if (path, n) in executed}
        missed = {d: sorted(n for n in ls if (path, n) not in executed) for d, ls in counted.items()}
        files[path] = {"lines": len(lines), "run": len(hit),
                       "percent": round(100.0 * len(hit) / len(lines), 1) if lines else 100.0,
                       "missed": {d: ls for d, ls in missed.items() if ls},
                       "documented": {d: sorted(ls & definitions.get(d, set())) for d, ls in known.items()
                                      if ls & definitions.get(d, set())}}
        total += len(lines)
        ran += len(hit)
    return {"percent": round(100.0 * ran / total, 1) if total else 100.0, "lines": total, "run": ran,
            "files": files}
