"""`kvsim conform --from PATH` in process: a conform target's adapter run on the caller's own objects.

The adapter (`kvsim.conform.<engine>.<module>`) is run unchanged through `kvsim.conform.report.run_target`:
the differential against the model and the model's properties on the results are the adapter's own. Only
where the definitions come from changes: while the target runs, the loader (`kvsim.conform.loader.answered_by`,
a context variable, so other threads are untouched) hands back the caller's objects for the names the caller provides (a mapping, a module, or one function or class for
the target's first symbol), and loads any other name it asks for from a release or a tree (`release=`,
`from_path=`) as `kvsim conform` would. Without one, a name the caller does not provide is a ConfigError
naming the file and the symbol, like a definition missing from a release.

A provided function runs with a private copy of its module's globals, with the adapter's stand-ins
(`extra_globals`) applied as the loader applies them to upstream code; an adapter that patches a helper
(`fn.__globals__[...] = ...`) patches the copy, never the caller's module. Classes and other callables are
handed over as they are.

Hypothesis: `RunOptions(max_examples, seed)` as `kvsim conform` takes them; the pytest fixture
(`kvsim_conform` in `kvsim.testing.plugin`) derives them from the Hypothesis profile the test run loaded. The
adapters record divergences instead of raising, so nothing is written to an example database here.
"""

from __future__ import annotations

import inspect
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..conform import loader
from ..conform.report import format_results
from ..conform.source import ENGINES, EngineSource, resolve_source
from ..conform.targets import RunOptions, TargetResult, run_target, targets
from ..engine.errors import ConfigError

MISSING = object()
PASSING = ("conforms",)


class ConformanceFailure(AssertionError):
    """A target diverges from the model (or a model property fails on the caller's code), or cannot run."""

    def __init__(self, message: str, result: TargetResult) -> None:
        super().__init__(message)
        self.result = result


def first_symbol(target: Any) -> str:
    """The name one function or class given alone stands for: the target's first loaded definition."""
    return target.upstream[0].names[0] if hasattr(target, "upstream") else target.symbols[0]


def relpath(target: Any) -> str:
    """The target's first upstream file."""
    return target.upstream[0].file if hasattr(target, "upstream") else target.relpath


def find_target(name: str, engine: str | None = None) -> Any:
    """The target `name` ("plan_mla_context_chunks", or "vllm:plan_mla_context_chunks"); ConfigError if unknown
    or if two engines have a target of that name and none was named."""
    if ":" in name:
        engine, _, name = name.partition(":")
    engines = (engine,) if engine is not None else ENGINES
    found = [t for e in engines for t in targets(e) if t.name == name]
    if not found:
        known = sorted({f"{t.engine}:{t.name}" for e in engines for t in targets(e)})
        raise ConfigError("target", f"a kvsim conform target ({', '.join(known)})", name)
    if len(found) > 1:
        raise ConfigError("target", f"ENGINE:{name} (several engines have it)",
                          ", ".join(f"{t.engine}:{t.name}" for t in found))
    return found[0]


class Provided:
    """The caller's definitions by name: a mapping, a module's attributes, or one object for `default_name`."""

    def __init__(self, impl: Any, default_name: str) -> None:
        if isinstance(impl, Mapping):
            self.table: Mapping[str, Any] | None = dict(impl)
            self.module = None
        elif isinstance(impl, types.ModuleType):
            self.table, self.module = None, impl
        elif callable(impl):
            self.table, self.module = {default_name: impl}, None
        else:
            raise ConfigError("impl", "a function or class, a module, or a mapping of names to definitions",
                              type(impl).__name__)
        if self.module is not None:
            self.label = impl.__name__
        elif isinstance(impl, Mapping):
            self.label = "{" + ", ".join(sorted(impl)) + "}"
        else:
            self.label = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', repr(impl))}"

    def get(self, name: str) -> Any:
        if self.module is not None:
            return getattr(self.module, name, MISSING)
        assert self.table is not None
        return self.table.get(name, MISSING)

    def names(self) -> list[str]:
        if self.module is not None:
            return sorted(n for n in vars(self.module) if not n.startswith("__"))
        assert self.table is not None
        return sorted(self.table)


def isolated(obj: Any, extra_globals: Mapping[str, Any]) -> Any:
    """A plain function again, over a private copy of its module's globals (plus the adapter's stand-ins)."""
    if not inspect.isfunction(obj):
        return obj
    scope = dict(obj.__globals__)
    scope.update(extra_globals)
    clone = types.FunctionType(obj.__code__, scope, obj.__name__, obj.__defaults__, obj.__closure__)
    clone.__kwdefaults__ = obj.__kwdefaults__
    clone.__qualname__, clone.__module__, clone.__doc__ = obj.__qualname__, obj.__module__, obj.__doc__
    clone.__annotations__ = dict(obj.__annotations__)
    clone.__dict__.update(obj.__dict__)
    return clone


