"""Line probes: the code under test records its own statements as they run, with no trace hook.

A trace hook (`sys.settrace`) is called on every Python call of the process (Hypothesis's, the model's, numpy's)
to find the few frames of the code under test, which about doubles a `--coverage` run. Instead, a file the
loader executed (`loaded(filename, module, text)`) is compiled again from its text with one statement before
each statement of its functions, `__kvsim_ran__.add((path, line))`: the upstream file and line the statement
stands for (`answers.register_lines`'s map), the line statement coverage counts (`statement_line`). While a
`LineTrace` measures, the module's functions run that code (`Probed.attach` sets each one's `__code__`: the
same function objects, so every reference the engine or a test holds runs it) and `__kvsim_ran__` is the
trace's set; `detach` gives them their own code back. A function is matched to its probed code by qualified
name and first line, so a closure made before the trace (a decorator's wrapper) is probed too, and a closure
made while it runs comes from probed code. What a probe cannot reach is the Triton interpreter's kernels: it
compiles a kernel again from its source, so the kernel child keeps the hook (`LineTrace(probes=False)`).
"""

from __future__ import annotations

import __future__
import ast
import functools
import types
import weakref
from typing import Any, Callable, Iterator

PROBE = "__kvsim_ran__"  # the module global each probe adds to (dunder: no class body mangles it)
_FUTURE = functools.reduce(lambda a, b: a | b, (getattr(__future__, f).compiler_flag
                                                 for f in __future__.all_feature_names))

# executed file -> [(its module, the text it was executed from)], the modules a trace probes
_MODULES: dict[str, list[tuple[weakref.ref, str]]] = {}
_COMPILED: dict[tuple[str, int, int], dict[tuple[str, int], types.CodeType | None]] = {}
MEASURING: list[Any] = []  # the traces measuring by probes now, innermost last


def statement_line(stmt: ast.stmt) -> int | None:
    """The line that runs when `stmt` runs inside a called function, or None: `x: T` runs nothing, and a nested
    class's header line is not counted. `if (` / `elif (` over several lines runs its test's own first line."""
    if isinstance(stmt, ast.ClassDef) or (isinstance(stmt, ast.AnnAssign) and stmt.value is None):
        return None
    return stmt.test.lineno if isinstance(stmt, (ast.If, ast.While)) else stmt.lineno


def without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def loaded(filename: str, module: types.ModuleType, text: str) -> None:
    """`module` was executed from `text` compiled as `filename` (a file whose lines `register_lines` maps): a
    trace measuring now, or later, probes it."""
    entries = [e for e in _MODULES.get(filename, []) if e[0]() is not None and e[0]() is not module]
    _MODULES[filename] = entries + [(weakref.ref(module), text)]
    if MEASURING:
        MEASURING[-1].probe(filename, module, text)


def modules() -> Iterator[tuple[str, types.ModuleType, str]]:
    for filename, entries in list(_MODULES.items()):
        for ref, text in entries:
            module = ref()
            if module is not None:
                yield filename, module, text


class Probed:
    """One module's functions and their probed code, for one trace."""

    def __init__(self, filename: str, module: types.ModuleType, text: str,
                 place: Callable[[int], str | None]) -> None:
        self.module = module
        codes = probed_codes(filename, text, place)
        self.swaps: list[tuple[types.FunctionType, types.CodeType, types.CodeType]] = []
        for fn in functions(vars(module), filename):
            code = codes.get((fn.__code__.co_qualname, fn.__code__.co_firstlineno))
            if code is not None and code is not fn.__code__ \
                    and len(code.co_freevars) == len(fn.__code__.co_freevars):
                self.swaps.append((fn, fn.__code__, code))
        self.previous: Any = None

    def attach(self, sink: set[tuple[str, int]]) -> None:
        space = vars(self.module)
        self.previous = space.get(PROBE)
        space[PROBE] = sink
        for fn, _, code in self.swaps:
            fn.__code__ = code

    def detach(self) -> None:
        for fn, code, _ in self.swaps:
            fn.__code__ = code
        if self.previous is not None:
            vars(self.module)[PROBE] = self.previous


