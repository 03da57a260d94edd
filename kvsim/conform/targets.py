"""The conform targets of an engine: the declarations the model packages' descriptors list.

A target is declared next to its model (`kvsim.models.<model>.conform`, `ModelDescriptor.conform`); this
module only reads those declarations (`targets`), selects among them (`select_targets`: names, or the targets
whose upstream files changed) and runs one on a source (`run_target`). No module list is kept here: a target
whose adapter does not import is an error naming it, never a silent skip.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from kvsim.engine.conformance.declare import ConformTarget
from kvsim.engine.conformance.result import MAX_REPORTED, STATUSES, TargetResult  # noqa: F401 - re-exported
from kvsim.engine.conformance.runner import Options
from kvsim.engine.errors import ConfigError

from .source import ENGINES, EngineSource

RunOptions = Options


def descriptors() -> dict[str, Any]:
    from kvsim.app import catalog

    return dict(catalog.models().models)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ConfigError("engine", f"one of {', '.join(ENGINES)}", engine)


def targets(engine: str) -> list[ConformTarget]:
    """Every target of `engine`: the models' declarations, in catalog order."""
    _check_engine(engine)
    return [t for d in descriptors().values() for t in d.conform if t.engine == engine]


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


def run_target(target: ConformTarget, source: EngineSource, options: Options) -> TargetResult:
    """One target on one source, through the engine's runner."""
    from .run import run_targets

    return run_targets([target], source, descriptors(), options)[0]
