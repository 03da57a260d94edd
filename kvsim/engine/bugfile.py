"""A model's bug reports as data: `properties/<model>/bugs.toml`, read with `tomllib` and checked on load.

The file holds the model's name and one `[[bug]]` table per report, in catalog order; its keys are the
`BugReport` fields (`model` optional: the file's model unless a report names another model of the same package,
as kv-cache-manager's second system kv-cache-manager-pd), the prose (summary, note, affected, consequence, fix)
as TOML multi-line strings, `upstream_files` and `verdicts` as arrays of tables with the `UpstreamSite` and
`Verdict` fields:

    model = "swa-budget"

    [[bug]]
    id = "sglang-af7c62e-swa-resume-budget"
    variant = "pre_af7c62e"
    property = "resumed_requests_fit_physical_pages"
    source = "..."
    summary = \"\"\"...\"\"\"

    [[bug.verdicts]]
    release = "0.5.23"
    state = "fixed"

What is code stays code and is named here: `property` (a registered property), `invariant` (an invariant
or the liveness goal of the model's system), `variant` and `fix_variant` (variants of the model), `mechanism`
(a failure mechanism the model's simulation names, `ModelDescriptor.mechanisms`). Every
name is resolved when the file is loaded. Anything wrong (a missing key, a wrong type, an unknown key, a
duplicate id, a name that does not resolve) is one `BugFileError` line naming the file, the key and the
problem.
"""

from __future__ import annotations

import os
import tomllib
from typing import Any, Callable

from .errors import ConfigError, KvsimError
from .registry import BugReport, Registry, UpstreamSite, Verdict

# key: (the TOML type, required); `params` values are scalars
_BUG_KEYS: dict[str, tuple[type, bool]] = {
    "id": (str, True), "variant": (str, True), "source": (str, True), "summary": (str, True),
    "property": (str, False), "invariant": (str, False), "status": (str, False), "max_examples": (int, False),
    "params": (dict, False), "note": (str, False), "affected": (str, False), "upstream_files": (list, False),
    "harm": (str, False), "consequence": (str, False), "fix": (str, False), "fix_variant": (str, False),
    "verdicts": (list, False), "model": (str, False), "mechanism": (str, False),
}
_SITE_KEYS: dict[str, tuple[type, bool]] = {"path": (str, True), "functions": (list, True), "role": (str, False)}
_VERDICT_KEYS: dict[str, tuple[type, bool]] = {
    "release": (str, True), "state": (str, True), "reason": (str, False), "fixed_in": (str, False)}
_TYPE_NAMES = {str: "a string", int: "an integer", dict: "a table", list: "an array"}
_PARAM_TYPES = (str, int, bool)


class BugFileError(ConfigError):
    """A bugs.toml that cannot be loaded: `FILE: KEY: problem` on one line."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        self.path, self.key, self.problem = path, key, problem
        self.field, self.expected, self.received = f"{path}: {key}" if key else path, problem, None
        KvsimError.__init__(self, f"{self.field}: {problem}")


def load_bugs(registry: Registry, path: str) -> list[BugReport]:
    """Read `path`, check it against the schema, and add its reports to `registry` in file order.

    The model's properties must be registered first: a report's `property` is resolved against them.
    """
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise BugFileError(path, "", f"cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise BugFileError(path, "", f"not valid TOML ({exc})") from None
    table = _table(path, "", doc, {"model": (str, True), "bug": (list, True)})
    model = table["model"]
    _resolved(path, "model", lambda: registry.model(model))
    bugs = [_bug(path, f"bug[{i}]", model, entry) for i, entry in enumerate(table["bug"])]
    first: dict[str, int] = {}
    for i, bug in enumerate(bugs):
        if bug.id in first:
            raise BugFileError(path, f"bug[{i}].id", f"duplicate id {bug.id!r} (bug[{first[bug.id]}] has it)")
        first[bug.id] = i
    for i, bug in enumerate(bugs):
        at = f"bug[{i}]"
        _resolved(path, f"{at}.model", lambda: registry.model(bug.model))
        _resolved(path, f"{at}.variant", lambda: registry.model(bug.model).variant(bug.variant))
        if bug.fix_variant is not None:
            _resolved(path, f"{at}.fix_variant", lambda: registry.model(bug.model).variant(bug.fix_variant))
        if bug.mechanism is not None and bug.mechanism not in registry.model(bug.model).mechanisms:
            known = ", ".join(registry.model(bug.model).mechanisms) or "none"
            raise BugFileError(path, f"{at}.mechanism", f"expected a mechanism model {bug.model}'s simulation "
                                                       f"names ({known}), got {bug.mechanism!r}")
        try:
            registry.add_bug(bug)
        except ConfigError as exc:
            raise BugFileError(path, f"{at}.{_key_of(exc.field)}", _problem(exc)) from None
    return bugs


def bug_file(package_file: str) -> str:
    """The bugs.toml beside a properties package's `__init__.py` (pass its `__file__`)."""
    return os.path.join(os.path.dirname(package_file), "bugs.toml")


