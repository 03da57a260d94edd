"""What a conform target is, as data: declared in the model package, next to the model it checks.

    CONFORM = (
        ConformTarget(
            "vllm", "plan_mla_context_chunks",
            upstream=(Upstream("vllm/model_executor/layers/attention/mla_attention.py",
                               ("plan_mla_context_chunks",)),),
            adapter="kvsim.conform.vllm.planner:PLANNER",
            doc="..."),
    )
    DESCRIPTOR = ModelDescriptor(..., conform=CONFORM)

Nothing here imports the adapter or Hypothesis: `kvsim list`, `--changed` selection and `--json`'s list of
upstream files read the declarations alone.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Upstream:
    """One upstream file and the top-level definitions a target loads from it.

    `checked`: the definitions the target checks ("fn", "Class" or "Class.method"), whose lines its coverage
    counts and its mutants change; None means every name in `names`, () none (a file loaded only to drive the
    checked one). Helpers the loader brings along transitively are run, not counted. `optional`: a file only some
    releases have (a package a later release split out; it loads no `names`): a release without it still runs the
    target, with nothing of that file counted or mutated.
    """

    file: str
    names: tuple[str, ...]
    checked: tuple[str, ...] | None = None
    optional: bool = False

    def __post_init__(self) -> None:
        if self.optional and self.names:
            raise ValueError(f"upstream {self.file}: an optional file loads no names, got {self.names}")

    @property
    def checked_names(self) -> tuple[str, ...]:
        return self.names if self.checked is None else self.checked


@dataclass(frozen=True)
class Survivor:
    """A mutant a target is known not to kill, and why (an equivalent mutant, or a path no input reaches).

    Matched by definition, operator and the changed source text (`original`; not line numbers, which move between
    releases), and, when given, narrower: `replacement`, the mutant's new text (`1` -> `0` but not `1` -> `2`), and
    `line`, a piece of the text of the source line the mutant is on, or of the first line of a statement around it
    (as `Unreached.text` names a statement: an `if`'s test and its own body, not its `else`), so that two lines of
    the same text are told apart by the statement each sits in. Empty: any. A definition that is a whole class
    holds many mutants of one operator and text; naming the replacement and the line keeps one declaration from
    covering a sibling that is a real gap."""

    definition: str
    operator: str
    original: str
    reason: str
    replacement: str = ""
    line: str = ""

    def covers(self, mutant: Any, text: str = "") -> bool:
        """Whether this declaration names `mutant` (a `mutants.Mutant`); `text`: the upstream file's text, which
        `line` is matched in (a declaration with a `line` covers nothing without it)."""
        if (self.definition, self.operator, self.original) != (mutant.definition, mutant.operator, mutant.original):
            return False
        if self.replacement and self.replacement != mutant.replacement:
            return False
        return not self.line or mutant.line in self.lines(text, mutant.line)

    def lines(self, text: str, line: int) -> set[int]:
        """The source lines `line` names in `text` (`line` itself when it holds the piece): the lines inside each
        statement of the definition whose first line holds it."""
        source = text.splitlines()
        own = {line} if 0 < line <= len(source) and self.line in source[line - 1] else set()
        if not text:
            return own
        from .linetrace import documented_lines  # ast work, only when a mutation run matches

        found = documented_lines(text, [Unreached(self.definition, self.line, self.reason)], every_line=True)
        return own | found.get(self.definition, set())


@dataclass(frozen=True)
class Unreached:
    """Statements of a checked definition that no input of the target runs, and why: a branch of another platform
    (ROCm's `is_hip`), or code the model has no counterpart of (the target's doc names it). Matched by definition (a
    checked one, or a method of a checked class) and a piece of the text of the statement's first line (line
    numbers move between releases); the statement and everything inside it (an `if`: its test and its own body,
    not its `else`) are left out of the coverage's count, listed apart (`coverage.documented`), and get no
    mutants (`kvsim conform --mutants`)."""

    definition: str
    text: str
    reason: str


@dataclass(frozen=True)
class ConformTarget:
    """A conform target: `engine`'s definitions in `upstream`, driven by `adapter`, against `model`.

    `releases`: ((first release, variant name), ...) in release order: the model variant each release follows
    (a source with no version, a working tree, follows the last); empty: every release follows `fixed`.
    """

    engine: str
    name: str
    upstream: tuple[Upstream, ...]
    adapter: str  # "module:attribute", imported only when the target runs
    doc: str
    releases: tuple[tuple[str | None, str], ...] = ()
    survivors: tuple[Survivor, ...] = ()
    unreached: tuple[Unreached, ...] = ()
    model: str = ""  # set by the model's descriptor

    def __post_init__(self) -> None:
        if ":" not in self.adapter:
            raise ValueError(f"conform target {self.name}: adapter {self.adapter!r} is not 'module:attribute'")
        if not self.upstream:
            raise ValueError(f"conform target {self.name}: no upstream file")

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(u.file for u in self.upstream))

    @property
    def key(self) -> str:
        return f"{self.engine}:{self.name}"

    def resolve_adapter(self) -> Any:
        """The adapter object; ConfigError naming the target when it is not there (never a silent skip)."""
        module_name, _, attribute = self.adapter.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise ConfigError(f"conform target {self.key}.adapter", "an importable adapter module",
                                  module_name) from exc
            raise
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise ConfigError(f"conform target {self.key}.adapter", f"a name defined in {module_name}",
                              attribute) from None

    def variant_name(self, version: str | None) -> str:
        """The model variant `version` follows (`releases`); no version (a tree): the newest."""
        return variant_for(self.releases, version)


def variant_for(releases: tuple[tuple[str | None, str], ...], version: str | None) -> str:
    """The variant name of `version` in a ((first release, variant), ...) table; no version: the last."""
    if not releases:
        return "fixed"
    if not version:
        return releases[-1][1]
    nums = release_tuple(version)
    chosen = releases[0][1]
    for since, name in releases:
        if since is None or (nums is not None and nums >= release_tuple(since)):  # type: ignore[operator]
            chosen = name
    return chosen


def release_tuple(version: str | None) -> tuple[int, ...] | None:
    """(0, 5, 23) for "0.5.23" or "0.5.23.post1"; None for no version."""
    if not version:
        return None
    nums = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    return nums or None


def with_model(targets: tuple[ConformTarget, ...], model: str) -> tuple[ConformTarget, ...]:
    from dataclasses import replace

    return tuple(t if t.model == model else replace(t, model=model) for t in targets)