def probed_codes(filename: str, text: str, place: Callable[[int], str | None]) -> dict[tuple[str, int],
                                                                                     types.CodeType | None]:
    """{(qualified name, first line): code} of every function `text` defines, compiled as `filename` with a
    probe before each statement of each function (None where two share a key: left unprobed)."""
    key = (filename, hash(text), len(text))
    found = _COMPILED.get(key)
    if found is None:
        tree = ast.parse(text, filename)
        _Insert(place).visit(tree)
        module = compile(tree, filename, "exec", flags=_future_flags(tree), dont_inherit=True)
        found = {}
        stack = [module]
        while stack:
            for const in stack.pop().co_consts:
                if isinstance(const, types.CodeType):
                    k = (const.co_qualname, const.co_firstlineno)
                    found[k] = None if k in found else const
                    stack.append(const)
        if len(_COMPILED) >= 256:  # a session loads a few hundred texts at most: keep the last ones
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = found
    return found


def _future_flags(tree: ast.Module) -> int:
    flags = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            for alias in stmt.names:
                feature = getattr(__future__, alias.name, None)
                flags |= getattr(feature, "compiler_flag", 0)
    return flags & _FUTURE


class _Insert(ast.NodeVisitor):
    """Puts a probe before each statement inside a function (its docstring kept first)."""

    def __init__(self, place: Callable[[int], str | None]) -> None:
        self.place = place
        self.inside = 0

    def generic_visit(self, node: ast.AST) -> None:
        function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        self.inside += function
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, name, self._body(stmts, docstring=function and name == "body"))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.excepthandler, ast.match_case)):
                self.visit(child)
        self.inside -= function

    def _body(self, stmts: list[ast.stmt], docstring: bool) -> list[ast.stmt]:
        code = without_docstring(stmts) if docstring else stmts
        out = stmts[:len(stmts) - len(code)]
        for stmt in code:
            self.visit(stmt)
            line = statement_line(stmt) if self.inside else None
            where = self.place(line) if line is not None else None
            if where is not None:
                path, _, number = where.rpartition(":")
                out.append(_probe((path, int(number)), stmt))
            out.append(stmt)
        return out


def _probe(value: tuple[str, int], at: ast.stmt) -> ast.stmt:
    call = ast.Call(ast.Attribute(ast.Name(PROBE, ast.Load()), "add", ast.Load()), [ast.Constant(value)], [])
    node = ast.Expr(call)
    for n in ast.walk(node):
        n.lineno, n.end_lineno, n.col_offset, n.end_col_offset = at.lineno, at.lineno, at.col_offset, at.col_offset
    return node


def functions(space: dict[str, Any], filename: str) -> list[types.FunctionType]:
    """The functions a module's namespace holds whose code is `filename`'s: its own, its classes' methods (static,
    class, properties, nested classes) and what a decorator wraps (`__wrapped__`, `__func__`, `func`)."""
    found: list[types.FunctionType] = []
    seen: set[int] = set()
    name = space.get("__name__")

    def visit(obj: Any) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            if obj.__code__.co_filename == filename:
                found.append(obj)
            visit(vars(obj).get("__wrapped__"))  # functools.wraps
        elif isinstance(obj, type):
            if obj.__dict__.get("__module__") == name:
                for value in list(vars(obj).values()):
                    visit(value)
        elif isinstance(obj, (staticmethod, classmethod)):
            visit(obj.__func__)
        elif isinstance(obj, property):
            for part in (obj.fget, obj.fset, obj.fdel):
                visit(part)
        elif isinstance(obj, (functools.cached_property, functools.partial, functools.partialmethod)):
            visit(obj.func)
        elif type(obj).__name__ == "_lru_cache_wrapper":
            visit(getattr(obj, "__wrapped__", None))

    for value in list(space.values()):
        visit(value)
    return found
