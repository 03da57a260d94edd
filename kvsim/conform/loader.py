"""Reading named top-level definitions out of an upstream source file.

The engine's package is never imported (that would pull CUDA builds and dozens
of dependencies). Instead the file is parsed with `ast`; the named top-level
definitions (functions, classes, assignments) and, transitively, the top-level
definitions and imports they reference are kept, in file order, written to a
real file under the user cache (so `inspect.getsource` and `@triton.jit` work)
and executed in a fresh module. Imports resolve for the standard library, numpy,
torch and triton; every other module (the engine's own, transformers, ...)
is an `Inert` stub: attribute access, subscripts and calls give stubs, a stub
used as a decorator returns the function unchanged, a stub base class is dropped.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import inspect
import os
import sys
import types
from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from kvsim.engine.conformance.answers import register_lines
from kvsim.engine.conformance.probes import loaded
from kvsim.engine.errors import ConfigError

from .source import cache_root

REAL_MODULES = frozenset({"numpy", "torch", "triton"})
LOADED_PREFIX = "kvsim_upstream_"  # the name of every module `load_definitions` makes (in sys.modules)
# The one mutant of the code under test in force while set (`kvsim conform --mutants`): the file it names is
# read with that edit applied, in this process (and, passed in the header, in a kernel child).
MUTANT: ContextVar[Any] = ContextVar("kvsim_conform_mutant", default=None)
# Where top-level definitions come from instead of the file, while set (kvsim.testing's in-process conform: the
# caller's own objects). Called as `load_definitions` is; it runs with the variable unset, so it may load what it
# lacks from a release through `load_definitions` itself.
ANSWER: ContextVar[Callable[..., types.SimpleNamespace] | None] = ContextVar("kvsim_conform_answer", default=None)


class Inert:
    """Stands for anything from a module that is not loaded: inert under every use the loader allows."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_inert_name", name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self._inert_name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
            return args[0]  # used as a decorator
        return Inert(f"{self._inert_name}(...)")

    def __getitem__(self, item: Any) -> "Inert":
        return Inert(f"{self._inert_name}[...]")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return ()

    def __or__(self, other: Any) -> "Inert":
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<inert {self._inert_name}>"


def _is_real(module: str) -> bool:
    top = module.split(".")[0]
    return top in REAL_MODULES or top in sys.stdlib_module_names


class Partial(Inert):
    """A module of the engine of which some names were loaded from its file; the rest stays inert."""

    def __init__(self, name: str, loaded: Mapping[str, Any]) -> None:
        super().__init__(name)
        object.__setattr__(self, "_loaded", dict(loaded))

    def __getattr__(self, attr: str) -> Any:
        loaded = object.__getattribute__(self, "_loaded")
        return loaded[attr] if attr in loaded else super().__getattr__(attr)