def _bug(path: str, where: str, model: str, entry: Any) -> BugReport:
    table = _table(path, where, entry, _BUG_KEYS)
    for name, value in table.get("params", {}).items():
        if not isinstance(value, _PARAM_TYPES):
            raise BugFileError(path, f"{where}.params.{name}", f"expected a string, an integer or a boolean, "
                                                             f"got {value!r}")
    sites = tuple(_site(path, f"{where}.upstream_files[{j}]", s) for j, s in enumerate(table.pop("upstream_files", [])))
    verdicts = tuple(_verdict(path, f"{where}.verdicts[{j}]", v) for j, v in enumerate(table.pop("verdicts", [])))
    model = table.pop("model", model)
    try:
        return BugReport(model=model, upstream_files=sites, verdicts=verdicts, **table)
    except ConfigError as exc:  # status, harm, or not exactly one of property and invariant
        name = next((k for k in ("status", "harm") if exc.field.endswith("." + k)), "property")
        raise BugFileError(path, f"{where}.{name}", _problem(exc)) from None


def _site(path: str, where: str, entry: Any) -> UpstreamSite:
    table = _table(path, where, entry, _SITE_KEYS)
    for j, name in enumerate(table["functions"]):
        if not isinstance(name, str):
            raise BugFileError(path, f"{where}.functions[{j}]", f"expected a string, got {name!r}")
    return UpstreamSite(table["path"], tuple(table["functions"]), table.get("role", ""))


def _verdict(path: str, where: str, entry: Any) -> Verdict:
    table = _table(path, where, entry, _VERDICT_KEYS)
    return _resolved(path, f"{where}.state", lambda: Verdict(**table))


def _table(path: str, where: str, entry: Any, keys: dict[str, tuple[type, bool]]) -> dict[str, Any]:
    """`entry` checked against `keys` (name: (type, required)): no unknown key, no missing one, each of its type."""
    at = f"{where}." if where else ""
    if not isinstance(entry, dict):
        raise BugFileError(path, where, f"expected a table, got {entry!r}")
    for name in entry:
        if name not in keys:
            raise BugFileError(path, f"{at}{name}", f"unknown key (expected one of {', '.join(keys)})")
    for name, (kind, required) in keys.items():
        if name not in entry:
            if required:
                raise BugFileError(path, f"{at}{name}", f"missing ({_TYPE_NAMES[kind]} is required)")
        elif isinstance(entry[name], bool) and kind is int or not isinstance(entry[name], kind):
            raise BugFileError(path, f"{at}{name}", f"expected {_TYPE_NAMES[kind]}, got {entry[name]!r}")
    return dict(entry)


def _resolved(path: str, key: str, resolve: Callable[[], Any]) -> Any:
    try:
        return resolve()
    except ConfigError as exc:
        raise BugFileError(path, key, _problem(exc)) from None


def _key_of(field: str) -> str:
    """The report's key that a `Registry.add_bug` error (its field) is about."""
    if field == "bug id":
        return "id"
    if field.endswith(".property"):
        return "property"
    if field == "MODEL" or field.endswith(".invariant"):  # MODEL: the model has no transition system
        return "invariant"
    return "params"  # the system refused the report's params


def _problem(exc: ConfigError) -> str:
    return f"expected {exc.expected}, got {exc.received!r}"
