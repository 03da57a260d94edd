"""Saved counterexamples of `check` and `explore`, and replaying them to the same violation.

A counterexample file is one JSON document:

    {"kvsim_counterexample": 1, "command": "check" | "explore", "model": ..., "variant": ...,
     "params": {...only what the user set...}, "kvsim_version": ...,
     check:    "property", "seed", "max_examples", "counterexample": {"case" | "actions", "message", ...}
     explore:  "invariant", "kind": "invariant" | "hang", "trace": [action, ...], "message"}

`kvsim check --save FILE` and `kvsim explore --save FILE` write one; the
`--json` output of either command is accepted too (its first failure is
taken). Replaying an action path needs no Hypothesis: each saved action is
matched against the enabled actions of the rebuilt system by its JSON form,
so the path is checked to be a real path of the system, and the violation is
checked at its end (an invariant fails there; for a hang, no done state is
reachable from there). A data-property counterexample is replayed by running
the property again with the same seed and settings, which reproduces the same
shrunk case, and comparing it.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import __version__
from ..engine.canon import canonical_json, to_jsonable
from ..engine.descriptor import RunSpec
from ..engine.errors import ConfigError, TraceError
from ..engine.explore import explore
from ..engine.registry import Registry

FORMAT = 1


@dataclass
class CounterexampleReplay:
    path: str
    command: str
    model: str
    variant: str
    check: str  # the property or invariant
    matches: bool
    message: str  # the violation the re-run found (or why it did not)
    steps: int = 0  # actions replayed (0 for a data case)
    program: list[str] = field(default_factory=list)
    stopped_by: str | None = None  # "max-seconds" where the command's budget cut the re-run short

    def to_json(self) -> dict[str, Any]:
        return {"counterexample": self.path, "command": self.command, "model": self.model, "variant": self.variant,
                "check": self.check, "matches": self.matches, "message": self.message, "steps": self.steps,
                "program": self.program, "complete": self.stopped_by is None, "stopped_by": self.stopped_by}


def check_document(run: RunSpec, result: Any, seed: int | None, max_examples: int, backend: str | None) -> dict:
    return {"kvsim_counterexample": FORMAT, "command": "check", "model": run.model.name, "variant": run.variant.name,
            "params": to_jsonable(run.given), "kvsim_version": __version__, "property": result.property,
            "seed": seed, "max_examples": max_examples, "backend": backend,
            "counterexample": result.counterexample, "message": result.message}


def explore_document(run: RunSpec, violation: Any) -> dict:
    return {"kvsim_counterexample": FORMAT, "command": "explore", "model": run.model.name,
            "variant": run.variant.name, "params": to_jsonable(run.given), "kvsim_version": __version__,
            "invariant": violation.property, "kind": violation.kind, "trace": violation.trace,
            "message": violation.message}


def write(path: str, document: dict) -> None:
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(json.dumps(document, sort_keys=True, indent=1) + "\n")
    except OSError as exc:
        raise ConfigError("--save", "a writable file path", path, exc.strerror or "") from None


def sniff(path: str) -> dict | None:
    """The counterexample document in `path` (saved, or `--json` output of check/explore); None for a trace."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read the file: {exc.strerror}") from None
    stripped = head.lstrip()
    if not stripped.startswith(b"{"):
        return None
    try:
        doc = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None  # a JSON-lines trace (its header alone is one object per line) or a broken file
    if not isinstance(doc, dict):
        return None
    if "kvsim_counterexample" in doc:
        return doc
    if "results" in doc and "model" in doc:  # `kvsim check --json`
        results = doc["results"] if isinstance(doc["results"], list) else []
        failed = [r for r in results if isinstance(r, dict) and r.get("status") == "failed"]
        if not failed:
            raise TraceError(path, 1, "this `kvsim check --json` output has no failed property to replay")
        r = failed[0]
        return {"kvsim_counterexample": FORMAT, "command": "check", "model": doc["model"],
                "variant": doc.get("variant"), "params": doc.get("params", {}), "property": r.get("property"), "seed": doc.get("seed"),
                "max_examples": doc.get("max_examples", r.get("examples")), "backend": doc.get("backend"),
                "counterexample": r.get("counterexample"), "message": r.get("message", "")}
    if "violations" in doc and "model" in doc:  # `kvsim explore --json`
        violations = doc["violations"] if isinstance(doc["violations"], list) else []
        if not violations or not isinstance(violations[0], dict):
            raise TraceError(path, 1, "this `kvsim explore --json` output has no violation to replay")
        v = violations[0]
        return {"kvsim_counterexample": FORMAT, "command": "explore", "model": doc["model"],
                "variant": doc.get("variant"), "params": doc.get("params", {}), "invariant": v.get("property"), "kind": v.get("kind"),
                "trace": v.get("trace"), "message": v.get("message", "")}
    return None