def _make_importer(followed: Mapping[str, Mapping[str, Any]], modules: Mapping[str, Any] = {}):
    """The loaded code's `__import__`: stand-ins first, then followed engine modules, real ones, else inert."""

    def importer(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name in modules:
            return modules[name]
        if level == 0 and name in followed and fromlist:
            return Partial(name, followed[name])
        if level == 0 and _is_real(name):
            try:
                return builtins.__import__(name, globals, locals, fromlist, level)
            except ImportError:
                pass
        return Inert(name if level == 0 else "." * level + name)
    return importer


def package_root(path: Path) -> tuple[Path, str] | None:
    """(root, top package name) of a file inside a package tree (parents with __init__.py), else None."""
    path = Path(path).resolve()
    top = None
    parent = path.parent
    while (parent / "__init__.py").is_file():
        top = parent
        parent = parent.parent
    return (top.parent, top.name) if top is not None else None


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _follow(parsed: "Parsed", chosen: Sequence[int], path: Path, depth: int) -> dict[str, dict[str, Any]]:
    """Load the engine-internal names that `from <engine>.x import a` statements bring in, from their files."""
    found = package_root(path) if depth < 4 else None
    if found is None:
        return {}
    root, top = found
    followed: dict[str, dict[str, Any]] = {}
    body = parsed.tree.body
    used = set().union(*(parsed.referenced(i) for i in chosen
                         if not isinstance(body[i], (ast.Import, ast.ImportFrom))))
    for stmt in (body[i] for i in chosen):
        if not (isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module
                and stmt.module.split(".")[0] == top):
            continue
        target = _module_file(root, stmt.module)
        if target is None or target.resolve() == Path(path).resolve():
            continue
        available = names_in(target, imports=False)  # re-exports are not followed
        wanted = [a.name for a in stmt.names if a.name in available and (a.asname or a.name) in used]
        loaded = {}
        for name in wanted:  # one by one: a name that cannot load stays inert
            try:
                loaded[name] = getattr(load_definitions(target, [name], depth=depth + 1), name)
            except Exception:  # noqa: BLE001 - anything that does not load stays an inert stub
                continue
        followed.setdefault(stmt.module, {}).update(loaded)
    return followed


def _bound_names(node: ast.AST) -> set[str]:
    """Names a top-level statement binds in the module namespace."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.If, ast.Try, ast.With)):
        out: set[str] = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                out |= _bound_names(child)
            elif isinstance(child, ast.ExceptHandler):
                for stmt in child.body:
                    out |= _bound_names(stmt)
        return out
    return set()


def _referenced(node: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    # string annotations ("Foo | None") name definitions too
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            names.add(n.value)
    return names


def select(parsed: "Parsed", names: Sequence[str], where: str, version: str) -> list[int]:
    """The indexes of the statements defining `names` and, transitively, what they reference (file order)."""
    binders = parsed.binders
    for name in names:
        if name not in binders:
            raise ConfigError(f"{where}:{name}", "a top-level definition", f"absent in {version}")
    chosen: set[int] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        for index in binders.get(name, ()):
            if index not in chosen:
                chosen.add(index)
                todo.extend(parsed.referenced(index) - {name})
    chosen.update(parsed.future)  # `from __future__` must stay first
    return sorted(chosen)


@dataclass
class Parsed:
    """One source text parsed, with what `select` asks of its statements: each top-level name's binding statements
    (`binders`), the `from __future__` imports (`future`), and each statement's referenced names, worked out on first
    use (`referenced`). The tree is read, never changed."""

    tree: ast.Module
    lines: list[str]
    binders: dict[str, list[int]]
    future: tuple[int, ...]
    _referenced: dict[int, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, text: str, filename: str) -> "Parsed":
        tree = ast.parse(text, filename=filename)
        binders: dict[str, list[int]] = {}
        for index, stmt in enumerate(tree.body):
            for name in _bound_names(stmt):
                binders.setdefault(name, []).append(index)
        future = tuple(i for i, stmt in enumerate(tree.body)
                       if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__")
        return cls(tree, text.splitlines(keepends=True), binders, future)

    def referenced(self, index: int) -> frozenset[str]:
        names = self._referenced.get(index)
        if names is None:
            names = self._referenced[index] = frozenset(_referenced(self.tree.body[index]))
        return names


# Parsed source texts by (file, text), most recently used last. A conform run loads many definitions from the same
# few files (each MLA target from one large module; `_follow` loads each name a file imports one by one, and asks
# which names that file binds): each text is parsed once a process. A mutant's text is another key.
_PARSED: "OrderedDict[tuple[str, str], Parsed]" = OrderedDict()
PARSED_KEPT = 32


def parse(text: str, filename: str) -> Parsed:
    """`Parsed.of(text, filename)`, remembered for the process (the last `PARSED_KEPT` texts)."""
    key = (filename, text)
    parsed = _PARSED.get(key)
    if parsed is None:
        parsed = _PARSED[key] = Parsed.of(text, filename)
        if len(_PARSED) > PARSED_KEPT:
            _PARSED.popitem(last=False)
    else:
        _PARSED.move_to_end(key)
    return parsed


def _segment(lines: list[str], stmt: ast.stmt) -> str:
    start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])
    return "".join(lines[start - 1:stmt.end_lineno])


def scratch(out: Path) -> Path:
    """Where a process writes `out` before renaming it into place: its own name, in this process and no other
    (workers forked at once from one process, loading one file into an empty cache, shared a name made from an
    object's id: one's rename took the other's file away, FileNotFoundError, seen in CI)."""
    return out.with_suffix(f".{os.getpid()}.{id(out)}.tmp")


def load_definitions(path: Path, names: Sequence[str], *, extra_globals: Mapping[str, Any] = {},
                     modules: Mapping[str, Any] = {}, where: str | None = None, version: str = "this source",
                     depth: int = 0) -> types.SimpleNamespace:
    """Execute the named top-level definitions of `path` (and their helpers) in an isolated module.

    A name absent from the file is ConfigError(field="<where>:<name>"), `where` defaulting to the path.
    `extra_globals` are set in the module before and after execution (they replace stubs and helpers);
    `modules` stand in for whole engine modules its imports name (`{"vllm.triton_utils": ...}`).
    Inside a package tree, `from <engine>.x import a` of a name the selection uses is loaded
    from `<engine>/x.py` the same way (so `round_down` is upstream's own), other names stay inert.
    """
    answer = ANSWER.get()
    if answer is not None and depth == 0:
        token = ANSWER.set(None)
        try:
            return answer(path, names, extra_globals=extra_globals, modules=modules, where=where, version=version)
        finally:
            ANSWER.reset(token)
    path = Path(path)
    where = where or str(path)
    text = read_source(path)
    try:
        parsed = parse(text, str(path))
    except SyntaxError as exc:
        raise ConfigError(where, "Python source kvsim can parse", f"syntax error line {exc.lineno}") from exc
    lines = parsed.lines
    chosen = select(parsed, names, where, version)
    body, segments = "", []
    # each definition as upstream wrote it, after a comment naming where it came from
    for stmt in (parsed.tree.body[i] for i in chosen):
        segment = _segment(lines, stmt)
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])
        out_first = body.count("\n") + 2  # after the comment line
        segments.append((out_first, first, len(segment.splitlines())))
        body += f"# {where}:{stmt.lineno}\n" + segment + "\n"
    digest = hashlib.sha256((str(path) + "\0" + body).encode()).hexdigest()[:16]
    out = cache_root() / "loaded" / f"{path.stem}_{digest}.py"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = scratch(out)
        tmp.write_text(body, encoding="utf-8")
        tmp.replace(out)
    register_lines(str(out), where, _line_map(where, segments))
    module_name = f"{LOADED_PREFIX}{path.stem}_{digest}"
    module = types.ModuleType(module_name)
    module.__file__ = str(out)
    loader_builtins = dict(vars(builtins))
    loader_builtins["__import__"] = _make_importer(_follow(parsed, chosen, path, depth), modules)
    module.__dict__["__builtins__"] = loader_builtins
    module.__dict__.update(extra_globals)
    sys.modules[module_name] = module
    try:
        exec(compile(body, str(out), "exec"), module.__dict__)
    except Exception as exc:
        raise ConfigError(where, f"definitions {', '.join(names)} that load without the engine",
                          f"{type(exc).__name__}: {exc}") from exc
    module.__dict__.update(extra_globals)
    if MUTANT.get() is None:  # a `--coverage` trace probes its functions (no mutant run is measured)
        loaded(str(out), module, body)
    for name in names:
        if name not in module.__dict__:
            raise ConfigError(f"{where}:{name}", "a definition bound when its module runs",
                              f"unbound in {version} (a branch that did not run)")
    return types.SimpleNamespace(**{n: module.__dict__[n] for n in names})