def provided_loader(provided: Provided, base: EngineSource | None) -> Callable[..., types.SimpleNamespace]:
    """A `load_definitions` that answers from `provided`, and loads what it lacks from `base` (else refuses)."""
    real = loader.load_definitions

    def load_definitions(path: Path, names: Any, *, extra_globals: Mapping[str, Any] = {},
                         where: str | None = None, **kw: Any) -> types.SimpleNamespace:
        names = list(names)
        found = {n: provided.get(n) for n in names}
        lacking = [n for n, v in found.items() if v is MISSING]
        if lacking and base is None:
            raise ConfigError(f"{where or path}:{lacking[0]}",
                              "a definition the caller provides (a module or mapping with that name), or "
                              "release= / from_path= to take it from", f"not provided by {provided.label}")
        if lacking:
            found.update(vars(real(path, lacking, extra_globals=extra_globals, where=where, **kw)))
        for value in found.values():
            code_under_test(value)
        return types.SimpleNamespace(**{n: v if n in lacking else isolated(v, extra_globals)
                                        for n, v in found.items()})
    return load_definitions


def code_under_test(obj: Any) -> None:
    """The caller's file counts as the code under test: a raise there is its answer, its lines its coverage."""
    from ..engine.conformance.answers import register_lines, registered

    try:
        path = inspect.getsourcefile(obj)
    except TypeError:
        return
    if path and not registered(path):
        register_lines(path, path)


@dataclass(frozen=True)
class InProcessSource(EngineSource):
    """The caller's code standing for an engine source. Names the caller does not provide come from `base`
    (a release or tree) when there is one; without it a file the adapter names is a stub declaring the
    provided names (what `run_target`'s "not present" check and the adapters' `names_in` read)."""

    provided_names: tuple[str, ...] = ()
    impl_label: str = ""
    base: EngineSource | None = None

    def file(self, relpath: str) -> Path:
        if self.base is not None:
            return self.base.file(relpath)
        path = self.root / relpath
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{n} = None\n" for n in self.provided_names if n.isidentifier()))
        return path

    def has(self, relpath: str) -> bool:
        return self.base is None or self.base.has(relpath)

    @property
    def label(self) -> str:
        return f"{self.impl_label} in process" + (f" over {self.base.label}" if self.base is not None else "")


def run_in_process(target: str, impl: Any, *, engine: str | None = None, release: str | None = None,
                   from_path: str | None = None, max_examples: int = 200,
                   seed: int | None = None) -> tuple[TargetResult, EngineSource]:
    """`conform`, and the source record its report names."""
    chosen = find_target(target, engine)
    provided = Provided(impl, first_symbol(chosen))
    options = RunOptions(max_examples=max_examples, seed=seed)
    base = resolve_source(chosen.engine, version=release, from_path=from_path) \
        if release is not None or from_path is not None else None
    with tempfile.TemporaryDirectory(prefix="kvsim-inprocess-") as tmp:
        source = InProcessSource(chosen.engine, None if base is None else base.version,
                                 Path(tmp) if base is None else base.root, "the caller's objects",
                                 provided_names=tuple(provided.names()), impl_label=provided.label, base=base)
        with loader.answered_by(provided_loader(provided, base)):
            result = run_target(chosen, source, options)
    return result, source


def conform(target: str, impl: Any, **kw: Any) -> TargetResult:
    """Run conform target `target` with the caller's definitions in place of upstream's.

    `impl`: the function or class standing for the target's first symbol, a module, or a mapping of names
    to definitions (for a target that loads several). `engine`: needed only where two engines name a target
    alike ("vllm:NAME" says the same). `release` / `from_path`: where names `impl` does not provide are
    loaded from (a release in the kvsim cache, or a tree). `max_examples`, `seed`: as `kvsim conform`'s.
    The result is `kvsim conform`'s record: status conforms / diverges / not present / error, the
    divergences (input, model, yours), the model's properties on your results.
    """
    return run_in_process(target, impl, **kw)[0]


def failure_text(result: TargetResult, source: EngineSource, rerun: str = "") -> str:
    """`kvsim conform`'s report of one result, and how to rerun it."""
    return format_results(source, [result]) + (f"\n  rerun with {rerun}" if rerun else "")


def assert_conforms(target: str, impl: Any, **kw: Any) -> TargetResult:
    """`conform(...)`, raising ConformanceFailure (an AssertionError) with the report unless it conforms."""
    __tracebackhide__ = True
    result, source = run_in_process(target, impl, **kw)
    if result.status not in PASSING:
        seed = kw.get("seed")
        raise ConformanceFailure(failure_text(result, source, "" if seed is None else f"seed={seed}"), result)
    return result