def _bad(path: str, key: str, expected: str, got: Any) -> TraceError:
    """Bad input naming the key: `counterexample field 'KEY': expected ..., got ...` (exit 2)."""
    return TraceError(path, 1, f"counterexample field {key!r}: expected {expected}, got {_shown(got)}")


def _shown(value: Any) -> str:
    text = canonical_json(to_jsonable(value)) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _field(doc: dict, key: str, kind: type | tuple[type, ...], path: str, expected: str = "") -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise _bad(path, key, expected or f"{getattr(kind, '__name__', kind)}", value)
    return value


@dataclass
class Counterexample:
    """A counterexample file, checked against its format and against the model it names (`validated`)."""

    command: str  # "check" or "explore"
    run: RunSpec
    check: str  # the property (check) or the invariant (explore; a stateful property's failing invariant)
    kind: str  # "invariant", "hang", or "case" (a data property's shrunk input)
    prop: Any = None  # the property (check)
    trace: list = field(default_factory=list)  # the actions, as saved (their JSON form)
    initial: Any = None  # the initial state the path starts from: the system's own, where the file names one
    invariant: str = ""  # a stateful property's failing invariant
    case: Any = None  # a data property's case
    seed: int | None = None
    max_examples: int = 100
    backend: str | None = None


def validated(path: str, doc: dict, registry: Registry) -> Counterexample:
    """`doc` (from `sniff`) as a `Counterexample`, once every key of the format holds: the format version known,
    a model, variant and parameters the catalog has, for check a property with an integer seed, for a path
    every action one of the model's action records (its tag and arity), each argument of the JSON type the
    enabled actions of that kind have, the initial state one of the model's for those parameters, and the
    invariant one the model has. Bad input is a TraceError naming the key (exit 2): nothing is replayed."""
    version = doc.get("kvsim_counterexample")
    if type(version) is not int or version != FORMAT:
        raise _bad(path, "kvsim_counterexample", f"the format version {FORMAT}", version)
    command = doc.get("command")
    if command not in ("check", "explore"):
        raise _bad(path, "command", "check or explore", command)
    name = _field(doc, "model", str, path, "a model name")
    if name not in registry.models:
        raise _bad(path, "model", f"one of {', '.join(registry.models)}", name)
    model = registry.model(name)
    params = doc.get("params")
    if params is not None and not isinstance(params, dict):
        raise _bad(path, "params", "an object of parameter values", params)
    variant = _field(doc, "variant", str, path, "a variant name")
    try:
        model.variant(variant)
    except ConfigError as exc:
        raise _bad(path, "variant", exc.expected, variant) from None
    kinds = {spec.name: spec for spec in model.params}
    for key, value in (params or {}).items():  # JSON gives numbers as numbers: a string is not one
        if key in kinds and kinds[key].kind != "str" and isinstance(value, str):
            raise _bad(path, f"params.{key}", kinds[key].expected(), value)
    try:
        run = RunSpec.resolve(model, variant, params or {})
    except ConfigError as exc:
        raise TraceError(path, 1, f"counterexample field 'params': {exc}") from None
    if command == "explore":
        if model.system is None:
            raise _bad(path, "model", "a model with a transition system", name)
        kind = doc.get("kind", "invariant")
        if kind not in ("invariant", "hang"):
            raise _bad(path, "kind", "invariant or hang", kind)
        system = run.system()
        invariant = _field(doc, "invariant", str, path, "an invariant name")
        known = [i.name for i in system.invariants] if kind == "invariant" else [getattr(system, "liveness",
                                                                                         "liveness")]
        if invariant not in known:
            raise _bad(path, "invariant", f"one of {', '.join(known)}", invariant)
        trace = _actions(path, "trace", doc.get("trace"), system)
        return Counterexample("explore", run, invariant, kind, trace=trace, initial=_initial(path, None, system))
    try:
        prop = registry.property(model.name, _field(doc, "property", str, path, "a property name"))
    except ConfigError as exc:
        raise _bad(path, "property", exc.expected, doc.get("property")) from None
    seed = _field(doc, "seed", int, path, "an integer")
    max_examples = doc.get("max_examples")
    if type(max_examples) is not int or max_examples < 1:
        raise _bad(path, "max_examples", "an integer >= 1", max_examples)
    backend = doc.get("backend")
    if backend is not None if not prop.is_kernel else backend not in prop.backends:
        raise _bad(path, "backend", f"one of {', '.join(prop.backends)}" if prop.is_kernel else
                   "null (not a kernel property)", backend)
    found = doc.get("counterexample")
    if not isinstance(found, dict):
        raise _bad(path, "counterexample", "an object (the failing case or run)", found)
    loaded = Counterexample("check", run, prop.name, "case", prop=prop, seed=seed, max_examples=max_examples,
                            backend=backend)
    if prop.kind != "stateful":
        if "case" not in found:
            raise _bad(path, "counterexample", "an object with the failing case", found)
        loaded.case = found["case"]
        return loaded
    system = run.system()
    invariant = found.get("invariant")
    known = [i.name for i in system.invariants]
    if invariant not in known:
        raise _bad(path, "counterexample.invariant", f"one of {', '.join(known)}", invariant)
    loaded.kind, loaded.invariant = "invariant", invariant
    loaded.trace = _actions(path, "counterexample.actions", found.get("actions"), system)
    loaded.initial = _initial(path, found.get("initial"), system)
    return loaded