def _line_map(where: str, segments: list[tuple[int, int, int]]) -> Callable[[int], str | None]:
    """A line of the executed file -> "where:line" of the upstream file (None for the loader's comment lines)."""

    def upstream(line: int) -> str | None:
        for out_first, first, count in segments:
            if out_first <= line < out_first + count:
                return f"{where}:{first + line - out_first}"
        return None
    return upstream


def read_source(path: Path) -> str:
    """The file's text, with the mutant in force applied if it names this file."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    mutant = MUTANT.get()
    if mutant is not None and Path(path).as_posix().endswith("/" + mutant.file):
        text = mutant.apply(text)
    return text


_LOADED_CACHES: list[dict[Any, Any]] = []


def loaded_cache() -> dict[Any, Any]:
    """A kernel child's cache of loaded upstream definitions (one per child-side runner module): emptied whenever
    the mutant in force changes (`use_mutant`), so no definition of one mutant (or of the release) serves the next."""
    cache: dict[Any, Any] = {}
    _LOADED_CACHES.append(cache)
    return cache


def use_mutant(mutant: Any) -> None:
    """Load from now on with `mutant` in force (None: the release), for the rest of this process (a kernel child
    between two mutants): every `loaded_cache` is emptied and the loaded modules are dropped, so the next request
    loads afresh."""
    if MUTANT.get() == mutant:
        return
    MUTANT.set(mutant)
    for cache in _LOADED_CACHES:
        cache.clear()
    for name in [n for n in sys.modules if n.startswith(LOADED_PREFIX)]:
        del sys.modules[name]


@contextlib.contextmanager
def mutated(mutant: Any) -> Iterator[None]:
    """While the block runs, definitions of the mutant's file load with the mutant applied."""
    token = MUTANT.set(mutant)
    try:
        yield
    finally:
        MUTANT.reset(token)


def check_signature(fn: Any, expected_params: Sequence[str], where: str) -> None:
    """ConfigError naming `where` and the parameter list that changed, unless it equals `expected_params`."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        raise ConfigError(where, "a callable", f"{fn!r} ({exc})") from exc
    if params != list(expected_params):
        raise ConfigError(where, f"parameters ({', '.join(expected_params)})",
                          f"({', '.join(params)})", hint="the upstream signature changed")


def names_in(path: Path, *, imports: bool = True) -> set[str]:
    """Every top-level name `path` binds (for 'not present' checks); `imports=False` leaves out imported names."""
    parsed = parse(Path(path).read_text(encoding="utf-8", errors="replace"), str(path))
    body = parsed.tree.body
    return {n for n, indexes in parsed.binders.items()
            if imports or any(not isinstance(body[i], (ast.Import, ast.ImportFrom)) for i in indexes)}


@contextlib.contextmanager
def answered_by(answer: Callable[..., types.SimpleNamespace]) -> Iterator[None]:
    """While the block runs (in this thread), `load_definitions` asks `answer` instead of reading the file."""
    token = ANSWER.set(answer)
    try:
        yield
    finally:
        ANSWER.reset(token)