def action_types(system: Any) -> dict[str, type] | None:
    """The model's action records by tag (`ACTIONS` beside its system class, or in the package's `actions`
    module); None for a model that declares none."""
    module = sys.modules.get(type(system).__module__)
    table = getattr(module, "ACTIONS", None)
    if table is None and module is not None:
        try:
            table = getattr(importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".actions"), "ACTIONS", None)
        except ImportError:
            table = None
    return table


def _actions(path: str, key: str, value: Any, system: Any) -> list:
    """A saved path: a list of actions, each a list led by the tag of one of the model's action records with one
    argument for each of its fields."""
    if not isinstance(value, list):
        raise _bad(path, key, "a list of actions", value)
    types = action_types(system)
    for i, action in enumerate(value):
        if not isinstance(action, list) or not action or not isinstance(action[0], str):
            raise _bad(path, f"{key}[{i}]", "an action: a list led by its name", action)
        if types is not None:
            record = types.get(action[0])
            if record is None:
                raise _bad(path, f"{key}[{i}]", f"an action of the model ({', '.join(sorted(types))})", action)
            if len(action) != 1 + len(record.fields):
                raise _bad(path, f"{key}[{i}]", f"{action[0]} with its {len(record.fields)} arguments "
                                                f"({', '.join(record.fields)})", action)
    return value


def _initial(path: str, saved: Any, system: Any) -> Any:
    """The initial state a path starts from: the system's own state equal to the saved one (None where the file
    names none: each initial state is tried)."""
    if saved is None:
        return None
    state = next((s for s in system.initial_states() if canonical_json(s) == canonical_json(saved)), None)
    if state is None:
        raise _bad(path, "counterexample.initial", "the model's initial state for these parameters", saved)
    return state


def _kinds(value: Any) -> tuple[str, ...]:
    """The JSON type of each argument of an action (null matches any)."""
    def kind(v: Any) -> str:
        return "null" if v is None else "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) \
            else type(v).__name__
    return tuple(kind(v) for v in value[1:])


def _typed_like(saved: list, enabled: Sequence[Any]) -> bool:
    """Whether the saved action's arguments have the JSON types of some enabled action of its kind (True where no
    action of its kind is enabled: nothing to compare with)."""
    same = [_kinds(to_jsonable(a)) for a in enabled if to_jsonable(a)[:1] == saved[:1]]
    mine = _kinds(saved)
    return not same or any(all(a == b or "null" in (a, b) for a, b in zip(mine, theirs)) for theirs in same)


def replay(path: str, doc: dict, registry: Registry) -> CounterexampleReplay:
    """Re-run the counterexample `doc` (from `sniff`), once it is `validated`."""
    return replay_validated(path, validated(path, doc, registry))


def replay_validated(path: str, found: Counterexample) -> CounterexampleReplay:
    """Re-run a validated counterexample to its violation: a path step by step, a data case with its seed."""
    if found.command == "explore":
        return _replay_path(path, found, "trace")
    if found.kind == "invariant":
        return _replay_path(path, found, "counterexample.actions", command="check", name=found.prop.name)
    return _replay_case(path, found)


def _replay_case(path: str, found: Counterexample) -> CounterexampleReplay:
    from ..engine.runner import run_property  # Hypothesis: only for a data property's case

    run, prop = found.run, found.prop
    result = run_property(prop, run.variant, max_examples=found.max_examples, seed=found.seed,
                          params=dict(run.given) or None, backend=found.backend, descriptor=run.model)
    got = (result.counterexample or {}).get("case")
    matches = result.status == "failed" and canonical_json(found.case) == canonical_json(got)
    message = result.message if result.status == "failed" else "the property passed on the re-run"
    if result.status == "failed" and not matches:
        message = f"the re-run failed on another case: {canonical_json(got)[:300]}"
    return CounterexampleReplay(path, "check", run.model.name, run.variant.name, prop.name, matches, message)


class _From:
    """The system with one chosen initial state (to search onwards from a path's last state)."""

    def __init__(self, system: Any, state: Any) -> None:
        self.system, self.state = system, state
        self.name, self.variant, self.invariants = system.name, system.variant, system.invariants
        self.enabled, self.step, self.done = system.enabled, system.step, system.done
        self.liveness = getattr(system, "liveness", "liveness")

    def initial_states(self) -> tuple[Any, ...]:
        return (self.state,)


def match_path(system: Any, trace: Sequence[Any], initial: Any = None) -> tuple[Any, list[Any], str]:
    """`(initial state, the system's own actions, "")` for a path given as actions or their JSON form, each
    matched against the enabled actions by its canonical JSON (from `initial`, else from each initial state in
    turn); where no start admits the whole path, the actions matched from the last one and the step that is not
    enabled."""
    starts = list(system.initial_states())
    if initial is not None:
        starts = [s for s in starts if canonical_json(s) == canonical_json(initial)]
    start, taken, failure = None, [], "no initial state"
    for start in starts:
        state, taken, failure = start, [], ""
        for i, saved in enumerate(trace):
            key = canonical_json(saved)
            action = next((a for a in system.enabled(state) if canonical_json(a) == key), None)
            if action is None:
                failure = f"step {i + 1}: action {key[:200]} is not enabled there"
                break
            taken.append(action)
            state = system.step(state, action)
        if not failure:
            break
    return start, taken, failure


def _replay_path(path: str, found: Counterexample, key: str, command: str = "explore",
                 name: str | None = None) -> CounterexampleReplay:
    run, check = found.run, found.invariant or found.check
    system = run.system()
    state, taken, failure = match_path(system, found.trace, found.initial)
    if failure and len(taken) < len(found.trace):  # a step not enabled there: of the wrong types, it is bad input
        state_there = state
        for action in taken:
            state_there = system.step(state_there, action)
        saved = found.trace[len(taken)]
        if not _typed_like(saved, system.enabled(state_there)):
            raise _bad(path, f"{key}[{len(taken)}]", f"a {saved[0]} action with arguments of the types the model's "
                                                     f"{saved[0]} actions have", saved)
    for action in taken:
        state = system.step(state, action)
    program = ["state = initial_state()"] + [f"state = step(state, {a!r})" for a in taken]
    result = CounterexampleReplay(path, command, run.model.name, run.variant.name, name or check, False, failure,
                                  len(taken), program)
    if failure:
        return result
    if found.kind == "hang":
        searched = explore(_From(system, state))
        hang = next((v for v in searched.violations if v.kind == "hang"), None)
        complete = searched.bound_hit is None
        result.matches = hang is not None and hang.trace == [] and complete
        result.message = (f"{check}: no done state is reachable from the path's last state ({searched.states} "
                          "states searched)" if result.matches else "a done state is reachable from the path's "
                                                                     "last state")
        return result
    inv = next(i for i in system.invariants if i.name == check)  # `validated` checked the name
    message = inv.check(state)
    result.matches = message is not None
    result.message = f"{check}: {message}" if message is not None else f"{check} holds at the path's last state"
    result.program.append(f"check(state)  # {check} {'fails' if result.matches else 'holds'} here")
    return result
